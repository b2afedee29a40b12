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

`OutputShortlist` restricts only the output layer: its inner model reads the full
vocabulary and computes logits for the N ids alone (a T5 draft whose
`decoder/logits_dense` kernel keeps the N columns of the list, `t5_output_shortlist`):
the same q as the full draft conditioned on the list, at N / V of the output layer's
cost, with no retraining.

Both declare `specdec.models.base.ShortlistLogits`: at temperature 0 a draft step
takes its argmax over the N logits (`ModelProposer`), and only a sampled step writes
them back into the V-wide vocabulary (`expand_logits`), since the residual
norm(max(0, p - q)) needs q everywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import traverse_util
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from specdec.models import base, llama

Array = jax.Array


def index_map(ids: ArrayLike, vocab_size: int) -> np.ndarray:
  """int32[V]: each full-vocabulary id's shortlist position, N (OTHER) off the list.

  Raises:
    ValueError: `ids` empty, repeated or outside [0, vocab_size).
  """
  ids = np.asarray(ids)
  if ids.ndim != 1 or not ids.size or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(
      f"shortlist ids must be a non-empty 1-D int array, got {ids.dtype}{list(ids.shape)}"
    )
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(
      f"shortlist ids must be in [0, {vocab_size}), got ids in [{ids.min()}, {ids.max()}]"
    )
  if len(np.unique(ids)) != len(ids):
    raise ValueError("shortlist ids must not repeat")
  index = np.full((vocab_size,), len(ids), np.int32)
  index[ids] = np.arange(len(ids), dtype=np.int32)
  return index


def expand_logits(logits: Array, ids: Array, vocab_size: int) -> Array:
  """Shortlist logits [..., N + 1] (OTHER last) -> float32 [..., V]: -inf off the
  list (`specdec.distributions` gives -inf probability 0, never NaN)."""
  full = jnp.full(logits.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
  return full.at[..., ids].set(logits[..., : ids.shape[0]].astype(jnp.float32))


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
  def create(
    cls, inner: llama.Llama, ids: ArrayLike, vocab_size: int, pad_id: int | None = None
  ) -> Shortlist:
    """Checks and builds: `inner` over len(ids) + 1 ids, `pad_id` on the list."""
    index = index_map(ids, vocab_size)
    n = len(np.asarray(ids))
    if inner.vocab_size != n + 1:
      raise ValueError(
        f"inner: a shortlist of {n} ids needs a model over {n + 1} ids "
        f"(the last one OTHER), got vocab_size {inner.vocab_size}"
      )
    inner_pad = None
    if pad_id is not None:
      if not 0 <= pad_id < vocab_size or index[pad_id] == n:
        raise ValueError(
          f"pad_id {pad_id} must be a shortlist id (prompts are right-padded with it)"
        )
      inner_pad = int(index[pad_id])
    return cls(
      inner=dataclasses.replace(inner, pad_id=inner_pad),
      ids=jnp.asarray(np.asarray(ids, np.int32)),
      index=jnp.asarray(index),
      pad_id=pad_id,
    )

  @property
  def vocab_size(self) -> int:
    return int(self.index.shape[0])

  @property
  def shortlist_size(self) -> int:
    return int(self.ids.shape[0])

  @property
  def shortlist_ids(self) -> Array:
    return self.ids

  def with_packed_weights(self) -> Shortlist:
    """`llama.Llama.with_packed_weights` of the inner model."""
    return dataclasses.replace(self, inner=self.inner.with_packed_weights())

  def _map(self, name: str, tokens: Array) -> Array:
    base.check_tokens(name, tokens, self.vocab_size)
    return jnp.take(self.index, jnp.asarray(tokens), axis=0, mode="clip")

  def start_tokens(self, inputs: Array) -> Array:
    """int32[B]: each row's last prompt token (full-vocabulary ids)."""
    last = self.inner.prompt_lengths(self._map("inputs", inputs)) - 1
    return jnp.take_along_axis(jnp.asarray(inputs), last[:, None], axis=1)[:, 0].astype(jnp.int32)

  def init(self, inputs: Array, max_length: int) -> llama.LlamaState:
    return self.inner.init(self._map("inputs", inputs), max_length)

  def extend(self, state: llama.LlamaState, tokens: Array) -> tuple[Array, llama.LlamaState]:
    """tokens: int[B, k] (full ids) -> (float32 logits [B, k, V], new state)."""
    logits, state = self.extend_shortlist(state, tokens)
    return expand_logits(logits, self.ids, self.vocab_size), state

  def extend_shortlist(
    self, state: llama.LlamaState, tokens: Array
  ) -> tuple[Array, llama.LlamaState]:
    """tokens: int[B, k] (full ids) -> (float32 logits [B, k, N] of `ids`, OTHER's
    left out; new state)."""
    logits, state = self.inner.extend(state, self._map("tokens", tokens))
    return logits[..., : self.shortlist_size].astype(jnp.float32), state

  def rewind(self, state: llama.LlamaState, lengths: Array) -> llama.LlamaState:
    return self.inner.rewind(state, lengths)

  def lengths(self, state: llama.LlamaState) -> Array:
    return self.inner.lengths(state)


@flax.struct.dataclass
class OutputShortlist:
  """A `DecodeModel` over V from a model that reads V ids and whose logits cover only
  the N ids of a shortlist (`inner.extend` gives [B, k, N]): its logits written back
  into V, -inf off the list.

  Attributes:
    inner: a `DecodeModel` whose `vocab_size` is V (its inputs) and whose logits'
      last axis is N (e.g. `t5_output_shortlist`).
    ids: int32[N], the full-vocabulary id of each logit of `inner`.
  """

  inner: Any
  ids: Any

  @classmethod
  def create(cls, inner: Any, ids: ArrayLike) -> OutputShortlist:
    """Checks `ids` against `inner.vocab_size` (`index_map`) and builds."""
    index_map(ids, inner.vocab_size)
    return cls(inner=inner, ids=jnp.asarray(np.asarray(ids, np.int32)))

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  @property
  def shortlist_ids(self) -> Array:
    return self.ids

  def with_packed_weights(self) -> OutputShortlist:
    """The inner model's `with_packed_weights`."""
    return dataclasses.replace(self, inner=self.inner.with_packed_weights())

  def init(self, inputs: Array, max_length: int) -> Any:
    return self.inner.init(inputs, max_length)

  def start_tokens(self, inputs: Array) -> Array:
    return self.inner.start_tokens(inputs)

  def extend(self, state: Any, tokens: Array) -> tuple[Array, Any]:
    """tokens: int[B, k] -> (float32 logits [B, k, V], new state)."""
    logits, state = self.extend_shortlist(state, tokens)
    return expand_logits(logits, self.ids, self.vocab_size), state

  def extend_shortlist(self, state: Any, tokens: Array) -> tuple[Array, Any]:
    """tokens: int[B, k] -> (float32 logits [B, k, N] of `ids`, new state)."""
    logits, state = self.inner.extend(state, tokens)
    if logits.shape[-1] != self.ids.shape[0]:
      raise ValueError(
        f"inner: logits over {logits.shape[-1]} ids, the shortlist has {self.ids.shape[0]}"
      )
    return logits.astype(jnp.float32), state

  def rewind(self, state: Any, lengths: Array) -> Any:
    return self.inner.rewind(state, lengths)

  def lengths(self, state: Any) -> Array:
    return self.inner.lengths(state)


def t5_output_shortlist(model: Any, ids: ArrayLike) -> OutputShortlist:
  """An untied (v1.1) `t5.T5` restricted to the logits of `ids`: its
  `decoder/logits_dense` kernel [E, V] cut to the N columns of the list
  (`T5Config.output_vocab_size` = N); the encoder, embedding and decoder layers
  unchanged. Each kept logit is the full model's, computed by the same product over
  fewer columns, so q is the full draft's distribution conditioned on the list.
  Packed weights (`T5.with_packed_weights`) are packed again for the cut kernel.

  Raises:
    ValueError: a tied (v1.0) model, or `ids` not valid for its vocabulary.
  """
  from specdec.models import t5

  if not isinstance(model, t5.T5) or model.config.logits_via_embedding:
    raise ValueError("t5_output_shortlist needs an untied (v1.1) t5.T5 model")
  index_map(ids, model.vocab_size)
  cols = np.asarray(ids, np.int32)
  flat = traverse_util.flatten_dict(model.params, sep="/")
  name = "decoder/logits_dense/kernel"
  flat[name] = jnp.take(jnp.asarray(flat[name]), jnp.asarray(cols), axis=1)
  params = traverse_util.unflatten_dict(flat, sep="/")
  cfg = dataclasses.replace(model.config, output_vocab_size=len(cols))
  inner = dataclasses.replace(model, config=cfg, params=params, packed=None)
  if model.packed is not None:
    inner = inner.with_packed_weights()
  return OutputShortlist.create(inner, cols)
