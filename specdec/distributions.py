"""Logits to sampling distributions: temperature, top-k, nucleus (top-p), greedy.

Section 2.3 of Leviathan et al. (2023): speculative sampling stays exact for any
sampling scheme that is a transform of the model's distribution, provided the *same*
transform is applied to p (target) and q (draft) before Algorithm 1 runs. This module
is that transform. Temperature is applied first, then top-k, then top-p; temperature
0 is greedy decoding, i.e. a one-hot distribution at the argmax. Everything is
computed in float32 whatever the logits' dtype, and never returns NaN: NaN logits are
treated as -inf, and a row with no finite logit becomes uniform.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp

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
  top_k: Optional[int] = None
  top_p: Optional[float] = None

  def __post_init__(self):
    t = self.temperature
    if (isinstance(t, bool) or not isinstance(t, (int, float))
        or math.isnan(t) or math.isinf(t) or t < 0):
      raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
    k = self.top_k
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
      raise ValueError(f"top_k must be None or an int >= 1, got {k!r}")
    p = self.top_p
    if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float))
                          or math.isnan(p) or not 0.0 < p <= 1.0):
      raise ValueError(f"top_p must be None or in (0, 1], got {p!r}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  def validate_vocab(self, vocab_size: int) -> None:
    """Raises ValueError if top_k exceeds the vocabulary."""
    if self.top_k is not None and self.top_k > vocab_size:
      raise ValueError(
          f"top_k must be <= the vocabulary size {vocab_size}, got {self.top_k}")


def _sanitize(logits: Array) -> Array:
  """float32, NaN -> -max, +-inf -> +-max."""
  logits = logits.astype(jnp.float32)
  return jnp.nan_to_num(logits, nan=-_LOGIT_MAX, posinf=_LOGIT_MAX,
                        neginf=-_LOGIT_MAX)


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


_ARGMAX_BLOCK = 128


def _first_argmax_flat(values: Array) -> Array:
  size = values.shape[-1]
  top = jnp.max(values, axis=-1, keepdims=True)
  index = jnp.arange(size, dtype=jnp.int32)
  return jnp.min(jnp.where(values == top, index, size), axis=-1).astype(jnp.int32)


def first_argmax(values: Array) -> Array:
  """int32[...]: index of the first maximum along the last axis (as `jnp.argmax`).

  A max-reduce, a compare and a min-reduce of indices, which on XLA's CPU is faster
  than `jnp.argmax`'s variadic reduce; over a long axis in two levels: the maximum of
  each block of 128 (the one pass over all values), the first block holding the
  overall maximum, then the first maximum within that block -- the same index, at
  about half the cost at V = 32128, where it runs at every drafted and verified
  position. Values should be NaN-free (`greedy_tokens` sanitizes them).
  """
  size = values.shape[-1]
  if size <= 2 * _ARGMAX_BLOCK:
    return _first_argmax_flat(values)
  num_blocks = -(-size // _ARGMAX_BLOCK)
  padding = num_blocks * _ARGMAX_BLOCK - size
  if padding:  # -inf after the last value: never the first maximum.
    values = jnp.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, padding)],
                     constant_values=-jnp.inf)
  blocks = values.reshape(values.shape[:-1] + (num_blocks, _ARGMAX_BLOCK))
  block = _first_argmax_flat(jnp.max(blocks, axis=-1))
  chosen = jnp.take_along_axis(blocks, block[..., None, None], axis=-2)[..., 0, :]
  return block * _ARGMAX_BLOCK + _first_argmax_flat(chosen)


def greedy_tokens(logits: Array) -> Array:
  """int32[...]: the temperature-0 token, the first argmax of the sanitized logits.

  The token that `probabilities(logits, SamplingConfig(0.0))` is one-hot at.
  """
  return first_argmax(_sanitize(logits))


def probabilities(logits: Array, sampling: SamplingConfig) -> Array:
  """The sampling distribution for `logits` [..., V] under `sampling`, float32.

  Greedy (temperature 0) is one-hot at the first argmax. Otherwise
  softmax(logits / temperature) restricted to top-k then top-p and renormalised.
  """
  logits = _sanitize(logits)
  if sampling.greedy:
    return jax.nn.one_hot(first_argmax(logits), logits.shape[-1], dtype=jnp.float32)
  # Shift the max to 0 first, so a temperature that underflows float32 sends every
  # other logit to -inf instead of computing 0 / 0.
  logits = logits - jnp.max(logits, axis=-1, keepdims=True)
  temperature = max(sampling.temperature, float(jnp.finfo(jnp.float32).tiny))
  logits = jnp.clip(logits / temperature, -_LOGIT_MAX, _LOGIT_MAX)
  if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
    logits = jnp.where(_top_k_mask(logits, sampling.top_k), logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  if sampling.top_p is not None and sampling.top_p < 1.0:
    probs = jnp.where(_top_p_mask(probs, sampling.top_p), probs, 0.0)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  return probs
