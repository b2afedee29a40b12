"""A draft that also copies from its own context: n-gram lookup over prompt and output.

Algorithm 1 of Leviathan et al. (2023) is lossless for *any* draft distribution q
(Appendix A.1); the paper's Table 3 already uses non-neural drafts (unigram and
bigram models). Much of what a chat model writes repeats its context: names and
phrases of the article it summarizes, the sentence it continues, its own earlier
words. Prompt lookup (Saxena, "Prompt Lookup Decoding", 2023; Yang et al., "Inference
with Reference", arXiv:2304.04487) proposes, at each position, the token that
followed the most recent earlier occurrence of the context's last n tokens.

`ContextLookup` wraps any draft `DecodeModel` and turns that proposal into part of
its distribution:

    q = weight * onehot(x_lookup) + (1 - weight) * q_inner     where a match exists,
    q = q_inner                                                 elsewhere,

with n from `max_ngram` down to `min_ngram` (the longest suffix that recurs wins).
It returns the logits log q, so the sampler's temperature, top-k and top-p act on
this mixture as on any draft's logits: at temperature 0 the draft proposes x_lookup
whenever `weight` > 1/2 (the mixture's mass there exceeds every other token's), and
at temperature 1 q is the mixture itself. Whatever q comes out, the sampler draws
from it and uses it in the acceptance test, so the output distribution stays the
target's.

The wrapper keeps the tokens fed so far in a [B, S - 1 + max_length] buffer beside
the inner model's state; `extend` writes only the chunk's slots, `rewind` only moves
the lengths (slots past a row's length are never read).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec.models import base

Array = jax.Array


@flax.struct.dataclass
class LookupState:
  """inner: the wrapped model's state; history: int32[B, T] tokens fed so far (row b's
  first lengths[b] are valid); lengths: int32[B]."""

  inner: Any
  history: Array
  lengths: Array


def lookup_proposals(
  history: Array, ends: Array, min_ngram: int, max_ngram: int
) -> tuple[Array, Array]:
  """The token after the most recent earlier occurrence of each context's suffix.

  Args:
    history: int32[B, T] tokens; row b's context at query j is history[b, :ends[b, j]].
    ends: int32[B, k] context lengths.
    min_ngram, max_ngram: suffix lengths tried, longest first.

  Returns:
    (tokens int32[B, k], found bool[B, k]): for the longest n in [min_ngram,
    max_ngram] with an earlier occurrence history[b, s:s + n] == history[b, e - n:e]
    at s <= e - n - 1, the token history[b, s + n] of the largest such s; found False
    (token 0) where no n matches.
  """
  _, length = history.shape
  starts = jnp.arange(length)

  def one(h: Array, e: Array) -> tuple[Array, Array]:
    token, found = jnp.int32(0), jnp.bool_(False)
    for n in range(min_ngram, max_ngram + 1):  # Longest last: it overrides.
      suffix = jax.lax.dynamic_slice(h, (jnp.maximum(e - n, 0),), (n,))
      match = (starts <= e - n - 1) & (e >= n + 1)
      for i in range(n):
        shifted = jnp.roll(h, -i)  # shifted[s] = h[s + i]; s + i < e - 1 < T here.
        match &= shifted == suffix[i]
      s = jnp.max(jnp.where(match, starts, -1))
      hit = s >= 0
      token = jnp.where(hit, h[jnp.clip(s + n, 0, length - 1)], token)
      found = found | hit
    return token.astype(jnp.int32), found

  return jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, 0))(history, ends)


def mix_logits(logits: Array, tokens: Array, found: Array, weight: float) -> Array:
  """float32 log q [..., V] for q = weight * onehot(tokens) + (1 - weight) *
  softmax(logits) where `found`, softmax(logits) (as logits) elsewhere."""
  logits = logits.astype(jnp.float32)
  log_inner = jax.nn.log_softmax(logits, axis=-1)
  if weight >= 1.0:
    scaled = jnp.full_like(log_inner, -jnp.inf)
  else:
    scaled = log_inner + np.float32(np.log1p(-weight))
  at = jnp.take_along_axis(scaled, tokens[..., None], axis=-1)[..., 0]
  boosted = jnp.logaddexp(at, np.float32(np.log(weight)))
  mixed = jnp.where(
    jax.nn.one_hot(tokens, logits.shape[-1], dtype=jnp.bool_), boosted[..., None], scaled
  )
  return jnp.where(found[..., None], mixed, logits)


@flax.struct.dataclass
class ContextLookup:
  """A `DecodeModel`: `inner`'s distribution mixed with a context n-gram proposal.

  Attributes:
    inner: any draft `DecodeModel` (e.g. `shortlist.Shortlist`, `llama.Llama`).
    weight: (static) the proposal's mass in q where a suffix matches, in (0, 1]; above
      1/2 a greedy draft always takes the proposal.
    min_ngram, max_ngram: (static) suffix lengths tried, longest first.
  """

  inner: Any
  weight: float = flax.struct.field(pytree_node=False, default=0.8)
  min_ngram: int = flax.struct.field(pytree_node=False, default=2)
  max_ngram: int = flax.struct.field(pytree_node=False, default=4)

  @classmethod
  def create(
    cls, inner: Any, weight: float = 0.8, min_ngram: int = 2, max_ngram: int = 4
  ) -> ContextLookup:
    """Checks the arguments and builds the wrapper.

    Raises:
      ValueError: naming `weight` outside (0, 1] or `min_ngram` / `max_ngram` not
        1 <= min_ngram <= max_ngram <= 16.
    """
    if isinstance(weight, bool) or not 0.0 < float(weight) <= 1.0:
      raise ValueError(f"weight must be in (0, 1], got {weight!r}")
    for name, n in (("min_ngram", min_ngram), ("max_ngram", max_ngram)):
      if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= 16:
        raise ValueError(f"{name} must be an int in [1, 16], got {n!r}")
    if min_ngram > max_ngram:
      raise ValueError(f"min_ngram ({min_ngram}) must not exceed max_ngram ({max_ngram})")
    return cls(
      inner=inner, weight=float(weight), min_ngram=int(min_ngram), max_ngram=int(max_ngram)
    )

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  @property
  def pad_id(self) -> int | None:
    return getattr(self.inner, "pad_id", None)

  def with_packed_weights(self) -> ContextLookup:
    packed = getattr(self.inner, "with_packed_weights", None)
    return dataclasses.replace(self, inner=packed()) if packed is not None else self

  def start_tokens(self, inputs: Array) -> Array:
    return self.inner.start_tokens(inputs)

  def init(self, inputs: Array, max_length: int) -> LookupState:
    """The inner model's `init`, and the prompt as the first tokens of the history."""
    inner = self.inner.init(inputs, max_length)
    lengths = self.inner.lengths(inner).astype(jnp.int32)
    inputs = jnp.asarray(inputs, jnp.int32)
    batch, length = inputs.shape
    capacity = max(length - 1 + max_length, length)
    history = jnp.zeros((batch, capacity), jnp.int32).at[:, :length].set(inputs)
    return LookupState(inner=inner, history=history, lengths=lengths)

  def extend(self, state: LookupState, tokens: Array) -> tuple[Array, LookupState]:
    """tokens: int[B, k] -> (float32 log q [B, k, V], state advanced by k)."""
    logits, inner = self.inner.extend(state.inner, tokens)
    tokens = jnp.asarray(tokens, jnp.int32)
    k = tokens.shape[1]
    history = jax.vmap(lambda h, t, s: jax.lax.dynamic_update_slice(h, t, (s,)))(
      state.history, tokens, state.lengths
    )
    ends = state.lengths[:, None] + 1 + jnp.arange(k, dtype=jnp.int32)[None]
    proposal, found = lookup_proposals(history, ends, self.min_ngram, self.max_ngram)
    return (
      mix_logits(logits, proposal, found, self.weight),
      LookupState(inner=inner, history=history, lengths=state.lengths + k),
    )

  def rewind(self, state: LookupState, lengths: Array) -> LookupState:
    return LookupState(
      inner=self.inner.rewind(state.inner, lengths),
      history=state.history,
      lengths=base.rewound(state.lengths, lengths),
    )

  def lengths(self, state: LookupState) -> Array:
    return state.lengths
