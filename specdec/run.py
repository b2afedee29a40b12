"""Runs the paper's configurations without T5X: `python -m specdec.run --gin_file=...`.

    python -m specdec.run --gin_file=configs/runs/wmt_ende_t0_small.gin \
        --gin.OUTPUT_DIR="'/tmp/wmt_t0_small'" \
        --gin.TARGET_CHECKPOINT_PATH="'/ckpt/t5_1_1_xxl/checkpoint_1000000'" \
        --gin.DRAFT_CHECKPOINT_PATH="'/ckpt/t5_1_1_small/checkpoint_1000000'"

The run files of `configs/runs` are the ones `t5x/infer.py` takes (with `infer.gin`);
here `specdec_run.gin` binds their macros to `evaluate`, which loads both T5X
checkpoints with `specdec.io.load_t5x` (local paths only: nothing is
downloaded), reads the task's shipped examples with `specdec.data`, decodes every
example with `specdec.speculative_sample` (and, with `baseline`, with the target
alone), and writes to `output_dir`:

* `predictions.jsonl`: one line per example, its text, prediction and statistics;
* `metrics.json`: the task's metric (BLEU or ROUGE), the paper's alpha estimate,
  tokens per iteration against Equation 1, and wall times and speedup;
* `config.gin`: the operative gin configuration.

Wall times exclude compilation: the first batch is decoded once before timing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import json
import os
import pathlib
import sys
import time
from typing import Any

import jax
import numpy as np

from specdec import _optional, data, metrics as metrics_lib, theory
from specdec.distributions import SamplingConfig
from specdec.io import load_t5x
from specdec.models import t5
from specdec.sample import autoregressive_sample, speculative_sample
from specdec.t5x import config_of, gin_search_path

PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.gin"
# The macros `configs/runs/specdec_run.gin` binds to `evaluate`.
RUN_MACROS = (
  "TASK",
  "TASK_FEATURE_LENGTHS",
  "BATCH_SIZE",
  "TARGET_MODULE",
  "DRAFT_MODULE",
  "TARGET_CHECKPOINT_PATH",
  "DRAFT_CHECKPOINT_PATH",
  "GAMMA",
  "TEMPERATURE",
  "OUTPUT_DIR",
)
USAGE = (
  "usage: python -m specdec.run --gin_file=FILE [--gin_file=FILE ...] "
  "[--gin.NAME=VALUE ...] [--gin_bindings=BINDING ...] "
  "[--gin_search_paths=DIR,DIR]"
)


# ------------------------------------------------------------------------------
# Arguments.
# ------------------------------------------------------------------------------
def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
  return value


def _feature_lengths(value: Any) -> tuple[int, int]:
  """{'inputs': S, 'targets': L} -> (S, L)."""
  if not isinstance(value, Mapping) or set(value) != {"inputs", "targets"}:
    raise ValueError(
      f"task_feature_lengths must be {{'inputs': int, 'targets': int}}, got {value!r}"
    )
  return (
    _positive_int("task_feature_lengths['inputs']", value["inputs"], 2),
    _positive_int("task_feature_lengths['targets']", value["targets"]),
  )


def _local_checkpoint(name: str, path: Any) -> str:
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
    raise ValueError(f"{name} must be a checkpoint path, got {path!r}")
  path = os.fspath(path)
  if "://" in path:
    raise ValueError(
      f"{name}: {path} is not a local path; specdec.run reads local "
      "checkpoints only (copy it first, e.g. with gsutil -m cp -r)"
    )
  if not os.path.exists(path):
    raise FileNotFoundError(f"{name}: no such file or directory: {path}")
  return path


def _load_model(name: str, module: Any, path: str) -> t5.T5:
  config = config_of(module, f"{name}_module")
  params = load_t5x(path, config, dtype=config.dtype)
  return t5.T5(config, jax.device_put(params))


# ------------------------------------------------------------------------------
# Decoding and statistics.
# ------------------------------------------------------------------------------
def _timed(fn, *args, **kwargs):
  """(fn's output with its arrays ready, seconds it took)."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args, **kwargs))
  return out, time.perf_counter() - start


def example_records(
  examples: Sequence[Mapping[str, str]],
  predictions: Sequence[str],
  stats: Mapping[str, np.ndarray],
  times: np.ndarray,
  baseline: Mapping[str, Any] | None = None,
) -> list[dict]:
  """One JSON-ready record per example.

  Args:
    examples: {'inputs', 'targets', ...} per example.
    predictions: decoded text per example.
    stats: per-example arrays [N]: 'length', 'iterations', 'drafted', 'accepted',
      'beta_sum', 'beta_count'.
    times: float[N], wall seconds of the batch each example was decoded in.
    baseline: optional {'predictions': [N] text, 'tokens_equal': bool[N], 'times':
      float[N]} of the target-only decode.
  """
  records = []
  for i, (example, prediction) in enumerate(zip(examples, predictions)):
    iterations = int(stats["iterations"][i])
    record = {
      "index": i,
      "inputs": example["inputs"],
      "targets": example["targets"],
      "prediction": prediction,
      "length": int(stats["length"][i]),
      "iterations": iterations,
      "drafted": int(stats["drafted"][i]),
      "accepted": int(stats["accepted"][i]),
      "alpha_hat": float(stats["beta_sum"][i] / max(int(stats["beta_count"][i]), 1)),
      "tokens_per_iteration": float((stats["accepted"][i] + iterations) / max(iterations, 1)),
      "time_s": float(times[i]),
    }
    if baseline is not None:
      record.update(
        baseline_prediction=baseline["predictions"][i],
        baseline_tokens_equal=bool(baseline["tokens_equal"][i]),
        baseline_time_s=float(baseline["times"][i]),
      )
    records.append(record)
  return records


def summarize(
  records: Sequence[Mapping[str, Any]],
  stats: Mapping[str, np.ndarray],
  metric: str,
  gamma: int,
  sampling: SamplingConfig,
  batch_times: Sequence[float],
  baseline_batch_times: Sequence[float] | None,
) -> dict[str, Any]:
  """The metrics JSON of a run: the task's scores ('bleu', or 'rouge1', 'rouge2',
  'rougeLsum'), the speculative statistics, and wall times.

  alpha_hat pools beta over every decoded position of every example (the paper's
  estimate of alpha, E[beta]); tokens_per_iteration pools likewise and is compared
  with Equation 1 at that alpha.
  """
  targets = [r["targets"] for r in records]
  predictions = [r["prediction"] for r in records]
  score = metrics_lib.metric_fn(metric)
  alpha = float(np.sum(stats["beta_sum"]) / max(int(np.sum(stats["beta_count"])), 1))
  iterations = int(np.sum(stats["iterations"]))
  result: dict[str, Any] = {
    "num_examples": len(records),
    "gamma": gamma,
    "temperature": sampling.temperature,
    "top_k": sampling.top_k,
    "top_p": sampling.top_p,
    **score(targets, predictions),
    "alpha_hat": alpha,
    "tokens_per_iteration": float((np.sum(stats["accepted"]) + iterations) / max(iterations, 1)),
    "expected_tokens_per_iteration": float(theory.expected_tokens(alpha, gamma)),
    "target_calls": iterations,
    "tokens": int(np.sum(stats["length"])),
    "time_s": float(np.sum(batch_times)),
  }
  if baseline_batch_times is not None:
    baseline_time = float(np.sum(baseline_batch_times))
    result.update(
      baseline={
        **score(targets, [r["baseline_prediction"] for r in records]),
        "time_s": baseline_time,
      },
      speedup=baseline_time / result["time_s"],
      tokens_equal_to_baseline=float(np.mean([r["baseline_tokens_equal"] for r in records])),
    )
  return result


def evaluate(
  *,
  task: str,
  task_feature_lengths: Mapping[str, int],
  batch_size: int,
  target_module: Any,
  draft_module: Any,
  target_checkpoint_path: str,
  draft_checkpoint_path: str,
  gamma: int,
  sampling: SamplingConfig,
  output_dir: str,
  seed: int = 0,
  baseline: bool = True,
  max_examples: int | None = None,
) -> dict[str, Any]:
  """Decodes a task with a target/draft pair and writes predictions and metrics.

  Args:
    task: a `specdec.data.TASKS` name.
    task_feature_lengths: {'inputs': S, 'targets': L}: inputs are cut to S tokens (EOS
      included) and decodes have at most L tokens.
    batch_size: examples per decode call (the paper: 1). The last batch is filled
      with copies of its last example, whose outputs are dropped.
    target_module, draft_module: the networks (specdec's or T5X's T5 Transformer).
    target_checkpoint_path, draft_checkpoint_path: local T5X checkpoints.
    gamma: draft tokens per iteration.
    sampling: applied to both models.
    output_dir: where the three files go (created).
    seed: batch i decodes with `fold_in(PRNGKey(seed), i)`.
    baseline: also decode with the target alone (same keys), for the speedup and,
      at temperature 0, the token-for-token check.
    max_examples: decode only the first examples (None: all).

  Returns:
    The metrics written to metrics.json.
  """
  spec = data.task_spec(task)
  input_length, max_new_tokens = _feature_lengths(task_feature_lengths)
  _positive_int("batch_size", batch_size)
  _positive_int("gamma", gamma)
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(f"sampling must be a specdec.SamplingConfig, got {type(sampling).__name__}")
  if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
    raise ValueError(f"output_dir must be a directory path, got {output_dir!r}")
  if max_examples is not None:
    _positive_int("max_examples", max_examples)
  target = _load_model(
    "target", target_module, _local_checkpoint("target_checkpoint_path", target_checkpoint_path)
  )
  draft = _load_model(
    "draft", draft_module, _local_checkpoint("draft_checkpoint_path", draft_checkpoint_path)
  )
  if target.vocab_size != draft.vocab_size:
    raise ValueError(
      f"draft_module: vocab_size {draft.vocab_size} differs from the target's {target.vocab_size}"
    )

  examples = data.load_examples(task)[:max_examples]
  vocab = data.Vocabulary()
  encoded = np.stack([vocab.encode_padded(e["inputs"], input_length) for e in examples])
  decode_kwargs: dict[str, Any] = dict(
    max_new_tokens=max_new_tokens, sampling=sampling, eos_id=data.EOS_ID
  )
  stat_keys = ("length", "iterations", "drafted", "accepted", "beta_sum", "beta_count")
  stat_rows: dict[str, list[np.ndarray]] = {k: [] for k in stat_keys}
  token_rows: list[np.ndarray] = []
  base_token_rows: list[np.ndarray] = []
  times: list[float] = []
  batch_times: list[float] = []
  base_times: list[float] = []
  base_batch_times: list[float] = []
  for i, start in enumerate(range(0, len(examples), batch_size)):
    rows = encoded[start : start + batch_size]
    real = len(rows)
    rows = np.concatenate([rows, np.repeat(rows[-1:], batch_size - real, axis=0)])
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), i)
    if i == 0:  # compile outside the timed calls
      jax.block_until_ready(
        speculative_sample(
          target,
          draft,
          rows,  # type: ignore[arg-type]  # numpy, which jit takes (as in the timed call)
          rng,
          gamma=gamma,
          **decode_kwargs,
        )
      )
      if baseline:
        jax.block_until_ready(
          autoregressive_sample(
            target,
            rows,  # type: ignore[arg-type]  # numpy, which jit takes (as in the timed call)
            rng,
            **decode_kwargs,
          )
        )
    out, seconds = _timed(
      speculative_sample, target, draft, rows, rng, gamma=gamma, **decode_kwargs
    )
    token_rows.append(np.asarray(out.tokens)[:real])
    batch_times.append(seconds)
    times += [seconds] * real
    for key, value in (
      ("length", out.lengths),
      ("iterations", out.stats.iterations),
      ("drafted", out.stats.drafted),
      ("accepted", out.stats.accepted),
      ("beta_sum", out.stats.beta_sum),
      ("beta_count", out.stats.beta_count),
    ):
      stat_rows[key].append(np.asarray(value)[:real])
    if baseline:
      base, seconds = _timed(autoregressive_sample, target, rows, rng, **decode_kwargs)
      base_token_rows.append(np.asarray(base.tokens)[:real])
      base_batch_times.append(seconds)
      base_times += [seconds] * real

  tokens = np.concatenate(token_rows)
  stats = {k: np.concatenate(v) for k, v in stat_rows.items()}
  predictions = [vocab.decode(row) for row in tokens]
  baseline_info = None
  if baseline:
    base_tokens = np.concatenate(base_token_rows)
    baseline_info = {
      "predictions": [vocab.decode(row) for row in base_tokens],
      "tokens_equal": np.all(base_tokens == tokens, axis=1),
      "times": np.asarray(base_times),
    }
  records = example_records(examples, predictions, stats, np.asarray(times), baseline_info)
  result = summarize(
    records,
    stats,
    spec.metric,
    gamma,
    sampling,
    batch_times,
    base_batch_times if baseline else None,
  )
  result.update(
    task=task,
    target_checkpoint_path=os.fspath(target_checkpoint_path),
    draft_checkpoint_path=os.fspath(draft_checkpoint_path),
    batch_size=batch_size,
    seed=seed,
  )
  write_outputs(output_dir, records, result)
  return result


def write_outputs(
  output_dir: str | os.PathLike, records: Sequence[Mapping[str, Any]], result: Mapping[str, Any]
) -> None:
  """predictions.jsonl, metrics.json and (when gin is configured) config.gin."""
  output_dir = pathlib.Path(output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  with open(output_dir / PREDICTIONS_FILE, "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + "\n")
  with open(output_dir / METRICS_FILE, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2, ensure_ascii=False)
  if "gin" in sys.modules:
    gin = _optional.require("gin", "t5x")
    (output_dir / CONFIG_FILE).write_text(gin.operative_config_str(), encoding="utf-8")


# ------------------------------------------------------------------------------
# Command line.
# ------------------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
  """Command-line arguments -> (gin files, gin bindings, search paths).

  `--gin.NAME=VALUE` is the binding `NAME = VALUE` (T5X's shorthand); `--gin_file`,
  `--gin_bindings` and `--gin_search_paths` (comma-separated) are T5X's flags, each
  as `--flag=value` or `--flag value`. The search paths end with '.' and the installed
  package's (`specdec.t5x.gin_search_path()`), so that `--gin_file=configs/runs/...`
  and `include 'configs/...'` resolve from any directory.
  """
  files, bindings, paths = [], [], []
  args = list(argv)
  while args:
    arg = args.pop(0)
    if arg.startswith("--gin."):
      name, sep, value = arg[len("--gin.") :].partition("=")
      if not sep or not name:
        raise ValueError(f"{arg}: expected --gin.NAME=VALUE\n{USAGE}")
      bindings.append(f"{name} = {value}")
      continue
    flag, sep, value = arg.partition("=")
    if flag not in ("--gin_file", "--gin_bindings", "--gin_search_paths"):
      raise ValueError(f"unknown argument {arg!r}\n{USAGE}")
    if not sep:
      if not args:
        raise ValueError(f"{flag} needs a value\n{USAGE}")
      value = args.pop(0)
    if flag == "--gin_file":
      files.append(value)
    elif flag == "--gin_bindings":
      bindings.append(value)
    else:
      paths += [p for p in value.split(",") if p]
  if not files:
    raise ValueError(f"no --gin_file given\n{USAGE}")
  return files, bindings, paths + [".", gin_search_path()]


def _check_macros(names: Sequence[str]) -> None:
  """Raises ValueError naming the first macro that is undefined or %gin.REQUIRED."""
  gin = _optional.require("gin", "t5x", purpose="specdec.run")
  for name in names:
    try:
      value = gin.query_parameter(f"%{name}")
    except ValueError as e:
      raise ValueError(
        f"gin macro {name} is not defined: give a run file of configs/runs or --gin.{name}=..."
      ) from e
    # A macro set to another macro or to a constant (gin.REQUIRED) is a reference;
    # follow it to the value. Configurable references (@x()) are left unbuilt.
    while isinstance(value, gin.config.ConfigurableReference) and value.selector in (
      "gin.macro",
      "gin.constant",
    ):
      value = value.scoped_configurable_fn()
    if value is gin.REQUIRED:
      raise ValueError(f"gin macro {name} is unset: pass --gin.{name}=...")


def __getattr__(name: str) -> Any:
  # PEP 562: `REPO_ROOT`, the old name of the directory `configs/` resolves under
  # (scripts add it to gin's search path), now the installed package's.
  if name == "REPO_ROOT":
    return pathlib.Path(gin_search_path())
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Sequence[str]) -> dict[str, Any]:
  gin = _optional.require("gin", "t5x", purpose="specdec.run")
  files, bindings, paths = parse_args(argv)
  for path in paths:
    gin.add_config_file_search_path(path)
  gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
  _check_macros(RUN_MACROS)
  # The run files bind `specdec.run.evaluate` by dynamic registration, which leaves
  # the function itself alone: its bindings apply to gin's wrapper of it. (Under
  # `python -m` this file is __main__; the wrapper is of the module specdec.run.)
  return gin.get_configurable("specdec.run.evaluate")()


if __name__ == "__main__":
  try:
    print(json.dumps(main(sys.argv[1:]), indent=2))
  except (ValueError, TypeError, FileNotFoundError, ImportError) as error:
    print(f"specdec.run: {error}", file=sys.stderr)
    sys.exit(2)
