"""`python -m specdec.bench loop`: the decode loop timed against its parts.

Theorem 3.8 of Leviathan, Kalman & Matias (2023) prices an iteration at gamma draft
steps plus one target call over gamma + 1 positions. This times, per temperature and
gamma, the whole speculative decode and the baseline (each less its prefill) against
the same number of iterations of the target's half alone and of the draft's half
alone (`loop_costs`), summed over prompts: what is left, "overhead", is the
loop's own cost that the theorem leaves out, and measured / predicted (with the
decode's own tokens per iteration) isolates the cost model from alpha's estimate.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec import costs, drafts
from specdec.bench import cli, report, workloads
from specdec.distributions import SamplingConfig, greedy_tokens_checked, probabilities_checked
from specdec.keys import iteration_keys, row_keys

MS_FIELDS = (
  "spec_iteration",
  "target_chunk",
  "draft_steps",
  "overhead",
  "baseline_token",
  "target_step",
)


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field("smollm2_135m_instruct", "A shipped pair or a toy pair.")
  draft: str = cli.field(
    "draft", "The pair's draft (decoder-only pairs: '+lookup' mixes in the context lookup)."
  )
  gammas: tuple[int, ...] = cli.field((1, 2, 3, 4), "Gammas.")
  temperatures: tuple[float, ...] = cli.field((0.0, 1.0), "Temperatures.")
  prompts: int = cli.field(2, "Held-out prompts (from the first).")
  max_new_tokens: int = cli.field(64, "Tokens per decode (no EOS: every decode runs them all).")
  rounds: int = cli.field(3, "Interleaved rounds (minimum).")
  repeats: int = cli.field(2, "Repeats per round (minimum).")
  seed: int = cli.field(0, "Sampling keys.")


@functools.partial(jax.jit, static_argnames=("chunk", "iterations", "max_length", "sampling"))
def _target_loop(target, inputs, *, chunk, iterations, max_length, sampling):
  """The target's half of `iterations` decode iterations: one `extend` over `chunk`
  positions and the next tokens read off its logits (argmax, or the probabilities
  at a temperature), keeping one position per iteration as a decode keeps n + 1."""
  state = target.init(inputs, max_length)
  tokens = jnp.tile(target.start_tokens(inputs)[:, None], (1, chunk))

  def body(_, carry):
    state, acc = carry
    start = target.lengths(state)
    logits, state = target.extend(state, tokens)
    if sampling.greedy:
      acc = acc + jnp.sum(greedy_tokens_checked(logits)[0])
    else:
      acc = acc + jnp.sum(probabilities_checked(logits, sampling)[0][..., 0])
    return target.rewind(state, start + 1), acc

  return jax.lax.fori_loop(0, iterations, body, (state, jnp.zeros((), jnp.float32)))[1]


@functools.partial(jax.jit, static_argnames=("gamma", "iterations", "max_length", "sampling"))
def _draft_loop(target, draft, inputs, key, *, gamma, iterations, max_length, sampling):
  """The draft's half: `iterations` x the sampler's own gamma draft steps (the
  draft as the decode loop sees it, `drafts.as_proposer`), each iteration committing
  one position, as a rejection at the first draft does."""
  del target  # The proposer starts from the inputs as the sampler's does.
  proposer = drafts.as_proposer(draft)
  state = proposer.start(inputs, max_length, gamma, False, None)
  batch = inputs.shape[0]
  rows = row_keys(key, batch)
  rejected = jnp.zeros((batch,), jnp.int32)
  active = jnp.ones((batch,), bool)

  def body(i, carry):
    state, acc = carry
    step_keys = iteration_keys(rows, jnp.full((batch,), i), gamma + 2)
    x, _, _, state = proposer.propose(state, step_keys[:, :gamma], sampling, gamma)
    chunk = jnp.concatenate([x[:, :1], x], axis=1)
    state = proposer.commit(state, chunk, rejected, gamma, None, active)
    return state, acc + jnp.sum(x)

  return jax.lax.fori_loop(0, iterations, body, (state, jnp.zeros((), jnp.int32)))[1]


def loop_costs(
  target,
  draft,
  inputs: jax.Array,
  gamma: int,
  max_new_tokens: int,
  sampling: SamplingConfig,
  key: jax.Array,
  rounds: int = 3,
  repeats: int = 2,
) -> dict[str, float]:
  """The speculative decode loop timed against the parts Theorem 3.8 counts.

  On `inputs` [1, S] with no EOS (every decode runs `max_new_tokens`), in interleaved
  rounds (minimum of `repeats` per round, minimum over rounds):

  - the whole speculative decode and the whole baseline decode, each less its
    prefill (`init`, timed alone), per iteration and per token;
  - the same number of iterations of the target's half alone (`extend` over gamma +
    1 positions, the next tokens off the logits) and of the draft's half alone (the
    sampler's gamma draft steps), each less its prefill;
  - the target's one-token step in the same kind of loop.

  Returns seconds ("spec_iteration", "target_chunk", "draft_steps", "overhead" =
  spec_iteration - target_chunk - draft_steps, "baseline_token", "target_step"), the
  decode's own "iterations" and "tokens_per_iteration", and "speedup" (the decode
  loops' measured speed-up, prefill excluded), "predicted" (Theorem 3.8 with these
  parts and the decode's own tokens per iteration: tokens_per_iteration x
  target_step / (target_chunk + draft_steps)), and "measured_over_predicted". With
  the decode's own tokens per iteration, the ratio isolates the cost model from
  alpha's estimate: below 1 by the loop's own overhead and by the baseline loop's
  cost beyond its steps."""
  if inputs.ndim != 2 or inputs.shape[0] != 1:
    raise ValueError(f"inputs: one row [1, S] expected, got shape {inputs.shape}")
  length = max_new_tokens + gamma + 1
  spec = jax.jit(costs.speculative_decoder(target, draft, gamma, max_new_tokens, sampling, None))
  base = jax.jit(costs.autoregressive_decoder(target, max_new_tokens, sampling, None))
  out = jax.block_until_ready(spec(inputs, key))
  iterations = int(out.stats.iterations[0])
  tokens = int(out.lengths[0])
  base_length = max_new_tokens + 1
  calls = dict(
    spec=lambda: spec(inputs, key).tokens,
    base=lambda: base(inputs, key).tokens,
    prefill_both=lambda: costs.prefill(target, draft, inputs, length),
    prefill_target=lambda: costs.prefill(target, None, inputs, length),
    prefill_base=lambda: costs.prefill(target, None, inputs, base_length),
    target_chunk=lambda: _target_loop(
      target, inputs, chunk=gamma + 1, iterations=iterations, max_length=length, sampling=sampling
    ),
    draft_steps=lambda: _draft_loop(
      target,
      draft,
      inputs,
      key,
      gamma=gamma,
      iterations=iterations,
      max_length=length,
      sampling=sampling,
    ),
    target_step=lambda: _target_loop(
      target, inputs, chunk=1, iterations=max_new_tokens, max_length=base_length, sampling=sampling
    ),
  )
  best = costs.interleaved_min_seconds(calls, rounds, repeats)
  draft_prefill = max(best["prefill_both"] - best["prefill_target"], 0.0)
  r = dict(
    iterations=iterations,
    tokens=tokens,
    tokens_per_iteration=tokens / iterations,
    spec_iteration=(best["spec"] - best["prefill_both"]) / iterations,
    target_chunk=(best["target_chunk"] - best["prefill_target"]) / iterations,
    draft_steps=(best["draft_steps"] - draft_prefill) / iterations,
    baseline_token=(best["base"] - best["prefill_base"]) / max_new_tokens,
    target_step=(best["target_step"] - best["prefill_base"]) / max_new_tokens,
    prefill_target=best["prefill_target"],
    prefill_draft=draft_prefill,
  )
  return loop_ratios(r)


def loop_ratios(r: dict[str, Any]) -> dict[str, Any]:
  """`loop_costs`' derived figures from its seconds and tokens per iteration (also
  for figures pooled over prompts): overhead, speedup, predicted and their ratio."""
  r["overhead"] = r["spec_iteration"] - r["target_chunk"] - r["draft_steps"]
  r["speedup"] = r["baseline_token"] * r["tokens_per_iteration"] / r["spec_iteration"]
  r["predicted"] = (
    r["tokens_per_iteration"] * r["target_step"] / (r["target_chunk"] + r["draft_steps"])
  )
  r["measured_over_predicted"] = r["speedup"] / r["predicted"]
  return r


def pooled_rows(
  target,
  draft,
  prompts,
  gammas,
  temperatures,
  max_new_tokens: int,
  rounds: int,
  repeats: int,
  seed: int,
) -> list[dict]:
  """One row per (temperature, gamma): `loop_costs` summed over the prompts
  (each a list of ids, decoded at its own length), its ratios recomputed from the
  sums."""
  rows = []
  for t in temperatures:
    sampling = SamplingConfig(temperature=float(t))
    for g in gammas:
      parts = [
        loop_costs(
          target,
          draft,
          jnp.asarray([p]),
          g,
          max_new_tokens,
          sampling,
          jax.random.key(seed + i),
          rounds,
          repeats,
        )
        for i, p in enumerate(prompts)
      ]
      iterations = sum(p["iterations"] for p in parts)
      tokens = sum(p["tokens"] for p in parts)
      # Per-iteration (per-token) seconds pooled over the prompts.
      total = lambda f, n, parts=parts: sum(p[f] * p[n] for p in parts)
      row = dict(
        temperature=float(t),
        gamma=int(g),
        prompts=len(parts),
        iterations=iterations,
        tokens=tokens,
        tokens_per_iteration=tokens / iterations,
      )
      for f in ("spec_iteration", "target_chunk", "draft_steps"):
        row[f] = total(f, "iterations") / iterations
      for f in ("baseline_token", "target_step"):
        row[f] = total(f, "tokens") / tokens
      row["c"] = row["draft_steps"] / g / row["target_step"]
      row["v"] = row["target_chunk"] / row["target_step"]
      loop_ratios(row)
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
  rows = pooled_rows(
    w.target,
    w.drafts[config.draft],
    prompts,
    config.gammas,
    config.temperatures,
    config.max_new_tokens,
    config.rounds,
    config.repeats,
    config.seed,
  )
  return dict(
    config=dataclasses.asdict(config),
    device=str(jax.devices()[0]),
    prompt_tokens=[len(p) for p in prompts],
    rows=rows,
  )


def render(result: dict) -> str:
  rows = [
    [
      report.temp_key(r["temperature"]),
      r["gamma"],
      f"{r['tokens_per_iteration']:.2f}",
      *[f"{r[f] * 1e3:.2f}" for f in MS_FIELDS],
      f"{r['c']:.3f}",
      f"{r['v']:.2f}",
      f"{r['speedup']:.2f}x",
      f"{r['predicted']:.2f}x",
      f"{r['measured_over_predicted']:.2f}",
    ]
    for r in result["rows"]
  ]
  return report.markdown_table(
    [
      "temp",
      "gamma",
      "tok/iter",
      "iteration ms",
      "target(gamma+1) ms",
      "draft ms",
      "overhead ms",
      "base ms/tok",
      "target(1) ms",
      "c",
      "v",
      "speed-up (no prefill)",
      "predicted from parts",
      "meas/pred",
    ],
    rows,
  )
