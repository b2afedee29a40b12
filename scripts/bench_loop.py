r"""The speculative decode loop against the parts its prediction counts.

    python scripts/bench_loop.py [--loop_pair=smollm2_135m_instruct] [--loop_draft=draft] \
        [--loop_gammas=1,2,3,4] \
        [--loop_temperatures=0,1] [--loop_prompts=2] [--loop_max_new_tokens=64] \
        [--loop_rounds=3] [--loop_json=out/bench_loop.json]

Theorem 3.8 of Leviathan, Kalman & Matias (ICML 2023), refined for v != 1, predicts
the speed-up E[tokens] / (gamma c + v): one iteration costs gamma draft steps and one
target call over gamma + 1 positions. `bench_lm_pair` compares it with whole decodes,
prefill included and alpha estimated, so its measured / predicted mixes three things.
This script separates the cost model from the rest (`benchmarking.loop_costs`): per
held-out prompt of the shipped decoder-only pair, batch 1, no EOS, it times

  * the speculative decode loop per iteration and the baseline loop per token (each
    less its prefill, timed alone);
  * the same number of iterations of the target's half alone (`extend` over gamma +
    1 positions) and of the draft's half alone (the sampler's own gamma draft steps),
    and the target's one-token step in the same kind of loop;

and prints the overhead (iteration - parts), the measured speed-up, the prediction
from the parts at the decode's own tokens per iteration, and their ratio.
"""

from __future__ import annotations

from absl import app, flags
import jax
import jax.numpy as jnp

from specdec import benchmarking, lm_prompts, pretrained
from specdec.distributions import SamplingConfig

_PAIR = flags.DEFINE_string("loop_pair", "smollm2_135m_instruct",
                            "A shipped decoder-only pair (`pretrained.load_pair`).")
_GAMMAS = flags.DEFINE_list("loop_gammas", ["1", "2", "3", "4"], "Gammas.")
_TEMPS = flags.DEFINE_list("loop_temperatures", ["0", "1"], "Temperatures.")
_PROMPTS = flags.DEFINE_integer("loop_prompts", 2, "Held-out prompts (from the first).")
_MAX_NEW = flags.DEFINE_integer("loop_max_new_tokens", 64, "Tokens per decode.")
_ROUNDS = flags.DEFINE_integer("loop_rounds", 3, "Interleaved rounds (minimum).")
_REPEATS = flags.DEFINE_integer("loop_repeats", 2, "Repeats per round (minimum).")
_DRAFT = flags.DEFINE_string("loop_draft", "draft", "The shipped draft, optionally with "
                             "'+lookup' (`pretrained.load_pair`).")
_SEED = flags.DEFINE_integer("loop_seed", 0, "Sampling keys.")
_JSON = flags.DEFINE_string("loop_json", "out/bench_loop.json", "JSON output.")

MS_FIELDS = ("spec_iteration", "target_chunk", "draft_steps", "overhead",
             "baseline_token", "target_step")


def run(target, draft, prompts, gammas, temperatures, max_new_tokens: int,
        rounds: int, repeats: int, seed: int) -> list[dict]:
  """One row per (temperature, gamma): `benchmarking.loop_costs` summed over the
  prompts (each [1, S] at its own length), its ratios recomputed from the sums."""
  rows = []
  for t in temperatures:
    sampling = SamplingConfig(temperature=float(t))
    for g in gammas:
      parts = [benchmarking.loop_costs(target, draft, jnp.asarray([p]), g,
                                       max_new_tokens, sampling,
                                       jax.random.key(seed + i), rounds, repeats)
               for i, p in enumerate(prompts)]
      iterations = sum(p["iterations"] for p in parts)
      tokens = sum(p["tokens"] for p in parts)
      # Per-iteration (per-token) seconds pooled over the prompts.
      total = lambda f, n: sum(p[f] * p[n] for p in parts)
      row = dict(temperature=float(t), gamma=int(g), prompts=len(parts),
                 iterations=iterations, tokens=tokens,
                 tokens_per_iteration=tokens / iterations)
      for f in ("spec_iteration", "target_chunk", "draft_steps"):
        row[f] = total(f, "iterations") / iterations
      for f in ("baseline_token", "target_step"):
        row[f] = total(f, "tokens") / tokens
      row["c"] = row["draft_steps"] / g / row["target_step"]
      row["v"] = row["target_chunk"] / row["target_step"]
      benchmarking.loop_ratios(row)
      row["per_prompt"] = parts
      rows.append(row)
  return rows


def markdown(rows) -> str:
  lines = ["| temp | gamma | tok/iter | iteration ms | target(gamma+1) ms | draft ms | "
           "overhead ms | base ms/tok | target(1) ms | c | v | speed-up (no prefill) | "
           "predicted from parts | meas/pred |", "|" + "---|" * 14]
  for r in rows:
    lines.append(
        f"| {r['temperature']:g} | {r['gamma']} | {r['tokens_per_iteration']:.2f} | "
        + " | ".join(f"{r[f] * 1e3:.2f}" for f in MS_FIELDS)
        + f" | {r['c']:.3f} | {r['v']:.2f} | {r['speedup']:.2f}x | "
        f"{r['predicted']:.2f}x | {r['measured_over_predicted']:.2f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  target, draft, tok = pretrained.load_pair(_PAIR.value, draft=_DRAFT.value)
  messages = pretrained.lm_eval_prompts(_PAIR.value)[:_PROMPTS.value]
  prompts = [lm_prompts.encode(tok, m) for m in messages]
  rows = run(target, draft, prompts, [int(g) for g in _GAMMAS.value],
             [float(t) for t in _TEMPS.value], _MAX_NEW.value, _ROUNDS.value,
             _REPEATS.value, _SEED.value)
  text = markdown(rows)
  print(text)
  benchmarking.write_json(_JSON.value, dict(
      pair=_PAIR.value, draft=_DRAFT.value, prompts=len(prompts),
      prompt_tokens=[len(p) for p in prompts],
      max_new_tokens=_MAX_NEW.value, rounds=_ROUNDS.value, repeats=_REPEATS.value,
      device=str(jax.devices()[0]), rows=rows, markdown=text))


if __name__ == "__main__":
  app.run(main)
