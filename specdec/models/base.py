"""The `DecodeModel` protocol that the samplers call, and a cacheless adapter.

A model is a JAX pytree (its parameters are leaves, its configuration is static
metadata), so the samplers can take it as an ordinary argument of `jax.jit` and a
user's `pjit` can shard its parameters. The samplers see a model only through the
five methods below; everything model-specific (encoder, caches, positions) lives in
the opaque `state` pytree that `init` returns.

Positions. A model's state holds the tokens fed so far; `lengths(state)[b]` is how
many row `b` holds. Decoding starts from `start_tokens(inputs)`, the one token per row
whose logits predict the first new token and which `init` has *not* fed yet (the
decoder start token 0 for T5, the prompt's last token for a causal LM). Every `extend`
appends a chunk at each row's own position; `rewind` moves rows back independently.
Cache slots past a row's length are stale: they are overwritten by the next `extend`
and must never be attended to.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any, Protocol, runtime_checkable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
State = Any


@runtime_checkable
class DecodeModel(Protocol):
  """What `speculative_sample` and `autoregressive_sample` need of Mp and Mq.

  Attributes:
    vocab_size: V, the size of the logits' last axis (a field or a property).
  """

  @property
  def vocab_size(self) -> int: ...

  def init(self, inputs: Array, max_length: int) -> State:
    """Prepares a decode of `inputs` [B, S] that will feed `max_length` more tokens.

    Runs whatever is done once per input (a T5 encoder, a causal LM's prompt minus its
    last token) and allocates caches. Raises `ValueError` naming `max_length` when the
    model cannot hold that many more positions.
    """
    ...

  def start_tokens(self, inputs: Array) -> Array:
    """int32[B]: the token fed first, whose logits predict the first new token."""
    ...

  def extend(self, state: State, tokens: Array) -> tuple[Array, State]:
    """Feeds `tokens` [B, k] at each row's own position, causally within the chunk.

    Returns `(logits [B, k, V], new_state)`; `logits[:, j]` predicts the token after
    `tokens[:, j]`. Any float dtype; the samplers convert to float32.
    """
    ...

  def rewind(self, state: State, lengths: Array) -> State:
    """Rolls each row `b` back to `lengths[b]` fed tokens (never forward)."""
    ...

  def lengths(self, state: State) -> Array:
    """int32[B]: tokens fed so far per row (the prompt included)."""
    ...


@runtime_checkable
class ShortlistLogits(Protocol):
  """An optional capability of a `DecodeModel` whose logits are -inf off a fixed list
  of N ids (a shortlist draft, `specdec.drafts.shortlist`).

  `extend_shortlist` is `extend` without writing the logits back into the V-wide
  vocabulary: `extend`'s logits[..., shortlist_ids[n]] == its logits[..., n]. A greedy
  draft step then takes its argmax over N logits and maps it through `shortlist_ids`
  (`ModelProposer` does) instead of scattering into V and reading V. Ties break to the
  first position of the list, so with ascending ids the token is `extend`'s argmax.

  Attributes:
    shortlist_ids: int32[N], the full-vocabulary id of each shortlist position.
  """

  shortlist_ids: Any

  def extend_shortlist(self, state: State, tokens: Array) -> tuple[Array, State]:
    """tokens: int[B, k] -> (float32 logits [B, k, N] of `shortlist_ids`, new state)."""
    ...


@flax.struct.dataclass
class CausalLMState:
  """Decode state of `CausalLM`.

  Attributes:
    tokens: int32[B, T_max], every token fed so far per row (prompt first); slots at
      or past `lengths[b]` are stale.
    lengths: int32[B], tokens fed so far per row.
  """

  tokens: Array
  lengths: Array


def check_tokens(name: str, tokens: Any, vocab_size: int | None = None) -> None:
  """Raises naming `name` unless `tokens` is an int array [batch, length] whose ids,
  when concrete and `vocab_size` is given, are in [0, vocab_size)."""
  if not hasattr(tokens, "ndim") or tokens.ndim != 2:
    raise ValueError(
      f"{name} must be an int array [batch, length], got "
      f"{getattr(tokens, 'shape', type(tokens).__name__)}"
    )
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise TypeError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
  if vocab_size is not None:
    check_token_ids(name, tokens, vocab_size)


def check_token_ids(name: str, tokens: Any, vocab_size: int) -> None:
  """Raises ValueError naming `name` if concrete `tokens` hold an id outside [0, V).

  Traced tokens (inside `jax.jit`) cannot be checked; models clip them into range
  before any lookup, so that they never turn into NaN logits. Checking a concrete
  device array reads back its min and max (one small transfer); the samplers check
  their inputs once, before tracing the models.
  """
  if isinstance(tokens, jax.core.Tracer) or not np.size(tokens):
    return
  # One read-back of the (small) ids and the reduction on the host: no program to
  # compile per input shape, one sync before the decode starts.
  host = np.asarray(tokens)
  low, high = int(host.min()), int(host.max())
  if low < 0 or high >= vocab_size:
    raise ValueError(
      f"{name} holds token ids outside the vocabulary [0, {vocab_size}): ids in [{low}, {high}]"
    )


def check_chunk(tokens: Any, batch: int, capacity: int) -> None:
  """Raises naming `tokens` unless the chunk [B, k] fits a state of `batch` rows and
  a cache of `capacity` positions (1 <= k <= capacity)."""
  if tokens.shape[0] != batch:
    raise ValueError(f"tokens has batch {tokens.shape[0]}, the state has {batch}")
  if not 1 <= tokens.shape[1] <= capacity:
    raise ValueError(
      f"tokens: a chunk of {tokens.shape[1]} tokens must be in [1, "
      f"{capacity}], the cache init(max_length) allocated"
    )


def rewound(current: Array, lengths: Any) -> Array:
  """int32[B]: min(current, lengths) per row, `DecodeModel.rewind`'s new lengths;
  raises naming `lengths` unless it has the shape of `current`."""
  lengths = jnp.asarray(lengths)
  if lengths.shape != current.shape:
    raise ValueError(f"lengths must have shape {current.shape}, got {lengths.shape}")
  return jnp.minimum(current, lengths.astype(jnp.int32))


# The shortest prefix a decoder-only model's prefill feeds on its own.
PREFILL_BUCKET = 64


def prefill_buckets(n: int) -> tuple[int, ...]:
  """The prefix lengths `bucketed_prefill` chooses among for n positions:
  PREFILL_BUCKET, twice that, ... below n, then n."""
  out, m = [], PREFILL_BUCKET
  while m < n:
    out.append(m)
    m *= 2
  return tuple(out) + (n,)


def bucketed_prefill(
  feed: Callable[[Array, Any], Any], tokens: Array, needed: Array, caches: Any
) -> Any:
  """`feed(tokens[:, :m], caches)` (a prefill from position 0, returning the caches)
  for m the shortest of `prefill_buckets(n)` that is >= `needed` (a traced int: the
  positions the longest row needs), chosen by `lax.switch` inside the compiled
  program. Right padding past that prefix is never computed, so a batch padded to a
  fixed length S (as T5X pads its features) costs about what its longest prompt does;
  the slots past it stay as they were (stale, masked until `extend` writes them).
  (`lax.switch` clamps the index, so `needed` past n takes the whole of `tokens`.)"""
  buckets = prefill_buckets(tokens.shape[1])
  branches = [lambda caches, m=m: feed(tokens[:, :m], caches) for m in buckets]
  index = jnp.searchsorted(jnp.asarray(buckets, jnp.int32), jnp.asarray(needed, jnp.int32))
  return jax.lax.switch(index, branches, caches)


def write_rows(buffer: Array, chunk: Array, starts: Array) -> Array:
  """buffer[b, starts[b]:starts[b]+k] = chunk[b] for every row b."""
  return jax.vmap(lambda row, c, s: jax.lax.dynamic_update_slice(row, c, (s,)))(
    buffer, chunk, starts
  )


def _read_rows(values: Array, starts: Array, k: int) -> Array:
  """values[b, starts[b]:starts[b]+k] for every row b; values is [B, T, ...]."""

  def one(row, s):
    return jax.lax.dynamic_slice_in_dim(row, s, k, axis=0)

  return jax.vmap(one)(values, starts)


@flax.struct.dataclass
class CausalLM:
  """A cacheless decoder-only model from any causal `logits_fn`.

  Every `extend` recomputes `logits_fn` over the whole (fixed-size) token buffer and
  reads the chunk's rows out of it: slow, but exact and simple, which is what tests
  and toy models want. `logits_fn(tokens[B, T]) -> logits[B, T, V]` must be causal
  (logits at t depend on tokens 0..t only, and predict token t+1); the tokens it sees
  past a row's length are arbitrary.

  Build one with `CausalLM.from_fn`. Inputs are prompts `int32[B, T]` of at least one
  token each (all rows the same length).

  Attributes:
    logits_fn: the causal logits function (static; hashed by identity).
    vocab_size: V.
    max_length: the most positions (prompt + new tokens) it may hold, or None.
    params: optional pytree passed as `logits_fn(tokens, params)` when not None, so
      that a model's weights are jit arguments rather than constants.
  """

  logits_fn: Callable[..., Array] = flax.struct.field(pytree_node=False)
  vocab_size: int = flax.struct.field(pytree_node=False)
  max_length: int | None = flax.struct.field(pytree_node=False, default=None)
  params: Any = None

  @classmethod
  def from_fn(
    cls,
    logits_fn: Callable[..., Array],
    vocab_size: int,
    max_length: int | None = None,
    params: Any = None,
  ) -> CausalLM:
    """Wraps `logits_fn(tokens[B, T]) -> logits[B, T, V]` (or `(tokens, params)`)."""
    if not callable(logits_fn):
      raise TypeError(f"logits_fn must be callable, got {type(logits_fn).__name__}")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
      raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
      raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
    return cls(logits_fn=logits_fn, vocab_size=vocab_size, max_length=max_length, params=params)

  def _logits(self, tokens: Array) -> Array:
    if self.params is None:
      return self.logits_fn(tokens)
    return self.logits_fn(tokens, self.params)

  def init(self, inputs: Array, max_length: int) -> CausalLMState:
    check_token_ids("inputs", inputs, self.vocab_size)
    batch, prompt_len = inputs.shape
    total = prompt_len + max_length
    if self.max_length is not None and total > self.max_length:
      raise ValueError(
        f"max_length: the prompt ({prompt_len} tokens) plus {max_length} new positions "
        f"needs {total} positions, but this model holds at most {self.max_length}"
      )
    buffer = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_len].set(inputs.astype(jnp.int32))
    return CausalLMState(tokens=buffer, lengths=jnp.full((batch,), prompt_len - 1, jnp.int32))

  def start_tokens(self, inputs: Array) -> Array:
    return inputs[:, -1].astype(jnp.int32)

  def extend(self, state: CausalLMState, tokens: Array) -> tuple[Array, CausalLMState]:
    check_token_ids("tokens", tokens, self.vocab_size)
    k = tokens.shape[1]
    buffer = write_rows(state.tokens, tokens.astype(jnp.int32), state.lengths)
    logits = _read_rows(self._logits(buffer), state.lengths, k)
    return logits, CausalLMState(tokens=buffer, lengths=state.lengths + k)

  def rewind(self, state: CausalLMState, lengths: Array) -> CausalLMState:
    return dataclasses.replace(state, lengths=rewound(state.lengths, lengths))

  def lengths(self, state: CausalLMState) -> Array:
    return state.lengths
