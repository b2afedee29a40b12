"""A draft whose output layer covers a shortlist of the target's vocabulary.

A small draft for a large-vocabulary target spends most of each step in its output
layer: SmolLM2's 49152 rows at width 256 are 12.6M multiply-adds per token, several
times a two-layer body. Algorithm 1 of Leviathan et al. (2023) holds for *any* draft
distribution q, including one that gives probability 0 to most tokens: such tokens
are never drafted, and when the target samples them the residual
norm(max(0, p - q)) supplies exactly their probability (Appendix A.1). So a draft may
predict only the N tokens the target says most often and stay lossless; it loses
only the acceptance of the tokens it cannot propose.

`Shortlist` wraps a `llama.Llama` over N + 1 ids: the shortlist's N tokens and one
shared id OTHER = N for every other token of the target's vocabulary. Its inputs are
mapped to those ids (a token off the list is read as OTHER), and its logits are
written back into the target's vocabulary: the shortlist's N, -inf everywhere else
(OTHER's logit included, so q is the draft's distribution conditioned on the
shortlist).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec.models import base, llama

Array = jax.Array


def index_map(ids: Sequence[int], vocab_size: int) -> np.ndarray:
  """int32[V]: each full-vocabulary id's shortlist position, N (OTHER) off the list.

  Raises:
    ValueError: `ids` empty, repeated or outside [0, vocab_size).
  """
  ids = np.asarray(ids)
  if ids.ndim != 1 or not ids.size or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f'shortlist ids must be a non-empty 1-D int array, got '
                     f'{ids.dtype}{list(ids.shape)}')
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(f'shortlist ids must be in [0, {vocab_size}), got ids in '
                     f'[{ids.min()}, {ids.max()}]')
  if len(np.unique(ids)) != len(ids):
    raise ValueError('shortlist ids must not repeat')
  index = np.full((vocab_size,), len(ids), np.int32)
  index[ids] = np.arange(len(ids), dtype=np.int32)
  return index


def expand_logits(logits: Array, ids: Array, vocab_size: int) -> Array:
  """Shortlist logits [..., N + 1] (OTHER last) -> float32 [..., V]: -inf off the
  list (`specdec.distributions` gives -inf probability 0, never NaN)."""
  full = jnp.full(logits.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
  return full.at[..., ids].set(logits[..., :ids.shape[0]].astype(jnp.float32))


@flax.struct.dataclass
class Shortlist:
  """A `DecodeModel` over the target's vocabulary V from a Llama over N + 1 ids.

  Attributes:
    inner: a `llama.Llama` with vocab_size N + 1 (OTHER = N); its pad_id, if any, is
      the shortlist position of the outer `pad_id`.
    ids: int32[N], the full-vocabulary id of each shortlist position.
    index: int32[V], `index_map(ids, V)`.
    pad_id: (static) the right-padding id of ragged prompts in the full vocabulary
      (it must be on the list), or None.
  """

  inner: llama.Llama
  ids: Any
  index: Any
  pad_id: int | None = flax.struct.field(pytree_node=False, default=None)

  @classmethod
  def create(cls, inner: llama.Llama, ids: Sequence[int], vocab_size: int,
             pad_id: int | None = None) -> 'Shortlist':
    """Checks and builds: `inner` over len(ids) + 1 ids, `pad_id` on the list."""
    index = index_map(ids, vocab_size)
    n = len(np.asarray(ids))
    if inner.vocab_size != n + 1:
      raise ValueError(f'inner: a shortlist of {n} ids needs a model over {n + 1} ids '
                       f'(the last one OTHER), got vocab_size {inner.vocab_size}')
    inner_pad = None
    if pad_id is not None:
      if not 0 <= pad_id < vocab_size or index[pad_id] == n:
        raise ValueError(f'pad_id {pad_id} must be a shortlist id (prompts are '
                         'right-padded with it)')
      inner_pad = int(index[pad_id])
    return cls(inner=inner.replace(pad_id=inner_pad),
               ids=jnp.asarray(np.asarray(ids, np.int32)), index=jnp.asarray(index),
               pad_id=pad_id)

  @property
  def vocab_size(self) -> int:
    return int(self.index.shape[0])

  @property
  def shortlist_size(self) -> int:
    return int(self.ids.shape[0])

  def with_packed_weights(self) -> 'Shortlist':
    """`llama.Llama.with_packed_weights` of the inner model."""
    return self.replace(inner=self.inner.with_packed_weights())

  def _map(self, name: str, tokens: Array) -> Array:
    base.check_tokens(name, tokens, self.vocab_size)
    return jnp.take(self.index, jnp.asarray(tokens), axis=0, mode='clip')

  def start_tokens(self, inputs: Array) -> Array:
    """int32[B]: each row's last prompt token (full-vocabulary ids)."""
    last = self.inner.prompt_lengths(self._map('inputs', inputs)) - 1
    return jnp.take_along_axis(jnp.asarray(inputs), last[:, None], axis=1)[:, 0].astype(
        jnp.int32)

  def init(self, inputs: Array, max_length: int) -> llama.LlamaState:
    return self.inner.init(self._map('inputs', inputs), max_length)

  def extend(self, state: llama.LlamaState, tokens: Array
             ) -> tuple[Array, llama.LlamaState]:
    """tokens: int[B, k] (full ids) -> (float32 logits [B, k, V], new state)."""
    logits, state = self.inner.extend(state, self._map('tokens', tokens))
    return expand_logits(logits, self.ids, self.vocab_size), state

  def rewind(self, state: llama.LlamaState, lengths: Array) -> llama.LlamaState:
    return self.inner.rewind(state, lengths)

  def lengths(self, state: llama.LlamaState) -> Array:
    return self.inner.lengths(state)
