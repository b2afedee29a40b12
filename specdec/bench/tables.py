"""`python -m specdec.bench tables`: the paper's Tables 2, 3 and 4 for any pair.

Leviathan, Kalman & Matias (ICML 2023), measured in one run on the same prompts, for
a T5 or a decoder-only pair alike (`workloads.load`; the models are seen through the
`DecodeModel` protocol alone):

* Table 3: alpha of every draft (`--drafts`: the pair's, its other shipped drafts,
  the unigram and bigram drafts, "skip:<layers>" layer-skipping drafts) the paper's
  way (Section 3.1): beta = sum_x min(p(x), q(x)) teacher-forced along the target's
  own decodes of `--alpha-examples` prompts (`bench.alpha.teacher_forced_alpha`), pooled
  over positions, with the histogram of beta;
* step costs of every swept draft: t_p(k) for k = gamma + 1, t_q, c = t_q / t_p(1) and
  v(k) = t_p(k) / t_p(1) (`costs.verify_costs`; the paper's premise is v = 1);
* Tables 2 and 4: per temperature, one row per row kind (`row_kinds`): the baseline
  and speculative decoding with each swept draft at each fixed gamma, timed side by
  side at batch 1 (`bench.timing.time_decodes_paired`): ms/token, the measured speed-up,
  alpha along the decode and from accept counts, tokens per iteration against Eq. 1,
  Theorem 3.8's prediction with v = 1 and with the measured v, measured / predicted,
  Theorem 3.11's operations factor (T5 pairs), the task metric of both decodes, and
  at temperature 0 whether every speculative decode equals the baseline's token for
  token; the best gamma per draft (Table 2's cell) from the measured speed-ups.

The result's "rows" and "alpha" render through `report.table2/3/4` and
`report.sweep`; docs/benchmarks.md describes every field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec import theory
from specdec.bench import cli, drafts as drafts_lib, report, workloads
from specdec.bench.alpha import pooled_alpha, pooled_tokens_per_iteration, teacher_forced_alpha
from specdec.bench.inputs import batched
from specdec.bench.t5_shapes import decode_ops_per_token
from specdec.bench.timing import time_decodes_paired
from specdec.costs import autoregressive_decoder, speculative_decoder, verify_costs
from specdec.distributions import SamplingConfig
from specdec.sample import autoregressive_sample


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field(
    "multi30k_ende",
    "A shipped pair "
    "(specdec.pretrained.list_pairs()) or a toy pair "
    f"({', '.join(workloads.TOY_PAIRS)}).",
  )
  task: str = cli.field("multi30k", "T5 pairs: multi30k, wmt_ende or cnndm.")
  drafts: tuple[str, ...] = cli.field(
    ("draft", "unigram", "bigram"),
    "Drafts whose alpha is measured (Table 3): "
    "'draft', the pair's other shipped drafts (e.g. draft_distilled, draft+lookup), "
    "unigram, bigram, skip:<layers>.",
  )
  sweep: tuple[str, ...] = cli.field(
    ("draft",), "Drafts timed over the gammas (Tables 2 and 4); each must be in --drafts."
  )
  gammas: tuple[int, ...] = cli.field((1, 2, 3, 4, 6, 8), "Fixed gammas of the sweep.")
  temperatures: tuple[float, ...] = cli.field((0.0, 1.0), "Sampling temperatures.")
  examples: int = cli.field(16, "Prompts decoded at batch 1 and timed.")
  alpha_examples: int = cli.field(
    64, "Prompts whose target decodes give alpha (the timed ones first)."
  )
  batch: int = cli.field(8, "Rows per decode of the alpha pass.")
  max_new_tokens: int = cli.field(48, "Tokens generated at most.")
  input_length: int = cli.field(48, "T5 pairs: encoder length (padded).")
  repeats: int = cli.field(3, "Timed rounds of each decode (minimum).")
  cost_rounds: int = cli.field(3, "Interleaved rounds of the step costs (minimum).")
  cost_repeats: int = cli.field(2, "Repeats per round of the step costs.")
  cost_steps: int = cli.field(8, "extend calls per timed loop of the step costs.")
  ngram_corpus: str = cli.field(
    "auto",
    "The n-gram drafts' corpus: 'text' (T5: Multi30k German training "
    "captions, or other CNN/DM articles; LM: shipped articles and German news "
    "without the held-out prompts' texts), 'target_outputs' (the target's greedy "
    "decodes of prompts after the measured ones), 'auto' (text for shipped pairs, "
    "target_outputs for toy pairs).",
  )
  seed: int = cli.field(0, "Sampling keys (and the toy pairs' weights).")


# ------------------------------------------------------------------------------
# Row kinds: what one timed decode of the sweep is. A new kind (an adaptive gamma)
# is one more class with these four members, listed by `row_kinds`.
# ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Baseline:
  """The target alone (autoregressive decoding): every speed-up's denominator."""

  name: str = "baseline"

  def decoder(self, target, drafts, sampling, max_new_tokens, eos_id) -> Callable:
    del drafts
    return autoregressive_decoder(target, max_new_tokens, sampling, eos_id)


@dataclasses.dataclass(frozen=True)
class FixedGamma:
  """Algorithm 1 with `draft` proposing `gamma` tokens every iteration. Its
  prediction is Theorem 3.8 with the measured c and v(gamma + 1) (`predict`)."""

  draft: str
  gamma: int

  @property
  def name(self) -> str:
    return f"{self.draft} gamma={self.gamma}"

  def decoder(self, target, drafts, sampling, max_new_tokens, eos_id) -> Callable:
    return speculative_decoder(
      target, drafts[self.draft], self.gamma, max_new_tokens, sampling, eos_id
    )

  def predict(self, alpha: float, costs: dict[str, Any]) -> dict[str, float]:
    c, v = costs["c"], costs["v"][self.gamma + 1]
    return dict(
      eq1=float(theory.expected_tokens(alpha, self.gamma)),
      c=c,
      v=v,
      t_p1=costs["t_p1"],
      t_q=costs["t_q"],
      t_p_gamma1=costs["t_p"][self.gamma + 1],
      predicted_speedup=float(theory.walltime_improvement(alpha, self.gamma, c, v)),
      predicted_speedup_paper=float(theory.walltime_improvement(alpha, self.gamma, c)),
    )


def row_kinds(config: Config) -> list[Any]:
  """The sweep's decoders at one temperature, the baseline first."""
  return [Baseline()] + [FixedGamma(d, g) for d in config.sweep for g in config.gammas]


# ------------------------------------------------------------------------------
# alpha along the target's own outputs (Section 3.1).
# ------------------------------------------------------------------------------
def measure_alpha(
  target,
  drafts: dict[str, Any],
  inputs: np.ndarray,
  sampling: SamplingConfig,
  max_new_tokens: int,
  eos_id: int,
  batch: int,
  key: jax.Array,
) -> dict[str, np.ndarray]:
  """Per-token beta of every draft along the target's batched decodes of `inputs`
  [N, S] (the last batch filled with copies of its first row, dropped here): {draft:
  float[positions]}, whose mean is the paper's alpha."""
  betas: dict[str, list[np.ndarray]] = {d: [] for d in drafts}
  for i, (x, size) in enumerate(batched(inputs, batch)):
    out = autoregressive_sample(
      target,
      x,
      jax.random.fold_in(key, i),
      max_new_tokens=max_new_tokens,
      sampling=sampling,
      eos_id=eos_id,
    )
    for name, rows in teacher_forced_alpha(
      target, drafts, x, out.tokens, out.lengths, sampling
    ).items():
      betas[name] += rows[:size]
  return {d: np.concatenate(b) if b else np.zeros(0) for d, b in betas.items()}


def _histogram(betas: np.ndarray, bins: int = 20) -> dict[str, list[float]]:
  counts, edges = np.histogram(betas, bins=bins, range=(0.0, 1.0))
  return dict(edges=[float(e) for e in edges], counts=[int(c) for c in counts])


# ------------------------------------------------------------------------------
# The run.
# ------------------------------------------------------------------------------
def _check(config: Config) -> None:
  cli.check_positive(
    config,
    "gammas",
    "examples",
    "alpha_examples",
    "batch",
    "max_new_tokens",
    "input_length",
    "repeats",
    "cost_rounds",
    "cost_repeats",
    "cost_steps",
  )
  if any(t < 0 for t in config.temperatures) or not config.temperatures:
    raise ValueError(f"temperatures must be >= 0, got {config.temperatures}")
  missing = [d for d in config.sweep if d not in config.drafts]
  if missing:
    raise ValueError(f"sweep: {missing} not in drafts {list(config.drafts)}")
  if config.ngram_corpus not in ("auto", "text", "target_outputs"):
    raise ValueError(f"ngram_corpus: {config.ngram_corpus!r} is not auto, text or target_outputs")


def _corpus_kind(config: Config) -> str | None:
  """Which corpus the n-gram drafts count, or None without n-gram drafts."""
  if not set(config.drafts) & set(drafts_lib.NGRAM_DRAFTS):
    return None
  if config.ngram_corpus != "auto":
    return config.ngram_corpus
  return "target_outputs" if config.pair in workloads.TOY_PAIRS else "text"


# Prompts after the measured ones whose target decodes make a 'target_outputs' corpus.
CORPUS_PROMPTS = 32


def _ngram_corpus(config: Config, w: workloads.Workload, kind: str | None, extra: np.ndarray):
  """(corpus, the bigram's start token) for the n-gram drafts, or (None, None)."""
  if kind is None:
    return None, None
  if kind == "target_outputs":
    return drafts_lib.target_output_corpus(
      w.target, extra, w.eos_id, config.max_new_tokens, config.batch
    ), None
  if w.pair in workloads.TOY_PAIRS:
    raise ValueError("ngram_corpus: a toy pair has no text; use target_outputs")
  if w.family == "llama":
    from specdec import pretrained

    tok = pretrained.load_lm_tokenizer(pretrained.pair_info(w.pair)["target"]["lm"])
    return drafts_lib.lm_text_corpus(tok, w.eos_id, exclude=w.texts or ()), None
  from specdec import data

  examples = workloads.task_examples(config.task, w.pair)[len(w.inputs) :]
  return drafts_lib.t5_corpus(data.Vocabulary(), config.task, examples), 0


def _ops_per_token(model) -> int | None:
  cfg = getattr(model, "config", None)
  if cfg is None or not hasattr(cfg, "num_decoder_layers"):
    return None  # Theorem 3.11's count is T5's (`bench.t5_shapes.decode_ops_per_token`).
  return decode_ops_per_token(cfg)


def _concat_stats(outputs):
  return jax.tree.map(
    lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *[o.stats for o in outputs]
  )


def _metric(w: workloads.Workload, outputs) -> dict[str, float]:
  if w.references is None or w.metric is None:
    return {}
  from specdec import metrics

  texts = workloads.texts_of(w, outputs)
  return metrics.metric_fn(w.metric)(w.references[: len(texts)], texts)


def speculative_row(
  kind: FixedGamma,
  task: str,
  temperature: float,
  alpha: float,
  costs: dict[str, Any],
  base: tuple[float, list],
  spec: tuple[float, list],
  c_hat: float | None,
) -> dict[str, Any]:
  """One row of Tables 2 and 4 from the timed decodes (`(seconds per token,
  outputs)`) of the baseline and of `kind`, alpha teacher-forced, and the costs."""
  (base_s, base_out), (spec_s, spec_out) = base, spec
  stats = _concat_stats(spec_out)
  alpha_decode = pooled_alpha(stats)
  accepted, rejected = int(stats.accepted.sum()), int(stats.rejected.sum())
  row = dict(
    task=task,
    temperature=float(temperature),
    kind=type(kind).__name__,
    draft=kind.draft,
    gamma=kind.gamma,
    alpha=alpha,
    alpha_decode=alpha_decode,
    alpha_accepts=accepted / max(accepted + rejected, 1),
    iterations=int(stats.iterations.sum()),
    accepted=accepted,
    rejected=rejected,
    nonfinite=int(stats.nonfinite.sum()),
    tokens_per_iteration=pooled_tokens_per_iteration(stats),
    baseline_ms_per_token=base_s * 1e3,
    speculative_ms_per_token=spec_s * 1e3,
    speedup=base_s / spec_s,
  )
  row.update(kind.predict(alpha, costs))
  row["measured_over_predicted"] = row["speedup"] / row["predicted_speedup"]
  row["measured_over_predicted_paper"] = row["speedup"] / row["predicted_speedup_paper"]
  if c_hat is not None:
    row["c_hat"] = c_hat
    row["ops_factor"] = float(theory.arithmetic_ops_factor(alpha, kind.gamma, c_hat))
  row["identical_to_baseline"] = (
    all(
      np.array_equal(np.asarray(b.tokens), np.asarray(s.tokens))
      and np.array_equal(np.asarray(b.lengths), np.asarray(s.lengths))
      for b, s in zip(base_out, spec_out)
    )
    if temperature == 0
    else None
  )
  return row


def run(config: Config) -> dict[str, Any]:
  """Everything of the module doc, as one JSON-serializable dict: "config",
  "alpha" (Table 3 rows), "baseline" (per temperature), "costs" (per swept draft),
  "rows" (Tables 2 and 4), "best" (Table 2's cells), "examples", "seconds"."""
  _check(config)
  start_time = time.time()
  num = max(config.examples, config.alpha_examples)
  kind = _corpus_kind(config)
  w = workloads.load(
    config.pair,
    num + (CORPUS_PROMPTS if kind == "target_outputs" else 0),
    input_length=config.input_length,
    task=config.task,
    seed=config.seed,
  )
  w.inputs, extra = w.inputs[:num], w.inputs[num:]
  w.texts = None if w.texts is None else w.texts[:num]
  w.references = None if w.references is None else w.references[:num]
  corpus, start_token = _ngram_corpus(config, w, kind, extra)
  drafts = drafts_lib.build(config.drafts, w, corpus, start_token)
  for name, d in drafts.items():
    if d.vocab_size != w.target.vocab_size:
      raise ValueError(
        f"drafts: {name!r} has vocab_size {d.vocab_size}, the target {w.target.vocab_size}"
      )
  task = config.task if w.family == "t5" and w.pair not in workloads.TOY_PAIRS else (w.pair)
  timed_inputs = [jnp.asarray(x[None]) for x in w.inputs[: config.examples]]
  alpha_inputs = w.inputs[: config.alpha_examples]
  max_length = config.max_new_tokens + max(config.gammas) + 1
  costs = {
    d: verify_costs(
      w.target,
      drafts[d],
      timed_inputs[0],
      [g + 1 for g in config.gammas],
      max_length,
      repeats=config.cost_repeats,
      steps=config.cost_steps,
      rounds=config.cost_rounds,
    )
    for d in config.sweep
  }
  target_ops = _ops_per_token(w.target)
  c_hat = {
    d: (_ops_per_token(m) / target_ops if target_ops and _ops_per_token(m) else None)
    for d, m in drafts.items()
  }
  key = jax.random.key(config.seed)
  alpha_rows, baseline_rows, rows, examples = [], [], [], []
  kinds = row_kinds(config)
  for temperature in config.temperatures:
    sampling = SamplingConfig(temperature=temperature)
    betas = measure_alpha(
      w.target,
      drafts,
      alpha_inputs,
      sampling,
      config.max_new_tokens,
      w.eos_id,
      min(config.batch, len(alpha_inputs)),
      jax.random.fold_in(key, 1),
    )
    alpha = {d: float(np.mean(b)) if b.size else float("nan") for d, b in betas.items()}
    alpha_rows += [
      dict(
        task=task,
        temperature=float(temperature),
        draft=d,
        alpha=alpha[d],
        tokens=int(b.size),
        examples=len(alpha_inputs),
        beta_hist=_histogram(b),
      )
      for d, b in betas.items()
    ]
    decoders = {
      k.name: k.decoder(w.target, drafts, sampling, config.max_new_tokens, w.eos_id) for k in kinds
    }
    timed = time_decodes_paired(decoders, timed_inputs, jax.random.fold_in(key, 2), config.repeats)
    base = timed[kinds[0].name]
    base_metric = _metric(w, base[1])
    baseline_rows.append(
      dict(
        task=task,
        temperature=float(temperature),
        ms_per_token=base[0] * 1e3,
        tokens=int(sum(int(o.lengths[0]) for o in base[1])),
        metric=base_metric,
      )
    )
    for kind in kinds[1:]:
      row = speculative_row(
        kind,
        task,
        temperature,
        alpha[kind.draft],
        costs[kind.draft],
        base,
        timed[kind.name],
        c_hat[kind.draft],
      )
      row["metric_baseline"] = base_metric
      row["metric_speculative"] = _metric(w, timed[kind.name][1])
      rows.append(row)
    if temperature == config.temperatures[0] and w.decode is not None:
      outs = workloads.texts_of(w, timed[kinds[1].name][1][:2]) if len(kinds) > 1 else []
      examples += [dict(prompt=p, output=o) for p, o in zip(w.texts or [], outs)]
  device = jax.devices()[0]
  dtype = getattr(getattr(w.target, "config", None), "dtype", jnp.float32)
  return dict(
    config=dict(
      dataclasses.asdict(config),
      task=task,
      target=dict(name=f"{w.pair}/target", params=_param_count(w.target), decode_ops=target_ops),
      drafts={d: dict(c_hat=c_hat[d]) for d in drafts},
      examples=len(timed_inputs),
      alpha_examples=len(alpha_inputs),
      input_length=int(w.inputs.shape[1]),
      device=device.device_kind,
      platform=device.platform,
      cpu_count=os.cpu_count(),
      jax_version=jax.__version__,
      dtype=str(np.dtype(dtype)),
      ngram_corpus_sequences=None if corpus is None else len(corpus),
    ),
    alpha=alpha_rows,
    baseline=baseline_rows,
    costs={
      d: dict(
        t_p1=c["t_p1"],
        t_q=c["t_q"],
        c=c["c"],
        t_p={str(k): s for k, s in c["t_p"].items()},
        v={str(k): s for k, s in c["v"].items()},
      )
      for d, c in costs.items()
    },
    rows=rows,
    best=best_gammas(rows),
    examples=examples,
    seconds=time.time() - start_time,
  )


def _param_count(model) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(getattr(model, "params", {}))))


def best_gammas(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per (task, temperature, draft): the gamma of the highest measured speed-up (Table
  2's cell) and the gamma of the highest predicted one."""
  out = []
  for (task, temperature, draft), best in report.best_rows(dict(rows=rows)).items():
    at = [
      r for r in rows if (r["task"], r["temperature"], r["draft"]) == (task, temperature, draft)
    ]
    predicted = max(at, key=lambda r: r["predicted_speedup"])
    out.append(
      dict(
        task=task,
        temperature=temperature,
        draft=draft,
        gamma=best["gamma"],
        speedup=best["speedup"],
        predicted_speedup=best["predicted_speedup"],
        predicted_best_gamma=predicted["gamma"],
        predicted_best_speedup=predicted["predicted_speedup"],
      )
    )
  return out


def render(result: dict[str, Any]) -> str:
  """Tables 2, 3 and 4, every row, and the task metric where there is one."""
  return report.report(result)
