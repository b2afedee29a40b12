"""`python -m specdec.bench loop`: the decode loop timed against its parts.

Theorem 3.8 of Leviathan, Kalman & Matias (2023) prices an iteration at gamma draft
steps plus one target call over gamma + 1 positions. This times, per temperature and
gamma, the whole speculative decode and the baseline (each less its prefill) against
the same number of iterations of the target's half alone and of the draft's half
alone (`measure.loop_costs`), summed over prompts: what is left, "overhead", is the
loop's own cost that the theorem leaves out, and measured / predicted (with the
decode's own tokens per iteration) isolates the cost model from alpha's estimate.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec.bench import cli, measure, report, workloads
from specdec.distributions import SamplingConfig

MS_FIELDS = ("spec_iteration", "target_chunk", "draft_steps", "overhead",
             "baseline_token", "target_step")


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field("smollm2_135m_instruct", "A shipped pair or a toy pair.")
  draft: str = cli.field("draft", "The pair's draft (decoder-only pairs: '+lookup' "
                         "mixes in the context lookup).")
  gammas: tuple[int, ...] = cli.field((1, 2, 3, 4), "Gammas.")
  temperatures: tuple[float, ...] = cli.field((0.0, 1.0), "Temperatures.")
  prompts: int = cli.field(2, "Held-out prompts (from the first).")
  max_new_tokens: int = cli.field(64, "Tokens per decode (no EOS: every decode runs "
                                  "them all).")
  rounds: int = cli.field(3, "Interleaved rounds (minimum).")
  repeats: int = cli.field(2, "Repeats per round (minimum).")
  seed: int = cli.field(0, "Sampling keys.")


def pooled_rows(target, draft, prompts, gammas, temperatures, max_new_tokens: int,
                rounds: int, repeats: int, seed: int) -> list[dict]:
  """One row per (temperature, gamma): `measure.loop_costs` summed over the prompts
  (each a list of ids, decoded at its own length), its ratios recomputed from the
  sums."""
  rows = []
  for t in temperatures:
    sampling = SamplingConfig(temperature=float(t))
    for g in gammas:
      parts = [measure.loop_costs(target, draft, jnp.asarray([p]), g, max_new_tokens,
                                  sampling, jax.random.key(seed + i), rounds, repeats)
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
      measure.loop_ratios(row)
      row["per_prompt"] = parts
      rows.append(row)
  return rows


def _unpadded(row: np.ndarray, pad_id) -> list[int]:
  ids = row.tolist()
  while pad_id is not None and len(ids) > 1 and ids[-1] == pad_id:
    ids.pop()
  return ids


def run(config: Config) -> dict:
  cli.check_positive(config, "gammas", "prompts", "max_new_tokens", "rounds", "repeats")
  w = workloads.load(config.pair, config.prompts, draft=config.draft, seed=config.seed)
  pad_id = getattr(w.target, "pad_id", None) if w.family == "llama" else None
  prompts = [_unpadded(x, pad_id) for x in w.inputs]
  rows = pooled_rows(w.target, w.drafts[config.draft], prompts, config.gammas,
                     config.temperatures, config.max_new_tokens, config.rounds,
                     config.repeats, config.seed)
  return dict(config=dataclasses.asdict(config), device=str(jax.devices()[0]),
              prompt_tokens=[len(p) for p in prompts], rows=rows)


def render(result: dict) -> str:
  rows = [[report.temp_key(r["temperature"]), r["gamma"],
           f"{r['tokens_per_iteration']:.2f}",
           *[f"{r[f] * 1e3:.2f}" for f in MS_FIELDS], f"{r['c']:.3f}", f"{r['v']:.2f}",
           f"{r['speedup']:.2f}x", f"{r['predicted']:.2f}x",
           f"{r['measured_over_predicted']:.2f}"] for r in result["rows"]]
  return report.markdown_table(
      ["temp", "gamma", "tok/iter", "iteration ms", "target(gamma+1) ms", "draft ms",
       "overhead ms", "base ms/tok", "target(1) ms", "c", "v", "speed-up (no prefill)",
       "predicted from parts", "meas/pred"], rows)
