"""The paper's Tables 2, 3 and 4 for any pair, task and hardware, measured in one run.

    python scripts/benchmark.py                                  # shipped pair, Multi30k
    python scripts/benchmark.py --task=wmt_ende --examples=32 --gammas=1,2,3,4
    python scripts/benchmark.py --gin_file=configs/runs/wmt_ende_t0_small.gin \\
        --gin_bindings="TARGET_CHECKPOINT_PATH='/ckpt/xxl'" \\
        --gin_bindings="DRAFT_CHECKPOINT_PATH='/ckpt/small'"
    python scripts/benchmark.py --shapes_only                    # random-weight shapes

For a task (multi30k, wmt_ende, cnndm), a target and its drafts (the pair's draft plus
the unigram and bigram drafts of Table 3), temperatures and gammas, on the same
inputs (Leviathan, Kalman & Matias, ICML 2023):

* alpha the paper's way (Section 3.1): the mean of beta = sum_x min(p(x), q(x)) along
  the target's own outputs (its batched baseline decode of `--alpha_examples`,
  teacher-forced through both models), with the histogram of per-token beta; and,
  per timed setting, alpha along the speculative decode and from accept counts;
* tokens per iteration against Equation 1;
* t_p1, t_p(gamma+1), t_q and c, v (`specdec.benchmarking.step_costs`, medians of
  compiled calls, warm-up excluded);
* baseline and speculative ms per token at batch 1, the measured speed-up, the
  speed-up of Theorem 3.8 (v = 1, the paper's premise) and of the refined model
  (measured v), measured / predicted, and Theorem 3.11's arithmetic-operations factor
  from the models' per-token multiply-adds;
* the task metric (BLEU / ROUGE) of both decodes, and at temperature 0 whether the
  speculative output equals the baseline's token for token (it must).

Inputs are padded to a few length buckets (powers of two), so a whole test set
compiles a handful of times; the JSON records the compile count. Writes
`benchmark.json`, `benchmark.md` (the tables of `specdec.tables`),
`speedup_vs_gamma.png` (measured and predicted curves, as in Figure 3) and
`beta_hist.png` under --out_dir. `--shapes_only` instead times random-weight T5
shapes and derives speed-up(alpha) for Table 2's alphas (`shapes_only` below).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from specdec import benchmarking, checkpoints, data, pretrained, tables, theory
from specdec import metrics as metrics_lib
from specdec.distributions import SamplingConfig
from specdec.models import ngram, t5
from specdec.sample import autoregressive_sample

TASKS = {
    # name: (input length, max new tokens, metric, references' language data)
    "multi30k": (48, 48, "bleu"),
    "wmt_ende": (128, 128, "bleu"),
    "cnndm": (512, 256, "rouge"),
}
# The task names of the gin run files (configs/runs) -> benchmark tasks.
GIN_TASKS = {data.WMT_TASK: "wmt_ende", data.CNNDM_TASK: "cnndm"}
NGRAM_DRAFTS = ("unigram", "bigram")

_TASK = flags.DEFINE_enum("task", "multi30k", list(TASKS), "Task to measure.")
_PAIR = flags.DEFINE_string("pair", "multi30k_ende", "A shipped pair (specdec.pretrained).")
_TARGET_CKPT = flags.DEFINE_string("target_checkpoint", None,
                                   "A T5X checkpoint of the target (with --target_config).")
_DRAFT_CKPT = flags.DEFINE_string("draft_checkpoint", None,
                                  "A T5X checkpoint of the draft (with --draft_config).")
_TARGET_CFG = flags.DEFINE_string("target_config", None,
                                  "specdec.models.t5.CONFIGS name of the target, or 'tiny'.")
_DRAFT_CFG = flags.DEFINE_string("draft_config", None,
                                 "specdec.models.t5.CONFIGS name of the draft, or 'tiny'.")
_RANDOM = flags.DEFINE_bool("random_weights", False,
                            "Random weights for --target_config/--draft_config (tests).")
_GIN_FILE = flags.DEFINE_multi_string("gin_file", [], "A gin run file of configs/runs: "
                                      "task, pair, gamma, temperature from its macros.")
_GIN_BINDINGS = flags.DEFINE_multi_string("gin_bindings", [], "Extra gin bindings.")
_DRAFTS = flags.DEFINE_list(
    "drafts", ["draft", "draft_distilled", "unigram", "bigram"],
    "Drafts: 'draft' (the pair's, or --draft_config's), 'draft_distilled' (the "
    "shipped pair's distilled draft), 'unigram', 'bigram'.")
_NGRAM_CORPUS = flags.DEFINE_string(
    "ngram_corpus", None, "Text (one sentence a line, .gz ok) for the n-gram drafts; "
    "default: the shipped Multi30k German training captions for the German tasks, "
    "the articles of CNN/DM examples outside the measured ones for cnndm.")
_TEMPS = flags.DEFINE_list("temperatures", ["0", "1"], "Sampling temperatures.")
_GAMMAS = flags.DEFINE_list("gammas", ["1", "2", "3", "4", "6", "8"], "Gammas.")
_EXAMPLES = flags.DEFINE_integer("examples", 16, "Examples decoded at batch 1 and timed.")
_ALPHA_EXAMPLES = flags.DEFINE_integer(
    "alpha_examples", 1000, "Examples whose target outputs give alpha (>= 10K tokens "
    "where the data allows).")
_ALPHA_BATCH = flags.DEFINE_integer("alpha_batch", 32, "Batch of the alpha decodes.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats of each decode (median).")
_INPUT_LEN = flags.DEFINE_integer("input_length", None, "Max input tokens (task default).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "Max new tokens (task default).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_OUT = flags.DEFINE_string("out_dir", "out/benchmark", "Where the outputs go.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Progress bars.")
_PLOTS = flags.DEFINE_bool("plots", True, "Write the PNG plots.")
_SHAPES = flags.DEFINE_bool("shapes_only", False,
                            "Time random-weight T5 shapes instead (see shapes_only).")
_PACKED = flags.DEFINE_bool(
    "packed_weights", True, "Pack float32 decoder weights for specdec.kernels on a CPU "
    "(T5.with_packed_weights): verification reads each weight once.")


def _maybe_packed(model, packed: bool):
  return model.with_packed_weights() if packed else model


# ------------------------------------------------------------------------------
# Models, tasks, settings.
# ------------------------------------------------------------------------------
def load_models(target_config, draft_config, target_checkpoint, draft_checkpoint,
                random_weights: bool, pair: str):
  """(target, draft, target cfg, draft cfg, description) from the flags' choices."""
  if target_config or draft_config:
    if not (target_config and draft_config):
      raise ValueError("target_config and draft_config go together")
    tcfg, dcfg = (benchmarking.t5_shape_config(target_config),
                  benchmarking.t5_shape_config(draft_config))
    if random_weights:
      if target_checkpoint or draft_checkpoint:
        raise ValueError("random_weights excludes target_checkpoint/draft_checkpoint")
      tparams, dparams = t5.random_params(tcfg, seed=1), t5.random_params(dcfg, seed=2)
    else:
      if not (target_checkpoint and draft_checkpoint):
        raise ValueError("target_checkpoint and draft_checkpoint are needed with "
                         "target_config/draft_config (or --random_weights)")
      tparams = checkpoints.load_t5x(target_checkpoint, tcfg, dtype=tcfg.dtype)
      dparams = checkpoints.load_t5x(draft_checkpoint, dcfg, dtype=dcfg.dtype)
    names = (target_config, draft_config)
    return (t5.T5(tcfg, jax.device_put(tparams)), t5.T5(dcfg, jax.device_put(dparams)),
            tcfg, dcfg, names)
  target, draft, _ = pretrained.load_pair(pair)
  return target, draft, target.config, draft.config, (f"{pair}/target", f"{pair}/draft")


def load_task(task: str, pair: str) -> list[dict[str, str]]:
  """The task's examples, each {'inputs': text with T5's prefix, 'targets': text}."""
  if task == "multi30k":
    return [dict(inputs=data.TRANSLATE_PREFIX + en, targets=de)
            for en, de in pretrained.test_sentences(pair)]
  return data.load_examples({"wmt_ende": data.WMT_TASK, "cnndm": data.CNNDM_TASK}[task])


def ngram_corpus(task: str, path: str | None, examples: list[dict[str, str]],
                 measured: int) -> list[str]:
  if path:
    return data.read_lines(path)
  if task == "cnndm":
    return [e["inputs"][len(data.SUMMARIZE_PREFIX):] for e in examples[measured:]]
  return data.read_lines(data.MULTI30K_TRAIN_DE_FILE)


def make_drafts(names: Sequence[str], draft, vocab, corpus_lines: list[str],
                vocab_size: int, pair: str | None = None) -> dict[str, Any]:
  """The drafts by name: 'draft' (the chosen one), the pair's other shipped drafts
  ('draft_distilled', when `pair` is the model source), and the n-gram drafts."""
  out = {}
  corpus = None
  shipped = pretrained.drafts(pair) if pair else ()
  for name in names:
    if name == "draft":
      out[name] = draft
      continue
    if name in shipped:
      out[name] = pretrained.load_model(pair, name)
      continue
    if name not in NGRAM_DRAFTS:
      raise ValueError(f"drafts: unknown draft {name!r}; have 'draft', "
                       f"{', '.join(list(shipped[1:]) + list(NGRAM_DRAFTS))}")
    if corpus is None:
      corpus = [vocab.encode(s) + [data.EOS_ID] for s in corpus_lines]
    cls = ngram.Unigram if name == "unigram" else ngram.Bigram
    out[name] = cls.from_corpus(corpus, vocab_size)
  return out


def _macro(name: str):
  import gin  # pylint: disable=g-import-not-at-top
  try:
    value = gin.query_parameter(f"%{name}")
  except ValueError as e:
    raise ValueError(f"gin_file: macro {name} is not defined") from e
  while isinstance(value, gin.config.ConfigurableReference):
    value = value.scoped_configurable_fn()
  if value is gin.REQUIRED:
    raise ValueError(f"gin_file: macro {name} is unset; pass --gin_bindings")
  return value


def settings_from_gin(files: Sequence[str], bindings: Sequence[str]) -> dict[str, Any]:
  """The run's task, feature lengths, modules, checkpoints, gamma and temperature."""
  try:
    import gin  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("--gin_file needs gin-config: pip install 'specdec[t5x]'") from e
  from specdec import run as run_lib  # pylint: disable=g-import-not-at-top
  from specdec.t5x import config_of  # pylint: disable=g-import-not-at-top
  for path in (".", str(run_lib.REPO_ROOT)):
    gin.add_config_file_search_path(path)
  gin.parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
  task = _macro("TASK")
  if task not in GIN_TASKS:
    raise ValueError(f"gin_file: TASK {task!r} is not one of {sorted(GIN_TASKS)}")
  lengths = _macro("TASK_FEATURE_LENGTHS")
  out = dict(task=GIN_TASKS[task], input_length=int(lengths["inputs"]),
             max_new_tokens=int(lengths["targets"]), gammas=[int(_macro("GAMMA"))],
             temperatures=[float(_macro("TEMPERATURE"))])
  models = []
  for role in ("target", "draft"):
    cfg = config_of(_macro(f"{role.upper()}_MODULE"), f"{role}_module")
    if jax.default_backend() == "cpu":
      cfg = cfg.replace(dtype=jnp.float32)
    path = str(_macro(f"{role.upper()}_CHECKPOINT_PATH"))
    models.append((cfg, path))
  out["models"] = models
  return out


# ------------------------------------------------------------------------------
# Measurement.
# ------------------------------------------------------------------------------
def _progress(iterable, enabled: bool, **kwargs):
  if not enabled:
    return iterable
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(iterable, **kwargs)


def encode(vocab, examples, input_length: int, buckets) -> list[np.ndarray]:
  """Each example's ids (trimmed to input_length, EOS last) in its length bucket."""
  return [benchmarking.pad_to_bucket(
      vocab.encode(e["inputs"])[:input_length - 1] + [data.EOS_ID], buckets)
          for e in examples]


def bucketed_batches(inputs: list[np.ndarray], batch: int):
  """(inputs [batch, L], example indices) grouped by bucket; the last batch of a
  bucket is filled with copies of its first row (their outputs are dropped)."""
  by_length: dict[int, list[int]] = {}
  for i, x in enumerate(inputs):
    by_length.setdefault(x.shape[1], []).append(i)
  for length in sorted(by_length):
    ids = by_length[length]
    for start in range(0, len(ids), batch):
      chunk = ids[start:start + batch]
      rows = [inputs[i][0] for i in chunk]
      rows += [rows[0]] * (batch - len(rows))
      yield jnp.asarray(np.stack(rows)), chunk


def measure_alpha(target, drafts: dict[str, Any], inputs: list[np.ndarray],
                  sampling: SamplingConfig, max_new: int, batch: int, seed: int,
                  progress: bool) -> dict[str, np.ndarray]:
  """Per-token betas of every draft along the target's own (batched) outputs."""
  betas: dict[str, list[np.ndarray]] = {d: [] for d in drafts}
  batches = list(bucketed_batches(inputs, batch))
  for i, (x, chunk) in enumerate(_progress(batches, progress, desc="alpha", unit="batch",
                                           leave=False)):
    out = autoregressive_sample(target, x, jax.random.fold_in(jax.random.key(seed), i),
                                max_new_tokens=max_new, sampling=sampling,
                                eos_id=data.EOS_ID)
    for name, draft in drafts.items():
      rows = benchmarking.teacher_forced_betas(target, draft, x, out.tokens,
                                               out.lengths, sampling)
      betas[name] += rows[:len(chunk)]
  return {d: np.concatenate(b) if b else np.zeros(0) for d, b in betas.items()}


def _texts(vocab, outputs) -> list[str]:
  return [vocab.decode(np.asarray(o.tokens)[0, :int(o.lengths[0])].tolist())
          for o in outputs]


def _histogram(betas: np.ndarray, bins: int = 20) -> dict[str, list[float]]:
  counts, edges = np.histogram(betas, bins=bins, range=(0.0, 1.0))
  return dict(edges=[float(e) for e in edges], counts=[int(c) for c in counts])


def run_benchmark(*, task: str, target, target_cfg, drafts: dict[str, Any],
                  draft_cfgs: dict[str, Any], vocab, examples: list[dict[str, str]],
                  temperatures: Sequence[float], gammas: Sequence[int], num_examples: int,
                  alpha_examples: int, alpha_batch: int, repeats: int, input_length: int,
                  max_new_tokens: int, seed: int, progress: bool,
                  names: tuple[str, str]) -> dict[str, Any]:
  """Everything of the module docstring, as one JSON-serializable dict."""
  start_time = time.time()
  compiles0 = benchmarking.compile_count()
  buckets = benchmarking.bucket_lengths(input_length)
  metric = metrics_lib.metric_fn(TASKS[task][2])
  timed = examples[:num_examples]
  timed_inputs = [jnp.asarray(x) for x in encode(vocab, timed, input_length, buckets)]
  alpha_inputs = encode(vocab, examples[:alpha_examples], input_length, buckets)
  references = [e["targets"] for e in timed]
  target_ops = benchmarking.decode_ops_per_token(target_cfg)
  c_hat = {d: (benchmarking.decode_ops_per_token(draft_cfgs[d]) / target_ops
               if draft_cfgs.get(d) is not None else 0.0) for d in drafts}
  compiles = dict(alpha=0, baseline=0, speculative=0, step_costs=0)

  def counted(phase, fn):
    before = benchmarking.compile_count()
    out = fn()
    compiles[phase] += benchmarking.compile_count() - before
    return out

  alpha_rows, baseline_rows, rows = [], [], []
  # Step costs depend on shapes only: once per (draft, gamma), on the median bucket.
  probe = sorted(timed_inputs, key=lambda x: x.shape[1])[len(timed_inputs) // 2]
  costs: dict[tuple[str, int], dict[str, float]] = {}
  settings = [(t, d, g) for t in temperatures for d in drafts for g in gammas]
  bar = _progress(range(len(settings) + 2 * len(temperatures)), progress,
                  desc="benchmark", unit="setting")
  bar_iter = iter(bar)
  key = jax.random.key(seed)
  for temperature in temperatures:
    sampling = SamplingConfig(temperature=temperature)
    betas = counted("alpha", lambda: measure_alpha(
        target, drafts, alpha_inputs, sampling, max_new_tokens, alpha_batch, seed,
        progress))
    for d, b in betas.items():
      alpha_rows.append(dict(task=task, temperature=temperature, draft=d,
                             alpha=float(np.mean(b)) if b.size else float("nan"),
                             tokens=int(b.size), examples=len(alpha_inputs),
                             beta_hist=_histogram(b)))
    next(bar_iter, None)
    base_s, base_out = counted("baseline", lambda: benchmarking.time_decodes(
        benchmarking.autoregressive_decoder(target, max_new_tokens, sampling,
                                            data.EOS_ID), timed_inputs, key, repeats))
    base_texts = _texts(vocab, base_out)
    base_metric = metric(references, base_texts)
    baseline_rows.append(dict(task=task, temperature=temperature,
                              ms_per_token=base_s * 1e3,
                              tokens=int(sum(int(o.lengths[0]) for o in base_out)),
                              metric=base_metric))
    next(bar_iter, None)
    for d, draft in drafts.items():
      for gamma in gammas:
        if (d, gamma) not in costs:
          costs[d, gamma] = counted("step_costs", lambda: benchmarking.step_costs(
              target, draft, probe, gamma, max_new_tokens + gamma + 1,
              repeats=max(5, repeats)))
        cost = costs[d, gamma]
        spec_s, spec_out = counted("speculative", lambda: benchmarking.time_decodes(
            benchmarking.speculative_decoder(target, draft, gamma, max_new_tokens,
                                             sampling, data.EOS_ID),
            timed_inputs, key, repeats))
        stats = jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]),
                             *[o.stats for o in spec_out])
        alpha_decode = benchmarking.pooled_alpha(stats)
        accepted, rejected = int(stats.accepted.sum()), int(stats.rejected.sum())
        nonfinite = int(stats.nonfinite.sum())
        if nonfinite:
          logging.warning("%s, temperature %g, %s, gamma %d: %d positions with "
                          "non-finite logits (NaN, +inf or no finite value)", task,
                          temperature, d, gamma, nonfinite)
        speedup = base_s / spec_s
        predicted = benchmarking.predicted_speedup(alpha_decode, gamma, cost["c"],
                                                   cost["v"])
        predicted_paper = benchmarking.predicted_speedup(alpha_decode, gamma, cost["c"])
        spec_texts = _texts(vocab, spec_out)
        row = dict(
            task=task, temperature=temperature, draft=d, gamma=gamma,
            alpha_decode=alpha_decode,
            alpha_accepts=accepted / max(accepted + rejected, 1),
            iterations=int(stats.iterations.sum()), accepted=accepted,
            rejected=rejected, nonfinite=nonfinite,
            tokens_per_iteration=benchmarking.pooled_tokens_per_iteration(stats),
            eq1=float(theory.expected_tokens(alpha_decode, gamma)),
            **cost, c_hat=c_hat[d],
            baseline_ms_per_token=base_s * 1e3, speculative_ms_per_token=spec_s * 1e3,
            speedup=speedup, predicted_speedup_paper=predicted_paper,
            predicted_speedup=predicted,
            measured_over_predicted=speedup / predicted,
            measured_over_predicted_paper=speedup / predicted_paper,
            ops_factor=float(theory.arithmetic_ops_factor(alpha_decode, gamma,
                                                          c_hat[d])),
            metric_baseline=base_metric,
            metric_speculative=metric(references, spec_texts),
            identical_to_baseline=(
                all(bool(jnp.array_equal(b.tokens, s.tokens))
                    for b, s in zip(base_out, spec_out))
                if temperature == 0 else None))
        rows.append(row)
        next(bar_iter, None)
  for _ in bar_iter:
    pass
  compiles["total"] = benchmarking.compile_count() - compiles0
  device = jax.devices()[0]
  params = {d: (t5.param_count(c) if c is not None else 0) for d, c in draft_cfgs.items()}
  return dict(
      config=dict(
          task=task, target=dict(name=names[0], params=t5.param_count(target_cfg),
                                 decode_ops=target_ops),
          drafts={d: dict(name=names[1] if d == "draft" else d, params=params[d],
                          c_hat=c_hat[d]) for d in drafts},
          temperatures=list(temperatures), gammas=list(gammas), examples=len(timed),
          alpha_examples=len(alpha_inputs), repeats=repeats, input_length=input_length,
          max_new_tokens=max_new_tokens, buckets=list(buckets), seed=seed,
          device=device.device_kind, platform=device.platform,
          cpu_count=os.cpu_count(), jax_version=jax.__version__,
          dtype=str(np.dtype(target_cfg.dtype)), command=" ".join(sys.argv)),
      alpha=alpha_rows, baseline=baseline_rows, rows=rows,
      best=[dict(task=k[0], temperature=k[1], draft=k[2], gamma=r["gamma"],
                 speedup=r["speedup"]) for k, r in tables.best_rows(
                     dict(rows=rows)).items()],
      compiles=compiles, seconds=time.time() - start_time)


# ------------------------------------------------------------------------------
# --shapes_only: the paper's own pairs' shapes, random weights.
# ------------------------------------------------------------------------------
# Table 2 rows known for certain (WMT EnDe, T5-XXL target, T5-small draft):
# (task, temperature, gamma, alpha, the paper's speed-up).
PAPER_TABLE2 = (("wmt_ende", 0.0, 7, 0.75, 3.4), ("wmt_ende", 1.0, 7, 0.62, 2.6))


def _agreeing(model):
  """The same shapes with the decoder's final norm zeroed: all-zero logits, so the
  greedy token is 0 for target and draft alike and every draft is accepted."""
  params = jax.tree_util.tree_map(lambda x: x, model.params)
  params["decoder"]["decoder_norm"]["scale"] = jnp.zeros_like(
      params["decoder"]["decoder_norm"]["scale"])
  # The packed copy holds no norm scale: the zeroed one takes effect there too.
  return model.replace(params=params)


def shapes_only(target_name: str, draft_name: str, gammas: Sequence[int],
                max_new_tokens: int, repeats: int, seed: int,
                input_length: int = 32, packed: bool = True) -> dict[str, Any]:
  """With static shapes an iteration costs the same whatever is accepted, so timing
  random-weight shapes gives speed-up(alpha) = E[tokens](alpha, gamma) x
  t_baseline_token / t_iteration for any alpha (Section 3; Table 2's alphas)."""
  from specdec.sample import speculative_sample  # pylint: disable=g-import-not-at-top
  tcfg, dcfg = (benchmarking.t5_shape_config(target_name),
                benchmarking.t5_shape_config(draft_name))
  target = _maybe_packed(t5.T5(tcfg, benchmarking.random_t5_params(tcfg, seed + 1)), packed)
  draft = _maybe_packed(t5.T5(dcfg, benchmarking.random_t5_params(dcfg, seed + 2)), packed)
  x = jnp.asarray(np.random.default_rng(seed).integers(
      2, 32000, size=(1, input_length)), jnp.int32)
  greedy = SamplingConfig(temperature=0.0)
  key = jax.random.key(seed)

  def base():
    return autoregressive_sample(target, x, key, max_new_tokens=max_new_tokens,
                                 sampling=greedy, eos_id=None).tokens
  base_tokens = np.asarray(base())
  t_base = benchmarking.median_seconds(base, repeats) / max_new_tokens
  rows = []
  for gamma in gammas:
    runs = {}
    for label, (tm, dm) in (("random", (target, draft)),
                            ("agreeing", (_agreeing(target), _agreeing(draft)))):
      def spec(tm=tm, dm=dm):
        return speculative_sample(tm, dm, x, key, gamma=gamma,
                                  max_new_tokens=max_new_tokens, sampling=greedy,
                                  eos_id=None)
      out = jax.block_until_ready(spec())
      seconds = benchmarking.median_seconds(lambda: spec().tokens, repeats)
      iterations = int(out.stats.iterations[0])
      runs[label] = dict(t_iteration=seconds / iterations, iterations=iterations,
                         accepted=int(out.stats.accepted[0]),
                         drafted=int(out.stats.drafted[0]))
      if label == "random":
        # Greedy speculative decoding must give the target's greedy decode.
        runs[label]["identical"] = bool(np.array_equal(np.asarray(out.tokens),
                                                       base_tokens))
    t_iter = runs["random"]["t_iteration"]
    # One cache length for every gamma: t_p1 and t_q compile once, not per gamma.
    costs = benchmarking.step_costs(target, draft, x, gamma,
                                    max_new_tokens + max(gammas) + 1,
                                    repeats=max(3, repeats))
    paper = [dict(task=task, temperature=temp, alpha=alpha, paper_speedup=paper_speedup,
                  speedup=float(theory.expected_tokens(alpha, gamma)) * t_base / t_iter,
                  predicted_paper=benchmarking.predicted_speedup(alpha, gamma, costs["c"]),
                  predicted=benchmarking.predicted_speedup(alpha, gamma, costs["c"],
                                                           costs["v"]))
             for task, temp, g, alpha, paper_speedup in PAPER_TABLE2 if g == gamma]
    rows.append(dict(gamma=gamma, t_baseline_token=t_base, runs=runs,
                     premise_ratio=runs["agreeing"]["t_iteration"] / t_iter, **costs,
                     table2=paper))
  device = jax.devices()[0]
  weight_bytes = sum(int(m.size) * m.dtype.itemsize for m, _ in
                     t5.decode_matrices(tcfg, target.params).values())
  return dict(target=target_name, draft=draft_name, dtype=str(np.dtype(tcfg.dtype)),
              param_dtype=str(jax.tree.leaves(target.params)[0].dtype),
              decoder_weight_bytes=weight_bytes,
              packed_weights=target.packed is not None,
              device=device.device_kind, platform=device.platform,
              jax_version=jax.__version__, max_new_tokens=max_new_tokens, rows=rows)


def shapes_markdown(result: dict[str, Any]) -> str:
  lines = [f"Shapes {result['target']} / {result['draft']}, {result['dtype']}, "
           f"{result['device']} ({result['platform']}), batch 1, greedy, "
           f"{result['max_new_tokens']} tokens", ""]
  if "decoder_weight_bytes" in result:
    lines += [f"Target decoder weights: {result['decoder_weight_bytes'] / 1e9:.2f} GB "
              f"({result['param_dtype']}); 'GB/s' is their streaming rate at t_p1.", ""]
  lines += ["| gamma | base ms/tok | ms/iteration (alpha~0) | ms/iteration (alpha=1) | "
            "ratio | t_p1 ms | GB/s | c | v | identical |", "|" + "---|" * 10]
  for r in result["rows"]:
    gbps = result.get("decoder_weight_bytes", float("nan")) / r["t_p1"] / 1e9
    lines.append(f"| {r['gamma']} | {r['t_baseline_token'] * 1e3:.2f} | "
                 f"{r['runs']['random']['t_iteration'] * 1e3:.2f} | "
                 f"{r['runs']['agreeing']['t_iteration'] * 1e3:.2f} | "
                 f"{r['premise_ratio']:.2f} | {r['t_p1'] * 1e3:.2f} | {gbps:.0f} | "
                 f"{r['c']:.3f} | {r['v']:.2f} | "
                 f"{r['runs']['random'].get('identical', '')} |")
  lines += ["", "| task | temp | gamma | alpha | speed-up here | Thm 3.8 (v = 1) | "
            "refined | paper (TPU-v4, T5-XXL) |", "|" + "---|" * 8]
  for r in result["rows"]:
    for p in r["table2"]:
      lines.append(f"| {p['task']} | {p['temperature']:g} | {r['gamma']} | "
                   f"{p['alpha']:.2f} | {p['speedup']:.2f}x | {p['predicted_paper']:.2f}x | "
                   f"{p['predicted']:.2f}x | {p['paper_speedup']:.1f}x |")
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------
# Plots and outputs.
# ------------------------------------------------------------------------------
def write_plots(result: dict[str, Any], out_dir: str) -> list[str]:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = result["rows"]
  temps = result["config"]["temperatures"]
  drafts = list(result["config"]["drafts"])
  fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 4), squeeze=False)
  for ax, temp in zip(axes[0], temps):
    for i, d in enumerate(drafts):
      sel = sorted((r for r in rows if r["temperature"] == temp and r["draft"] == d),
                   key=lambda r: r["gamma"])
      g = [r["gamma"] for r in sel]
      color = f"C{i}"
      ax.plot(g, [r["speedup"] for r in sel], "o-", color=color, label=f"{d} measured")
      ax.plot(g, [r["predicted_speedup"] for r in sel], "--", color=color,
              label=f"{d} predicted (measured v)")
      ax.plot(g, [r["predicted_speedup_paper"] for r in sel], ":", color=color,
              label=f"{d} Thm 3.8 (v = 1)")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set(title=f"{result['config']['task']}, temperature {temp:g}", xlabel="gamma",
           ylabel="speed-up over the baseline")
    ax.legend(fontsize=6)
  fig.tight_layout()
  speed_path = os.path.join(out_dir, "speedup_vs_gamma.png")
  fig.savefig(speed_path, dpi=120)
  plt.close(fig)
  fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 4), squeeze=False)
  for ax, temp in zip(axes[0], temps):
    for a in (a for a in result["alpha"] if a["temperature"] == temp):
      h = a["beta_hist"]
      centers = (np.asarray(h["edges"][:-1]) + np.asarray(h["edges"][1:])) / 2
      total = max(sum(h["counts"]), 1)
      ax.step(centers, np.asarray(h["counts"]) / total, where="mid",
              label=f"{a['draft']} (alpha {a['alpha']:.2f})")
    ax.set(title=f"per-token beta, temperature {temp:g}", xlabel="beta",
           ylabel="fraction of tokens")
    ax.legend(fontsize=7)
  fig.tight_layout()
  beta_path = os.path.join(out_dir, "beta_hist.png")
  fig.savefig(beta_path, dpi=120)
  plt.close(fig)
  return [speed_path, beta_path]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if _SHAPES.value:
    result = shapes_only(_TARGET_CFG.value or "t5_1_1_base", _DRAFT_CFG.value or "t5_1_1_small",
                         [int(g) for g in _GAMMAS.value] if _GAMMAS.present else [3, 5, 7],
                         _MAX_NEW.value or 32, _REPEATS.value, _SEED.value,
                         packed=_PACKED.value)
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, "shapes.json"), "w") as f:
      json.dump(result, f, indent=2)
    text = shapes_markdown(result)
    with open(os.path.join(_OUT.value, "shapes.md"), "w") as f:
      f.write(text)
    print(text)
    return
  task = _TASK.value
  input_length, max_new, _ = TASKS[task]
  temperatures = [float(t) for t in _TEMPS.value]
  gammas = [int(g) for g in _GAMMAS.value]
  if _GIN_FILE.value:
    s = settings_from_gin(_GIN_FILE.value, _GIN_BINDINGS.value)
    task, input_length, max_new = s["task"], s["input_length"], s["max_new_tokens"]
    gammas, temperatures = s["gammas"], s["temperatures"]
    (tcfg, tpath), (dcfg, dpath) = s["models"]
    target = t5.T5(tcfg, jax.device_put(checkpoints.load_t5x(tpath, tcfg,
                                                             dtype=tcfg.dtype)))
    draft = t5.T5(dcfg, jax.device_put(checkpoints.load_t5x(dpath, dcfg,
                                                            dtype=dcfg.dtype)))
    names = (tpath, dpath)
  else:
    target, draft, tcfg, dcfg, names = load_models(
        _TARGET_CFG.value, _DRAFT_CFG.value, _TARGET_CKPT.value, _DRAFT_CKPT.value,
        _RANDOM.value, _PAIR.value)
  target, draft = _maybe_packed(target, _PACKED.value), _maybe_packed(draft, _PACKED.value)
  input_length = _INPUT_LEN.value or input_length
  max_new = _MAX_NEW.value or max_new
  for name, values in (("gammas", gammas), ("examples", [_EXAMPLES.value]),
                       ("alpha_examples", [_ALPHA_EXAMPLES.value]),
                       ("alpha_batch", [_ALPHA_BATCH.value]),
                       ("repeats", [_REPEATS.value])):
    if any(v < 1 for v in values):
      raise ValueError(f"{name} must be >= 1, got {values}")
  if any(t < 0 for t in temperatures):
    raise ValueError(f"temperatures must be >= 0, got {temperatures}")
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f"draft: vocab_size {draft.vocab_size} differs from the target's "
                     f"{target.vocab_size}")
  vocab = data.Vocabulary()
  examples = load_task(task, _PAIR.value)
  measured = max(_EXAMPLES.value, _ALPHA_EXAMPLES.value)
  corpus = (ngram_corpus(task, _NGRAM_CORPUS.value, examples, measured)
            if any(d in NGRAM_DRAFTS for d in _DRAFTS.value) else [])
  from_pair = not (_GIN_FILE.value or _TARGET_CFG.value or _DRAFT_CFG.value)
  drafts = make_drafts(_DRAFTS.value, draft, vocab, corpus, target.vocab_size,
                       pair=_PAIR.value if from_pair else None)
  result = run_benchmark(
      task=task, target=target, target_cfg=tcfg, drafts=drafts,
      draft_cfgs={d: (None if d in NGRAM_DRAFTS else drafts[d].config) for d in drafts},
      vocab=vocab,
      examples=examples, temperatures=temperatures, gammas=gammas,
      num_examples=_EXAMPLES.value, alpha_examples=_ALPHA_EXAMPLES.value,
      alpha_batch=_ALPHA_BATCH.value, repeats=_REPEATS.value, input_length=input_length,
      max_new_tokens=max_new, seed=_SEED.value, progress=_PROGRESS.value, names=names)
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "benchmark.json"), "w") as f:
    json.dump(result, f, indent=2)
  text = tables.report(result)
  with open(os.path.join(_OUT.value, "benchmark.md"), "w") as f:
    f.write(text)
  if _PLOTS.value:
    write_plots(result, _OUT.value)
  print(text)


if __name__ == "__main__":
  app.run(main)
