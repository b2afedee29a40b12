"""What a decode's parts cost on this machine: the timers, the step costs behind c and
v (t_p(k), t_q), and the AutoGamma loop's cost per iteration at each gamma.

The performance model (Theorem 3.8 of Leviathan et al. 2023, refined): one iteration
costs gamma draft steps and one target call over gamma + 1 positions, so with
c = t_q / t_p1 and v = t_p(gamma+1) / t_p1 the predicted speed-up is
E[tokens](alpha, gamma) / (gamma c + v) (`theory.walltime_improvement`). The paper's
premise is v = 1 (the target's chunk of gamma + 1 costs what one token costs, given
idle parallel compute); a CPU has no idle compute, so v > 1 there and it is measured,
not assumed. `adaptive.calibrate` stores these costs for `AutoGamma`; the benchmarks
(`specdec.bench`) report them.

Timings are of already compiled functions, measured on the same inputs in one run, as
minima over repeats and over interleaved rounds: on a shared machine interference only
ever adds time, so the minimum estimates the cost itself.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec import adaptive, sample
from specdec._checks import check_positive_int
from specdec.distributions import SamplingConfig


def _wall_times(fn: Callable[[], Any], repeats: int, warmup: int) -> list[float]:
  check_positive_int("repeats", repeats)
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Median wall time of `fn()` (blocked until ready) over `repeats`, after warm-up."""
  return float(np.median(_wall_times(fn, repeats, warmup)))


def min_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Minimum wall time of `fn()` (blocked until ready) over `repeats`, after warm-up."""
  return float(np.min(_wall_times(fn, repeats, warmup)))


def interleaved_min_seconds(
  calls: dict[Any, Callable[[], Any]], rounds: int, repeats: int
) -> dict[Any, float]:
  """Each call's minimum seconds over `rounds` rounds of `repeats` (`min_seconds`),
  all of them timed in turn in each round, so that a slow spell of the machine falls
  on all alike."""
  best = {name: float("inf") for name in calls}
  for _ in range(rounds):
    for name, fn in calls.items():
      best[name] = min(best[name], min_seconds(fn, repeats))
  return best


@functools.partial(jax.jit, static_argnames=("steps",))
def _extend_repeated(model, state, tokens, steps):
  """`steps` calls of model.extend(state, tokens) in one compiled scan, each rewound
  to the start, each consuming all of its logits (so none of the work is dropped)."""
  start = model.lengths(state)

  def body(carry, _):
    state, acc = carry
    logits, state = model.extend(state, tokens)
    return (model.rewind(state, start), acc + jnp.max(logits)), None

  (_, acc), _ = jax.lax.scan(body, (state, jnp.zeros((), jnp.float32)), None, length=steps)
  return acc


def extend_seconds(
  model,
  state,
  tokens: jax.Array,
  repeats: int = 5,
  steps: int = 16,
  reduce: Callable[..., Any] = np.median,
) -> float:
  """Seconds of one `extend(state, tokens)` as the decode loops see it: `reduce`
  (median by default) over `repeats` of `steps` calls inside one compiled scan,
  divided by `steps`, so that no per-call dispatch from Python is counted (the
  samplers make none)."""
  times = _wall_times(lambda: _extend_repeated(model, state, tokens, steps), repeats, 1)
  return float(reduce(times)) / steps


@flax.struct.dataclass
class _FeatureStep:
  """A feature draft's step as `extend_seconds` times it: each token fed with a
  feature (zeros; the cost does not depend on its value), the logits returned."""

  draft: Any

  def extend(self, state, tokens):
    features = jnp.zeros(tokens.shape + (self.draft.feature_size,), jnp.float32)
    logits, _, state = self.draft.extend(state, tokens, features)
    return logits, state

  def rewind(self, state, lengths):
    return self.draft.rewind(state, lengths)

  def lengths(self, state):
    return self.draft.lengths(state)


def step_costs(
  target,
  draft,
  inputs: jax.Array,
  gamma: int,
  max_length: int,
  repeats: int = 3,
  steps: int = 16,
  rounds: int = 3,
) -> dict[str, float]:
  """t_p1, t_p(gamma+1) and t_q in seconds, and c, v, for these models and inputs.

  Each is one `extend` on a cache primed by `init` (the encoder's cost is excluded:
  it runs once per input either way), timed inside a compiled loop
  (`extend_seconds`); the minimum over `rounds` x `repeats`, the three measured in
  turn in each round so that a slow spell of the machine cannot fall on one alone.
  """
  r = verify_costs(target, draft, inputs, [gamma + 1], max_length, repeats, steps, rounds)
  return dict(
    t_p1=r["t_p1"], t_p_gamma1=r["t_p"][gamma + 1], t_q=r["t_q"], c=r["c"], v=r["v"][gamma + 1]
  )


def verify_costs(
  target,
  draft,
  inputs: jax.Array,
  chunks: Any,
  max_length: int,
  repeats: int = 3,
  steps: int = 16,
  rounds: int = 3,
) -> dict[str, Any]:
  """`step_costs` for several verification chunk lengths at once.

  t_p(k) for every k in `chunks` (and k = 1), and t_q, each one `extend` on a cache
  primed by `init`, timed inside a compiled loop (`extend_seconds`); the minimum over
  `rounds` x `repeats`, all of them measured in turn in each round.

  Returns:
    {"t_p1": s, "t_q": s, "t_p": {k: s}, "c": t_q / t_p1, "v": {k: t_p(k) / t_p1}}
    with integer keys k (v[1] = 1); a sweep at gamma reads v[gamma + 1].
  """
  ks = sorted({1, *(int(k) for k in chunks)})
  if ks[0] < 1:
    raise ValueError(f"chunks must be positive ints, got {chunks!r}")
  start = target.start_tokens(inputs)[:, None]
  target_state, draft, draft_state = _primed(target, draft, inputs, max_length)
  calls: dict[int | str, tuple[Any, Any, jax.Array]] = {
    k: (target, target_state, jnp.tile(start, (1, k))) for k in ks
  }
  calls["q"] = (draft, draft_state, start)
  best: dict[int | str, float] = {name: float("inf") for name in calls}
  for _ in range(rounds):
    for name, (model, state, tokens) in calls.items():
      best[name] = min(
        best[name], extend_seconds(model, state, tokens, repeats, steps, reduce=np.min)
      )
  t_p = {k: best[k] for k in ks}
  return dict(
    t_p1=t_p[1],
    t_q=best["q"],
    t_p=t_p,
    c=best["q"] / t_p[1],
    v={k: t / t_p[1] for k, t in t_p.items()},
  )


def _primed(target, draft, inputs: jax.Array, max_length: int):
  """(target state, the draft as one-step model, its state), both caches primed by
  `init` (a feature draft with the target's prompt features)."""
  if sample.reads_target_features(draft):
    target_state, features = target.init_with_features(inputs, max_length)
    return target_state, _FeatureStep(draft), draft.init(inputs, max_length, features)
  return target.init(inputs, max_length), draft, draft.init(inputs, max_length)


def speculative_decoder(
  target,
  draft,
  gamma: int,
  max_new_tokens: int,
  sampling: SamplingConfig,
  eos_id: int | None,
  lenience: float = 1.0,
):
  def decode(x, key):
    return sample.speculative_sample(
      target,
      draft,
      x,
      key,
      gamma=gamma,
      max_new_tokens=max_new_tokens,
      sampling=sampling,
      eos_id=eos_id,
      lenience=lenience,
    )

  return decode


def autoregressive_decoder(
  target, max_new_tokens: int, sampling: SamplingConfig, eos_id: int | None
):
  def decode(x, key):
    return sample.autoregressive_sample(
      target, x, key, max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos_id
    )

  return decode


def _in_loop_decoder(
  target, draft, rule: adaptive.AutoGamma, max_new_tokens: int, sampling: SamplingConfig
):
  """The AutoGamma decode loop itself, no EOS, also for a rule that never drafts (which
  `speculative_sample` runs as the baseline's loop): what a gamma-0 iteration costs
  inside a decode that has drafted."""

  def decode(x, key):
    return sample.speculative_loop(
      target, draft, x, key, gamma=rule, max_new_tokens=max_new_tokens, sampling=sampling
    )

  return decode


# ------------------------------------------------------------------------------
# The AutoGamma loop's iterations: what `adaptive.calibrate` stores per gamma.
# ------------------------------------------------------------------------------
def _state_sum(tree) -> jax.Array:
  # Every leaf consumed, so that no part of a prefill is dropped as dead code.
  return sum(
    (jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(tree)),
    jnp.zeros((), jnp.float32),
  )


@functools.partial(jax.jit, static_argnames=("max_length",))
def prefill(target, draft, inputs, max_length):
  """Both models' caches for `inputs` (the target's alone: draft None), as a decode
  builds them before its loop; a scalar that depends on all of them."""
  out = _state_sum(target.init(inputs, max_length))
  return out if draft is None else out + _state_sum(draft.init(inputs, max_length))


def forced_rule(gammas: tuple[int, ...], gamma: int) -> adaptive.AutoGamma:
  """An AutoGamma over `gammas` whose rule always picks `gamma` (every other gamma
  costs 1e18 times more): the adaptive decode loop, compiled as it is, run at one
  gamma, to time its iterations (`iteration_costs`)."""
  if gamma not in gammas:
    raise ValueError(f"gamma {gamma} is not in gammas {gammas}")
  return adaptive.AutoGamma(gammas=gammas, costs=tuple(1e-9 if g == gamma else 1e9 for g in gammas))


def iteration_costs(
  target,
  draft,
  inputs: jax.Array,
  gammas: tuple[int, ...],
  max_new_tokens: int,
  sampling: SamplingConfig = SamplingConfig(0.0),
  key: jax.Array | None = None,
  rounds: int = 3,
  repeats: int = 2,
) -> dict[str, Any]:
  """Seconds of one iteration of the AutoGamma decode loop at each of its gammas.

  The loop over `gammas` is forced to each gamma in turn (`forced_rule`) and run on
  `inputs` with no EOS, beside the baseline decode, in interleaved rounds (minimum of
  `repeats` per round, minimum over rounds); each less its prefill (`init`, timed
  alone), over the iterations its longest row ran (one call of the loop serves the
  batch). Returns {"seconds": {gamma: s}, "baseline_token": s, "cost": {gamma:
  seconds / baseline_token}}: an iteration's cost in steps of the baseline's loop.
  """
  key = jax.random.key(0) if key is None else key
  capacity = max_new_tokens + max(gammas) + 1
  # The samplers are jitted with the models as arguments: wrapping them in another
  # jit would close over the weights and compile them into each executable as
  # constants (one copy of the target per gamma).
  decoders = {
    g: _in_loop_decoder(target, draft, forced_rule(gammas, g), max_new_tokens, sampling)
    for g in gammas
  }
  base = autoregressive_decoder(target, max_new_tokens, sampling, None)
  iterations = {
    g: int(np.max(np.asarray(jax.block_until_ready(d(inputs, key)).stats.iterations)))
    for g, d in decoders.items()
  }

  def tokens_of(decode):
    return lambda: decode(inputs, key).tokens

  calls: dict[Any, Callable[[], Any]] = {("spec", g): tokens_of(d) for g, d in decoders.items()}
  calls["base"] = lambda: base(inputs, key).tokens
  calls["prefill_both"] = lambda: prefill(target, draft, inputs, capacity)
  calls["prefill_base"] = lambda: prefill(target, None, inputs, max_new_tokens + 1)
  best = interleaved_min_seconds(calls, rounds, repeats)
  token = max(best["base"] - best["prefill_base"], 1e-12) / max_new_tokens
  seconds = {
    g: max(best[("spec", g)] - best["prefill_both"], 1e-12) / iterations[g] for g in gammas
  }
  return dict(
    seconds=seconds, baseline_token=token, cost={g: s / token for g, s in seconds.items()}
  )
