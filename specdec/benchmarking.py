"""Measurements the demo and the benchmarks share: step costs, decode timings, alpha.

The performance model (DESIGN, and Theorem 3.8 of Leviathan et al. 2023 refined):
one iteration costs gamma draft steps and one target call over gamma + 1 positions,
so with c = t_q / t_p1 and v = t_p(gamma+1) / t_p1 the predicted speed-up is
E[tokens](alpha, gamma) / (gamma c + v). The paper's premise is v = 1 (the target's
chunk of gamma + 1 costs what one token costs, given idle parallel compute); a CPU has
no idle compute, so v > 1 there and it is measured, not assumed.

All timings are medians over repeats of already compiled functions, measured on the
same inputs in one run.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from specdec import sample, theory
from specdec.distributions import SamplingConfig


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Median wall time of `fn()` (blocked until ready) over `repeats`, after warm-up."""
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return float(np.median(times))


@jax.jit
def _extend_logits(model, state, tokens):
  return model.extend(state, tokens)[0]


def step_costs(target, draft, inputs: jax.Array, gamma: int, max_length: int,
               repeats: int = 20) -> dict[str, float]:
  """t_p1, t_p(gamma+1) and t_q in seconds, and c, v, for these models and inputs.

  Each is one compiled `extend` call on a cache primed by `init` (the encoder's cost
  is excluded: it runs once per input either way).
  """
  start = target.start_tokens(inputs)[:, None]
  target_state = target.init(inputs, max_length)
  draft_state = draft.init(inputs, max_length)
  chunk = jnp.tile(start, (1, gamma + 1))
  t_p1 = median_seconds(lambda: _extend_logits(target, target_state, start), repeats)
  t_pk = median_seconds(lambda: _extend_logits(target, target_state, chunk), repeats)
  t_q = median_seconds(lambda: _extend_logits(draft, draft_state, start), repeats)
  return dict(t_p1=t_p1, t_p_gamma1=t_pk, t_q=t_q, c=t_q / t_p1, v=t_pk / t_p1)


def predicted_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
  """E[tokens](alpha, gamma) / (gamma c + v): Theorem 3.8 with v = 1, refined else."""
  return float(theory.walltime_improvement(alpha, gamma, c, v=v))


def pooled_alpha(stats: sample.SpeculativeStats) -> float:
  """The paper's alpha over a whole decode: total beta over decoded positions."""
  return float(np.sum(stats.beta_sum) / max(int(np.sum(stats.beta_count)), 1))


def pooled_tokens_per_iteration(stats: sample.SpeculativeStats) -> float:
  return float(np.sum(stats.accepted + stats.iterations) /
               max(int(np.sum(stats.iterations)), 1))


def time_decodes(decode: Callable[[jax.Array, jax.Array], sample.SampleOutput],
                 inputs: list[jax.Array], key: jax.Array, repeats: int = 1
                 ) -> tuple[float, list[sample.SampleOutput]]:
  """Seconds per generated token over `inputs` (each [1, S]), and the outputs.

  Each input is decoded once untimed (compiling if needed, and giving the output) and
  then `repeats` times timed; the time per token is total median time / total tokens.
  """
  outputs, seconds, tokens = [], 0.0, 0
  for i, x in enumerate(inputs):
    k = jax.random.fold_in(key, i)
    out = jax.block_until_ready(decode(x, k))
    outputs.append(out)
    seconds += median_seconds(lambda: decode(x, k).tokens, repeats, warmup=0)
    tokens += int(np.sum(out.lengths))
  return seconds / max(tokens, 1), outputs


def speculative_decoder(target, draft, gamma: int, max_new_tokens: int,
                        sampling: SamplingConfig, eos_id: int | None):
  def decode(x, key):
    return sample.speculative_sample(target, draft, x, key, gamma=gamma,
                                     max_new_tokens=max_new_tokens, sampling=sampling,
                                     eos_id=eos_id)
  return decode


def autoregressive_decoder(target, max_new_tokens: int, sampling: SamplingConfig,
                           eos_id: int | None):
  def decode(x, key):
    return sample.autoregressive_sample(target, x, key, max_new_tokens=max_new_tokens,
                                        sampling=sampling, eos_id=eos_id)
  return decode
