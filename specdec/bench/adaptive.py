"""`python -m specdec.bench adaptive`: baseline, every fixed gamma and AutoGamma, side by side.

    python -m specdec.bench adaptive [--pair=all] [--temperatures=0,1] [--batches=1] \
        [--fixed-gammas=1,2,4,6] [--num-prompts=8] [--max-new-tokens=48]

For each pair, temperature and batch size, every decoder is timed on the same inputs
in interleaved rounds (the minimum of each per input counts): the autoregressive
baseline, speculative decoding at each fixed gamma, and `specdec.AutoGamma` with the
pair's shipped step costs (`costs.json` beside its weights, measured by
`specdec.adaptive.calibrate`; `--calibrate` measures them anew at each batch size) and
the draft's measured alpha at that temperature (its model card) as the prior.
Each row reports ms/token and tokens/s of the three, the best fixed gamma (chosen
after the fact: an oracle), adaptive / baseline and adaptive / best fixed, the gammas
adaptive chose, and measured / predicted: Theorem 3.8 with the chosen gammas, i.e. the
tokens adaptive produced over the target steps its iterations cost (the rule's costs:
the loop's calibrated iterations, `StepCosts.cost`), against the measured speed-up
of the decode loop (each decode's prefill, timed alone, comes off its time; the
tok/s columns are end to end, prefill included); and the same with Theorem 3.8's
model costs alone, gamma c + v(gamma + 1) ("c, v
only"). At batch 1 it also lists, per prompt, the speed-ups of the best fixed gamma
and of adaptive.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec import adaptive, pretrained
from specdec.bench import cli, report, workloads
from specdec.bench.timing import time_each
from specdec.costs import autoregressive_decoder, min_seconds, prefill, speculative_decoder
from specdec.distributions import SamplingConfig

PAIRS = ("smollm2_135m_instruct", "multi30k_ende")


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field("all", f"A shipped pair, a toy pair, or 'all': {', '.join(PAIRS)}.")
  temperatures: tuple[float, ...] = cli.field((0.0, 1.0), "Sampling temperatures.")
  batches: tuple[int, ...] = cli.field((1,), "Batch sizes (each a row of the table).")
  fixed_gammas: tuple[int, ...] = cli.field((1, 2, 4, 6), "Fixed gammas to compare.")
  num_prompts: int = cli.field(8, "Held-out prompts (grouped into batches).")
  max_new_tokens: int = cli.field(48, "Tokens generated at most per row.")
  draft: str = cli.field(
    "best",
    "The pair's draft; 'best': the decoder-only pair's "
    "draft+lookup, the T5 pair's draft of the higher alpha.",
  )
  calibrate: bool = cli.field(
    False,
    "Measure the step costs anew at each batch size instead of reading the pair's costs.json.",
  )
  objective: str = cli.field(
    "sum",
    "What AutoGamma's batch choice optimizes: 'sum' "
    "(tokens per unit of time over rows) or 'last' (the time "
    "until the batch's last row finishes).",
  )
  margin: float = cli.field(
    pretrained.SHIPPED_MARGIN,
    "AutoGamma's margin: drafting must be predicted to beat plain steps by this fraction.",
  )
  repeats: int = cli.field(2, "Timed rounds per input (the minimum counts).")
  seed: int = cli.field(0, "Sampling seed.")


def shipped_costs(
  pair: str, batch: int, draft: str = "draft", temperature: float = 0.0
) -> adaptive.StepCosts | None:
  """`pretrained.step_costs`; None for the toy pairs."""
  if pair in workloads.TOY_PAIRS:
    return None
  return pretrained.step_costs(pair, draft, batch, temperature)


def measured_alpha(pair: str, draft: str, temperature: float) -> float | None:
  """`pretrained.measured_alpha` (AutoGamma's prior); None for the toy pairs."""
  if pair in workloads.TOY_PAIRS:
    return None
  return pretrained.measured_alpha(pair, draft, temperature)


def _draft_name(pair: str, draft: str, temperature: float) -> str:
  if draft != "best" or pair in workloads.TOY_PAIRS:
    return "draft" if draft == "best" else draft
  if workloads.is_lm_pair(pair):
    return "draft+lookup"
  return pretrained.best_draft(pair, temperature)


def _tokens(outputs) -> int:
  return int(sum(np.sum(o.lengths) for o in outputs))


def _row(pair, temperature, batch, rule, timed, fixed_gammas, per_prompt, costs=None, prefill=None):
  base_s, base_out = timed["baseline"]
  tokens = _tokens(base_out)
  ms = {name: 1e3 * sum(s) / max(_tokens(o), 1) for name, (s, o) in timed.items()}
  fixed = {g: ms[f"gamma={g}"] for g in fixed_gammas}
  best_g = min(fixed, key=fixed.get)
  auto_out = timed["adaptive"][1]
  counts = np.sum([np.sum(np.asarray(o.stats.gamma_counts), axis=0) for o in auto_out], 0)
  predicted = speedup_in_steps(rule, auto_out, base_out)
  measured = ms["baseline"] / ms["adaptive"]
  # Theorem 3.8 predicts the decode loop: the prefills (the prompt through the target,
  # and through the draft too where the decode drafts) come off both decodes' times.
  loop = measured
  if prefill is not None:
    loop = (sum(base_s) - prefill["baseline"]) / max(
      sum(timed["adaptive"][0]) - prefill["adaptive"], 1e-12
    )
  # Theorem 3.8 with the model's costs alone, gamma c + v(gamma + 1): what the loop's
  # measured iterations add shows as the gap between the two predictions.
  model = (
    None
    if costs is None
    else speedup_in_steps(rule, auto_out, base_out, tuple(costs.model_cost(g) for g in rule.gammas))
  )
  row = dict(
    pair=pair,
    temperature=temperature,
    batch=batch,
    tokens=tokens,
    baseline_ms=ms["baseline"],
    fixed_ms={str(g): v for g, v in fixed.items()},
    best_fixed_gamma=best_g,
    best_fixed_ms=fixed[best_g],
    adaptive_ms=ms["adaptive"],
    baseline_tok_s=1e3 / ms["baseline"],
    best_fixed_tok_s=1e3 / fixed[best_g],
    adaptive_tok_s=1e3 / ms["adaptive"],
    adaptive_speedup=measured,
    best_fixed_speedup=ms["baseline"] / fixed[best_g],
    adaptive_over_best_fixed=fixed[best_g] / ms["adaptive"],
    gamma_histogram={str(g): int(n) for g, n in zip(rule.gammas, counts)},
    loop_speedup=loop,
    prefill_s=prefill,
    predicted_speedup=predicted,
    measured_over_predicted=loop / predicted,
    predicted_speedup_model=model,
    measured_over_predicted_model=None if model is None else loop / model,
    costs=list(rule.costs),
    gammas=list(rule.gammas),
  )
  row.update(_bootstrap(timed, fixed_gammas))
  if per_prompt:
    row["per_prompt"] = [
      dict(best_fixed=b / f, adaptive=b / a)
      for b, f, a in zip(base_s, timed[f"gamma={best_g}"][0], timed["adaptive"][0])
    ]
  return row


def _bootstrap(timed, fixed_gammas, resamples: int = 2000, seed: int = 0) -> dict[str, list[float]]:
  """5-95 % intervals of adaptive / baseline and adaptive / best fixed gamma over the
  inputs (a percentile bootstrap: inputs drawn with replacement, each draw's best
  fixed gamma chosen again, so the oracle's luck on these inputs is in the interval).
  At temperature > 0 each decoder samples its own text, and what the draft accepts
  varies with it: the interval shows how much of a ratio that leaves to chance."""
  names = ["baseline", "adaptive"] + [f"gamma={g}" for g in fixed_gammas]
  secs = np.asarray([timed[n][0] for n in names])  # [D, I]
  toks = np.asarray([[int(np.sum(o.lengths)) for o in timed[n][1]] for n in names])
  rng = np.random.default_rng(seed)
  draws = rng.integers(0, secs.shape[1], (resamples, secs.shape[1]))
  ms = secs[:, draws].sum(-1) / np.maximum(toks[:, draws].sum(-1), 1)  # [D, R]
  over_base = ms[0] / ms[1]
  over_best = ms[2:].min(axis=0) / ms[1]
  interval = lambda x: [float(np.percentile(x, 5)), float(np.percentile(x, 95))]
  return dict(
    adaptive_speedup_interval=interval(over_base),
    adaptive_over_best_fixed_interval=interval(over_best),
  )


def _prefill_seconds(
  target, draft, rule, inputs, max_new_tokens: int, repeats: int
) -> dict[str, float]:
  """Seconds, summed over `inputs`, of the baseline's prefill (the target's cache for
  max_new_tokens + 1) and the adaptive decode's (both models' caches for the largest
  gamma; the target's alone for a rule that never drafts: it runs the baseline's loop),
  each the minimum of `repeats` + 1 calls."""
  spec = max_new_tokens + rule.max_gamma + 1
  base, auto, plain = 0.0, 0.0, adaptive.never_drafts(rule)
  for x in inputs:
    alone = min_seconds(lambda x=x: prefill(target, None, x, max_new_tokens + 1), repeats + 1)
    base += alone
    auto += (
      alone if plain else min_seconds(lambda x=x: prefill(target, draft, x, spec), repeats + 1)
    )
  return dict(baseline=base, adaptive=auto)


def speedup_in_steps(
  rule: adaptive.AutoGamma, outputs, base_outputs, costs: tuple[float, ...] | None = None
) -> float:
  """The speed-up in target steps (Theorem 3.8 with the gammas the rule chose): the
  decodes' tokens per target step at `costs` (default the rule's) over the baseline's;
  1 for a rule that never drafts (it runs the baseline's loop)."""
  if adaptive.never_drafts(rule):
    return 1.0
  return tokens_per_step(outputs, rule.costs if costs is None else costs) / tokens_per_step(
    base_outputs, (1.0,)
  )


def tokens_per_step(outputs, costs) -> float:
  """Tokens per target step of the decodes that made `outputs`: one call of the loop
  serves the whole batch, and the row that ran longest saw every call, so its
  per-gamma counts are the calls' (the baseline: one call costs one step)."""
  tokens, steps = 0, 0.0
  for o in outputs:
    tokens += int(np.sum(o.lengths))
    longest = int(np.argmax(np.asarray(o.stats.iterations)))
    counts = (
      np.asarray(o.stats.gamma_counts)[longest]
      if hasattr(o.stats, "gamma_counts")
      else [o.stats.iterations[longest]]
    )
    steps += float(np.dot(counts, costs))
  return tokens / max(steps, 1e-9)


def run(config: Config) -> dict[str, Any]:
  cli.check_positive(config, "num_prompts", "max_new_tokens", "repeats", "batches", "fixed_gammas")
  pairs = PAIRS if config.pair == "all" else (config.pair,)
  rows = []
  for pair in pairs:
    for temperature in config.temperatures:
      name = _draft_name(pair, config.draft, temperature)
      w = workloads.load(pair, max(config.num_prompts, max(config.batches)), draft=name)
      target, draft = w.target, w.drafts[name]
      sampling = SamplingConfig(temperature)
      for batch in config.batches:
        inputs = [
          jnp.asarray(w.inputs[i : i + batch]) for i in range(0, len(w.inputs) - batch + 1, batch)
        ]
        costs = None if config.calibrate else shipped_costs(pair, batch, name, temperature)
        if costs is None:
          costs = adaptive.calibrate(
            target, draft, inputs[0], max_length=config.max_new_tokens + 16, sampling=sampling
          )
        prior = measured_alpha(pair, name, temperature)
        gammas = (
          pretrained.shipped_gammas(pair)
          if pair in pretrained.list_pairs()
          else adaptive.DEFAULT_GAMMAS
        )
        rule = adaptive.AutoGamma.from_costs(
          costs,
          gammas,
          objective=config.objective,
          margin=config.margin,
          **({} if prior is None else dict(prior=prior)),
        )
        decoders = {
          "baseline": autoregressive_decoder(target, config.max_new_tokens, sampling, w.eos_id)
        }
        for g in config.fixed_gammas:
          decoders[f"gamma={g}"] = speculative_decoder(
            target, draft, g, config.max_new_tokens, sampling, w.eos_id
          )
        decoders["adaptive"] = speculative_decoder(
          target, draft, rule, config.max_new_tokens, sampling, w.eos_id
        )
        timed = time_each(decoders, inputs, jax.random.key(config.seed), config.repeats)
        if temperature == 0.0:
          for decoder, (_, outs) in timed.items():
            same = all(
              np.array_equal(a.tokens, b.tokens) for a, b in zip(outs, timed["baseline"][1])
            )
            if not same:
              raise AssertionError(f"{pair}: {decoder} differs from greedy at temperature 0")
        rows.append(
          _row(
            pair,
            temperature,
            batch,
            rule,
            timed,
            config.fixed_gammas,
            per_prompt=batch == 1,
            costs=costs,
            prefill=_prefill_seconds(
              target, draft, rule, inputs, config.max_new_tokens, config.repeats
            ),
          )
        )
  return dict(config=dataclasses.asdict(config), device=jax.devices()[0].device_kind, rows=rows)


def _with_interval(row, key) -> str:
  lo_hi = row.get(f"{key}_interval")
  text = f"{row[key]:.2f}x"
  return text if lo_hi is None else f"{text} ({lo_hi[0]:.2f}-{lo_hi[1]:.2f})"


def render(result: dict[str, Any]) -> str:
  header = [
    "pair",
    "T",
    "batch",
    "baseline tok/s",
    "best fixed",
    "tok/s",
    "adaptive tok/s",
    "adaptive / baseline",
    "adaptive / best fixed",
    "gammas chosen",
    "loop: measured / predicted",
    "(c, v only)",
  ]
  lines = []
  for r in result["rows"]:
    hist = " ".join(f"{g}:{n}" for g, n in r["gamma_histogram"].items() if n)
    lines.append(
      [
        r["pair"],
        f"{r['temperature']:g}",
        str(r["batch"]),
        f"{r['baseline_tok_s']:.1f}",
        f"gamma {r['best_fixed_gamma']}",
        f"{r['best_fixed_tok_s']:.1f}",
        f"{r['adaptive_tok_s']:.1f}",
        _with_interval(r, "adaptive_speedup"),
        _with_interval(r, "adaptive_over_best_fixed"),
        hist,
        f"{r['measured_over_predicted']:.2f}",
        "-"
        if r.get("measured_over_predicted_model") is None
        else f"{r['measured_over_predicted_model']:.2f}",
      ]
    )
  text = report.markdown_table(header, lines)
  text += (
    "\n\nIn brackets: 5-95 % bootstrap intervals over the inputs (the best fixed "
    "gamma chosen again in each draw)."
  )
  for r in result["rows"]:
    if "per_prompt" in r:
      pp = ", ".join(f"{p['best_fixed']:.2f}/{p['adaptive']:.2f}" for p in r["per_prompt"])
      text += (
        f"\n\n{r['pair']} T={r['temperature']:g}, per prompt, speed-up of the "
        f"best fixed gamma / adaptive: {pp}"
      )
  return text
