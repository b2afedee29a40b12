"""Logits to sampling distributions (temperature, top-k, top-p, greedy) and draws.

Section 2.3 of Leviathan et al. (2023): speculative sampling stays exact for any
sampling scheme that is a transform of the model's distribution, provided the *same*
transform is applied to p (target) and q (draft) before Algorithm 1 runs. This module
is that transform. Temperature is applied first, then top-k, then top-p; temperature
0 is greedy decoding, i.e. a one-hot distribution at the argmax. Everything is
computed in float32 whatever the logits' dtype, and never returns NaN: NaN logits are
treated as -inf, and a row with no finite logit becomes uniform (`nonfinite` counts
such positions, so that a model emitting NaN is noticed rather than decoded).

`sample_categorical` and `uniform` are the random draws of Algorithm 1. Both are exact
to float32 precision for every token, however rare: no draw is quantized to the 2^-23
grid of a float32 uniform (see `sample_categorical`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Finite stand-ins for +-inf: keep every exp() and every subtraction finite.
_LOGIT_MAX = 1e30


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How tokens are drawn from a model's logits (frozen, hashable: a jit static arg).

  Attributes:
    temperature: >= 0; 0 means greedy (one-hot argmax p and q).
    top_k: keep the k most probable tokens (None: all). Ties at the k-th value are
      kept, identically for p and q.
    top_p: nucleus sampling, keep the smallest set of most probable tokens whose mass
      reaches top_p, in (0, 1] (None or 1: all).
  """

  temperature: float = 1.0
  top_k: int | None = None
  top_p: float | None = None

  def __post_init__(self):
    # Python and numpy scalars alike; stored as Python numbers, so that equal
    # settings hash equal and share one compiled decode.
    t = self.temperature
    if (
      isinstance(t, (bool, np.bool_))
      or not isinstance(t, numbers.Real)
      or math.isnan(t)
      or math.isinf(t)
      or t < 0
    ):
      raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
    object.__setattr__(self, "temperature", float(t))
    k = self.top_k
    if k is not None:
      if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"top_k must be None or an int >= 1, got {k!r}")
      object.__setattr__(self, "top_k", int(k))
    p = self.top_p
    if p is not None:
      if (
        isinstance(p, (bool, np.bool_))
        or not isinstance(p, numbers.Real)
        or math.isnan(p)
        or not 0.0 < p <= 1.0
      ):
        raise ValueError(f"top_p must be None or in (0, 1], got {p!r}")
      # top_p = 1 keeps every token: the same transform as None.
      object.__setattr__(self, "top_p", None if p == 1 else float(p))

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  def validate_vocab(self, vocab_size: int) -> None:
    """Raises ValueError if top_k exceeds the vocabulary."""
    if self.top_k is not None and self.top_k > vocab_size:
      raise ValueError(f"top_k must be <= the vocabulary size {vocab_size}, got {self.top_k}")

  def normalized(self, vocab_size: int) -> SamplingConfig:
    """The same transform in one canonical form: top_k = V keeps every token (None).

    The samplers compile once per canonical form, so top_k = V and None (like top_p
    = 1 and None, unified at construction) share one compiled decode.
    """
    self.validate_vocab(vocab_size)
    if self.top_k is not None and self.top_k == vocab_size:
      return dataclasses.replace(self, top_k=None)
    return self


def _sanitize(logits: Array) -> Array:
  """float32, NaN -> -max, +-inf -> +-max."""
  logits = logits.astype(jnp.float32)
  return jnp.nan_to_num(logits, nan=-_LOGIT_MAX, posinf=_LOGIT_MAX, neginf=-_LOGIT_MAX)


def _top_k_mask(logits: Array, k: int) -> Array:
  """True where a logit is among the k largest (ties with the k-th kept)."""
  kth = jax.lax.top_k(logits, k)[0][..., -1:]
  return logits >= kth


def _top_p_mask(probs: Array, top_p: float) -> Array:
  """True on the smallest prefix of most probable tokens whose mass reaches top_p.

  A token is kept when the mass strictly before it (in descending order) is below
  top_p, so the most probable token is always kept. Ties are resolved by value: all
  tokens with the same probability as the last kept one are kept.
  """
  sorted_probs = jnp.sort(probs, axis=-1)[..., ::-1]
  mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
  kept = mass_before < top_p
  # The smallest probability that is kept: the threshold, applied by value.
  threshold = jnp.min(jnp.where(kept, sorted_probs, jnp.inf), axis=-1, keepdims=True)
  return probs >= threshold


# Long vocabularies are handled in two levels, over blocks of BLOCK tokens and then
# within one block: a pass over all V values, then work on ~V / BLOCK + BLOCK values.
BLOCK = 128


def blocks(values: Array, fill: float) -> Array:
  """values [..., V] -> [..., ceil(V / BLOCK), BLOCK], padded at the end with `fill`."""
  size = values.shape[-1]
  num_blocks = -(-size // BLOCK)
  padding = num_blocks * BLOCK - size
  if padding:
    values = jnp.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, padding)], constant_values=fill)
  return values.reshape(values.shape[:-1] + (num_blocks, BLOCK))


def _take_block(values: Array, block: Array) -> Array:
  """values [..., N, BLOCK], block int32[...] -> values[..., block, :]."""
  return jnp.take_along_axis(values, block[..., None, None], axis=-2)[..., 0, :]


def _first_argmax_flat(values: Array) -> Array:
  size = values.shape[-1]
  top = jnp.max(values, axis=-1, keepdims=True)
  index = jnp.arange(size, dtype=jnp.int32)
  return jnp.min(jnp.where(values == top, index, size), axis=-1).astype(jnp.int32)


def first_argmax(values: Array) -> Array:
  """int32[...]: index of the first maximum along the last axis (as `jnp.argmax`).

  A max-reduce, a compare and a min-reduce of indices, which on XLA's CPU is faster
  than `jnp.argmax`'s variadic reduce; over a long axis in two levels (`blocks`): the
  maximum of each block (the one pass over all values), the first block holding the
  overall maximum, then the first maximum within that block -- the same index, at
  about half the cost at V = 32128, where it runs at every drafted and verified
  position. Values should be NaN-free (`greedy_tokens` sanitizes them).
  """
  if values.shape[-1] <= 2 * BLOCK:
    return _first_argmax_flat(values)
  grouped = blocks(values, -jnp.inf)  # -inf padding is never the first maximum.
  block = _first_argmax_flat(jnp.max(grouped, axis=-1))
  return block * BLOCK + _first_argmax_flat(_take_block(grouped, block))


def greedy_tokens(logits: Array) -> Array:
  """int32[...]: the temperature-0 token, the first argmax of the sanitized logits.

  The token that `probabilities(logits, SamplingConfig(0.0))` is one-hot at.
  """
  return first_argmax(_sanitize(logits))


def greedy_tokens_checked(logits: Array) -> tuple[Array, Array]:
  """(`greedy_tokens(logits)`, `nonfinite(logits)`) in one pass over the logits.

  The block maxima of the raw logits give both: their maximum is NaN, +inf or -inf
  exactly when `nonfinite` is True, and otherwise (and when it is above -1e30, the
  sanitized stand-in for -inf) the first argmax of the raw logits is that of the
  sanitized ones. A row whose maximum is -1e30 or below, or non-finite, takes
  `greedy_tokens`' sanitizing path instead (at exactly -1e30 a -inf before the
  maximum sanitizes to an equal, earlier value). The choice is per row: the
  sanitizing pass runs only when some row needs it (`lax.cond`, so the common case
  pays one pass where the two functions would pay two), and then replaces the tokens
  of those rows alone, so a row's token never depends on the other rows of its batch.

  On a CPU the same two results come from one kernel (`specdec.backends.cpu.
  greedy_checked`: a dozen XLA:CPU thunks become one, ~0.1 ms less per verification
  at V = 32,128); lowered for any other platform, this XLA version.
  """
  from specdec.backends import cpu

  return cpu.greedy_checked(logits.astype(jnp.float32), _greedy_tokens_checked_xla)


def _greedy_tokens_checked_xla(logits: Array) -> tuple[Array, Array]:
  if logits.shape[-1] <= 2 * BLOCK:
    return greedy_tokens(logits), nonfinite(logits)
  grouped = blocks(logits, -jnp.inf)
  block_max = jnp.max(grouped, axis=-1)
  top = jnp.max(block_max, axis=-1)
  bad = _bad(logits, top)

  block = _first_argmax_flat(block_max)
  raw = block * BLOCK + _first_argmax_flat(_take_block(grouped, block))
  # Per row: where the raw maximum is not above -1e30 (or not finite), sanitizing
  # can move the first argmax; elsewhere both paths give the same token.
  sanitize = bad | (top <= -_LOGIT_MAX)
  tokens = jax.lax.cond(
    jnp.any(sanitize),
    lambda raw: jnp.where(sanitize, greedy_tokens(logits), raw),
    lambda raw: raw,
    raw,
  )
  return tokens, bad


def probabilities(logits: Array, sampling: SamplingConfig) -> Array:
  """The sampling distribution for `logits` [..., V] under `sampling`, float32.

  Greedy (temperature 0) is one-hot at the first argmax. Otherwise
  softmax(logits / temperature) restricted to top-k then top-p and renormalised.
  """
  logits = _sanitize(logits)
  if sampling.greedy:
    return jax.nn.one_hot(first_argmax(logits), logits.shape[-1], dtype=jnp.float32)
  return _shifted_probabilities(logits, jnp.max(logits, axis=-1, keepdims=True), sampling)


def probabilities_checked(logits: Array, sampling: SamplingConfig) -> tuple[Array, Array]:
  """(`probabilities(logits, sampling)`, `nonfinite(logits)`) at temperature > 0, with
  one max-reduction over the logits where the two functions would take two: the raw
  logits' maximum is that of the sanitized ones unless `nonfinite` (or it is below
  -1e30), in which case that row's maximum is recomputed from the sanitized logits
  (per row, under one `lax.cond` that skips the pass when no row needs it)."""
  raw = logits.astype(jnp.float32)
  top = jnp.max(raw, axis=-1, keepdims=True)
  bad = _bad(raw, top[..., 0])
  logits = _sanitize(raw)
  sanitize = (bad | (top[..., 0] < -_LOGIT_MAX))[..., None]
  top = jax.lax.cond(
    jnp.any(sanitize),
    lambda top: jnp.where(sanitize, jnp.max(logits, axis=-1, keepdims=True), top),
    lambda top: top,
    top,
  )
  return _shifted_probabilities(logits, top, sampling), bad


def _shifted_probabilities(logits: Array, top: Array, sampling: SamplingConfig) -> Array:
  """`probabilities` at temperature > 0 of sanitized logits whose max is `top`."""
  # Shift the max to 0 first, so a temperature that underflows float32 sends every
  # other logit to -inf instead of computing 0 / 0.
  logits = logits - top
  temperature = max(sampling.temperature, float(jnp.finfo(jnp.float32).tiny))
  logits = jnp.clip(logits / temperature, -_LOGIT_MAX, _LOGIT_MAX)
  if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
    logits = jnp.where(_top_k_mask(logits, sampling.top_k), logits, -jnp.inf)
  # The max is now exactly 0 (top-k keeps it): softmax without another max pass.
  unnormalized = jnp.exp(logits)
  probs = unnormalized / jnp.sum(unnormalized, axis=-1, keepdims=True)
  if sampling.top_p is not None and sampling.top_p < 1.0:
    probs = jnp.where(_top_p_mask(probs, sampling.top_p), probs, 0.0)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  return probs


def nonfinite(logits: Array) -> Array:
  """bool[...]: positions of logits [..., V] that are not a valid distribution.

  True where any logit is NaN or +inf, or where no logit is finite. -inf alone is a
  legitimate mask (a token the model rules out) and is not counted. Such positions
  are decoded anyway (`probabilities` never returns NaN); the samplers count them in
  their stats so that a broken model is noticed.
  """
  logits = logits.astype(jnp.float32)
  return _bad(logits, jnp.max(logits, axis=-1))


def _bad(logits: Array, top: Array) -> Array:
  """`nonfinite` given top = jnp.max(logits, axis=-1): +inf if any logit is, -inf if
  all are. NaN is tested on its own: XLA's max-reduce propagates NaN by definition,
  but XLA:CPU's vectorized one skips it over long rows (measured: the max of 32,128
  zeros and one NaN is 0.0), which would leave a NaN logit uncounted."""
  return ~jnp.isfinite(top) | jnp.any(jnp.isnan(logits), axis=-1)


# ----------------------------------------------------------------------------- draws


def _gumbel(key: Array, shape: tuple[int, ...]) -> Array:
  """Standard Gumbel noise, float32, accurate in both tails.

  `mode="highest"` builds each draw from 64 random bits in fixed point and uses
  log1p where it matters, so the noise is correct to float32 precision out to about
  +-44 (probabilities down to ~1e-19) instead of being cut off at the 2^-23 grid of
  a float32 uniform (about +16.6 / -4.5).
  """
  return jax.random.gumbel(key, shape, jnp.float32, mode="highest")


def uniform(key: Array, shape: tuple[int, ...]) -> Array:
  """float32 U(0, 1) draws with full relative precision near 0.

  exp(-exp(-G)) for G ~ Gumbel(0, 1) (the Gumbel CDF of a Gumbel draw): P(u < a) = a
  to float32 precision for every a >= ~1e-19, where `jax.random.uniform`'s values
  are multiples of 2^-23 (so P(u < a) = 2^-23 for any 0 < a < 2^-23). Algorithm 1's
  test r < p(x)/q(x) needs this when p(x) << q(x).
  """
  return jnp.exp(-jnp.exp(-_gumbel(key, shape)))


def _sample_row(key: Array, probs: Array) -> Array:
  """One token from float32 probs [V] (unnormalized is fine). int32[]."""
  size = probs.shape[-1]
  log = lambda x: jnp.log(jnp.maximum(x, 0.0))  # log(0) = -inf: never drawn
  if size <= 2 * BLOCK:
    return _first_argmax_flat(log(probs) + _gumbel(key, (size,)))
  grouped = blocks(probs, 0.0)
  mass = jnp.sum(grouped, axis=-1)
  # One call for both levels' noise: distinct draws, so independent levels.
  noise = _gumbel(key, (mass.shape[0] + BLOCK,))
  block = _first_argmax_flat(log(mass) + noise[:-BLOCK])
  within = _first_argmax_flat(log(grouped[block]) + noise[-BLOCK:])
  return block * BLOCK + within


def sample_categorical(keys: Array, probs: Array) -> Array:
  """One token per row: keys [B] (one PRNG key per row), probs float32[B, V] -> int32[B].

  Exact to float32 precision for every token. Gumbel-max (argmax of log p + G, as
  `jax.random.categorical`, T5X and Gemma sample) in two independent levels: a block
  of `BLOCK` tokens with probability m_b / sum(m), m_b its summed probability, then a
  token of that block with probability p_i / m_b. The product is p_i / sum(p) up to
  the float32 rounding of the block sums (relative error ~1e-7, at most 127 ulp) and
  of log p + G (~1e-6 relative), for tokens of any size down to ~1e-19 of their block
  (`_gumbel`'s range) -- where inverting a CDF with one float32 uniform rounds every
  token to a multiple of 2^-23 and never draws most tokens below it. Zero-probability
  tokens have key -inf and are never drawn, on any backend (no cumulative sums, whose
  order of summation differs between CPU, GPU and TPU). Random bits: ~V / BLOCK +
  BLOCK Gumbels per draw instead of V, and no search loops.
  """
  return jax.vmap(_sample_row)(keys, probs.astype(jnp.float32))
