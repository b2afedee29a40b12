"""Steps 3 and 4 of Algorithm 1 (Leviathan et al., 2023): accept, then correct.

Pure functions of the verification call's output. Given the target's p_1..p_{gamma+1},
the draft's q_1..q_gamma and its tokens x_1..x_gamma, a row keeps the n leading drafts
with r_i < p_i(x_i) / q_i(x_i) and then draws one more token t from
norm(max(0, p_{n+1} - q_{n+1})), or from p_{gamma+1} when all gamma were kept. `verify`
picks the exact form for the sampling configuration: on distributions at temperature
> 0 (`speculative_step`), on tokens at temperature 0 (`greedy_step`), and Appendix
A.5's lenient forms when asked for (`lenient_greedy_step`, `lenience` < 1).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec.distributions import (
  SamplingConfig,
  greedy_tokens,
  greedy_tokens_checked,
  nonfinite,
  probabilities,
  probabilities_checked,
  sample_categorical,
)

Array = jax.Array

# A residual max(0, p - q) with less mass than this is numerically empty: the
# paper's fallback case (p == q up to rounding), sampled from p instead.
_MIN_RESIDUAL_MASS = float(jnp.finfo(jnp.float32).tiny)

# log p below this is reported as log(1e-30): a token the sampling transform rules
# out is never emitted, but rounding can leave p(t) = 0 for a token it emitted.
_LOG_FLOOR = 1e-30


class Step(NamedTuple):
  """What steps 3 and 4 decide for each row of a batch.

  Attributes:
    n: int32[B], the number of accepted drafts (0..gamma).
    t: int32[B], the token drawn after them: from norm(max(0, p_{n+1} - q_{n+1}))
      when n < gamma, else from p_{gamma+1}.
    beta: float32[B, gamma], the chance that each drafted position is accepted,
      sum_x min(p_i(x), q_i(x)) (Corollary 3.6; [x_i = argmax p_i] at temperature 0).
  """

  n: Array
  t: Array
  beta: Array


class Verdict(NamedTuple):
  """`verify`'s result: a `Step`, and what the loop keeps of the target's call.

  Attributes:
    n, t, beta: as in `Step`.
    p: float32[B, gamma + 1, V], the target's distributions at the verified
      positions, or None at temperature 0 (where nothing is sampled from them).
    bad: int32[B, gamma + 1], 1 where a verified position's logits were not finite.
  """

  n: Array
  t: Array
  beta: Array
  p: Array | None
  bad: Array


def residual(p: Array, q: Array, lenience: float = 1.0) -> Array:
  """norm(max(0, p - l q)) over the last axis, falling back to p when it has no mass.

  The distribution a rejected position is resampled from (Algorithm 1; with
  lenience l < 1, Appendix A.5). With q = 0 it is p itself, which is how the
  all-accepted case samples from p_{gamma+1}. For l < 1 it always has mass
  (sum(p - l q) = 1 - l > 0), so the fallback is only for l = 1 and p == q.
  """
  diff = jnp.maximum(p - _scale(q, lenience), 0.0)
  mass = jnp.sum(diff, axis=-1, keepdims=True)
  has_mass = mass > _MIN_RESIDUAL_MASS
  return jnp.where(has_mass, diff / jnp.where(has_mass, mass, 1.0), p)


def accepts(r: Array, p_x: Array, q_x: Array, lenience: float = 1.0) -> Array:
  """Accept x_i iff r_i < p_i(x_i) / (l q_i(x_i)), computed as r_i l q_i(x_i) < p_i(x_i).

  l = 1 is Algorithm 1; l < 1 is Appendix A.5's lenient test. r must be exact near 0
  (`distributions.uniform`) for the test to be exact when p(x) << q(x).
  """
  return r * _scale(q_x, lenience) < p_x


def beta(p: Array, q: Array, lenience: float = 1.0) -> Array:
  """sum_x min(p(x) / l, q(x)) over the last axis: the chance that x ~ q is accepted
  (Corollary 3.6; with lenience, Appendix A.5)."""
  return jnp.sum(jnp.minimum(_scale(p, 1.0 / lenience), q), axis=-1)


def _scale(x: Array, factor: float) -> Array:
  # A static factor of 1 leaves x untouched: l = 1 is bit for bit Algorithm 1.
  return x if factor == 1.0 else x * factor


def num_accepted(accepted: Array) -> Array:
  """n: the number of leading True values along the last axis. int32[...]."""
  return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=-1), axis=-1, dtype=jnp.int32)


def take(probs: Array, tokens: Array) -> Array:
  """probs[..., tokens] elementwise: probs [B, k, V], tokens [B, k] -> [B, k]."""
  return jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]


def take_position(values: Array, index: Array) -> Array:
  """values[b, index[b]] for every row: values [B, k, ...], index int32[B]."""
  return jax.vmap(lambda v, i: v[i])(values, index)


def log_probs(probs_at_tokens: Array) -> Array:
  """log p of emitted tokens, floored at log(1e-30)."""
  return jnp.log(jnp.maximum(probs_at_tokens, _LOG_FLOOR))


def speculative_step(
  p: Array, q: Array, x: Array, r: Array, key: Array, lenience: float = 1.0
) -> Step:
  """Steps 3 and 4 of Algorithm 1 for a batch of rows.

  Args:
    p: float32[B, gamma + 1, V], target distributions p_1..p_{gamma+1}.
    q: float32[B, gamma, V], draft distributions q_1..q_gamma.
    x: int32[B, gamma], draft tokens, x_i ~ q_i.
    r: float32[B, gamma], uniforms r_i ~ U(0, 1), exact near 0 (`uniform`).
    key: [B] PRNG keys for the corrected token.
    lenience: l in (0, 1] (static); 1 is Algorithm 1, l < 1 Appendix A.5.

  Returns:
    `Step`: n, the accepted drafts; t, sampled from norm(max(0, p_{n+1} - l q_{n+1}))
    (or from p_{gamma+1} when n = gamma); beta, sum_x min(p_i / l, q_i) at each
    drafted position.
  """
  gamma = x.shape[1]
  if gamma == 0:  # No draft: one plain target step, t ~ p_1.
    n = jnp.zeros(x.shape[:1], jnp.int32)
    return Step(n, sample_categorical(key, p[:, 0]), jnp.zeros(x.shape, jnp.float32))
  n = num_accepted(accepts(r, take(p[:, :gamma], x), take(q, x), lenience))
  # q_{gamma+1} = 0: row n of q, zeroed where n = gamma, without padding q.
  q_n = take_position(q, jnp.minimum(n, gamma - 1)) * (n < gamma)[:, None]
  t = sample_categorical(key, residual(take_position(p, n), q_n, lenience))
  return Step(n, t, beta(p[:, :gamma], q, lenience))


def greedy_step(target_tokens: Array, x: Array) -> Step:
  """`speculative_step` at temperature 0, on tokens instead of distributions.

  p_i and q_i are one-hot at the target's argmax y_i and at x_i, so x_i is accepted
  iff x_i = y_i (r_i < p_i(x_i) / q_i(x_i) = 1 or 0), the residual at the first
  mismatch is one-hot at y_{n+1} (as is p_{gamma+1}), and beta_i = [x_i = y_i]: the
  same n, t and beta as `speculative_step` on the one-hot distributions, without
  materializing them over the vocabulary.

  Args:
    target_tokens: int32[B, gamma + 1], y_1..y_{gamma+1}, the target's greedy tokens.
    x: int32[B, gamma], the draft's greedy tokens.
  """
  gamma = x.shape[1]
  matches = x == target_tokens[:, :gamma]
  n = num_accepted(matches)
  return Step(n, take_position(target_tokens, n), matches.astype(jnp.float32))


def lenient_greedy_step(logits: Array, x: Array, sampling: SamplingConfig, lenience: float) -> Step:
  """Appendix A.5's temperature-0 variant: accept x_i iff p_i(x_i) >= l max(p_i).

  The paper prints "p(x) <= l * max(p)", which would accept exactly the unlikely
  tokens; it is read here as p(x) >= l max(p), which at l = 1 accepts the argmax
  only. p is the target's own distribution at temperature 1 after `sampling`'s top-k
  and top-p (temperature 0 itself is one-hot and offers no ratio; top-k / top-p are
  the user's statement of which tokens are allowed at all). The ratio p(x) / max(p)
  does not depend on that distribution's normalization. A rejected or fully
  accepted iteration continues with the target's greedy token, as at l = 1.

  Args:
    logits: [B, gamma + 1, V], the target's verification logits.
    x: int32[B, gamma], the draft's greedy tokens.
    sampling: the (greedy) sampling config; its top_k / top_p apply.
    lenience: l in (0, 1).

  Returns:
    `Step` as `greedy_step`, with beta_i = [x_i is accepted].
  """
  gamma = x.shape[1]
  target_tokens = greedy_tokens(logits)
  clean = probabilities(
    logits[:, :gamma], SamplingConfig(temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p)
  )
  p_x = take(clean, x)
  ok = (p_x > 0) & (p_x >= lenience * jnp.max(clean, axis=-1))
  n = num_accepted(ok)
  return Step(n, take_position(target_tokens, n), ok.astype(jnp.float32))


def verify(
  logits: Array,
  x: Array,
  q: Array | None,
  r: Array | None,
  key: Array,
  sampling: SamplingConfig,
  lenience: float = 1.0,
) -> Verdict:
  """Steps 3 and 4 on the verification call's logits, in the form `sampling` needs.

  Args:
    logits: [B, gamma + 1, V], Mp's logits at [last, x_1..x_gamma].
    x: int32[B, gamma], the drafts.
    q: float32[B, gamma, V], their distributions (None at temperature 0).
    r: float32[B, >= gamma], the uniforms r_i (None at temperature 0).
    key: [B] PRNG keys of the corrected token.
    sampling, lenience: static.

  Returns:
    `Verdict`: n, t and beta per row, p (None at temperature 0) and the positions
    whose logits were not finite.
  """
  gamma = x.shape[1]
  if sampling.greedy and lenience == 1.0:
    target_tokens, bad = greedy_tokens_checked(logits)
    return Verdict(*greedy_step(target_tokens, x), p=None, bad=bad)
  if sampling.greedy:
    return Verdict(
      *lenient_greedy_step(logits, x, sampling, lenience), p=None, bad=nonfinite(logits)
    )
  p, bad = probabilities_checked(logits, sampling)
  if q is None or r is None:
    if gamma > 0:
      raise ValueError("q, r: the drafts' distributions and uniforms are needed when sampling")
    # No drafts: `speculative_step` reads neither; empty stand-ins of their shapes.
    q = jnp.zeros(x.shape + logits.shape[-1:], jnp.float32)
    r = jnp.zeros(x.shape, jnp.float32)
  return Verdict(*speculative_step(p, q, x, r[:, :gamma], key, lenience), p=p, bad=bad)
