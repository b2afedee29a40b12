"""T5 encoder-decoder in Flax, with a decode cache that verifies chunks.

The network is T5 (Raffel et al., "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", JMLR 2020): v1.0 (ReLU MLP, logits through the
shared embedding) and v1.1 (gated-GELU MLP, untied `logits_dense`). Its parameter tree,
logical axis names and `encode` / `decode` / `__call__` signatures are those of T5X's
`t5x/examples/t5/network.py`, so a T5X checkpoint's `target` tree loads with no
renaming and a T5X `EncoderDecoderModel` can take `Transformer` as its `module`.

Speculative decoding (Leviathan, Kalman & Matias, ICML 2023) needs more of the decoder
than T5X's single-token cache gives: the target scores gamma+1 tokens in one call
(Algorithm 1, "run Mp in parallel"), and rows of a batch accept different numbers of
tokens, so they sit at different positions. `T5` implements `DecodeModel` with

* the encoder run once per input and every decoder layer's encoder-decoder attention
  keys/values computed once, in `init`;
* a self-attention cache with one position per row, which `extend` advances by a chunk
  of k tokens (causal inside the chunk, relative-position bias rows for the chunk),
  writing only the chunk's k slots (a scatter, where T5X's one-hot write passes over
  the whole cache), and `rewind` moves back per row.

A chunk's logits equal single steps' up to float rounding, so greedy speculative
decoding reproduces the greedy decode except where the top two logits are closer
than that rounding (see `T5.extend` for the exact statement).

Attention logits and softmax are computed in float32 whatever the activation dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import operator
import re
from typing import Any

from flax import linen as nn, traverse_util
from flax.linen import partitioning as nn_partitioning
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec.backends import cpu
from specdec.models import base

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
Initializer = Callable[..., Array]

# T5's relative attention: 32 buckets, distances >= 128 share the last bucket (Raffel
# et al. 2020, section 2.1; T5X `Encoder`/`Decoder` use the same values).
NUM_BUCKETS = 32
MAX_DISTANCE = 128
LAYER_NORM_EPSILON = 1e-6
# Additive bias of a masked attention logit. Finite (as in T5X) so that a row whose
# keys are all masked, e.g. an all-padding input, gives uniform weights, not NaN.
MASKED_LOGIT_BIAS = -1e10
PAD_ID = 0
# T5 starts decoding from the padding id (T5X `decoding`, HF `decoder_start_token_id`).
DECODER_START_ID = 0
# The SentencePiece vocabulary of T5 (32,000 pieces + 100 sentinels) padded to a
# multiple of 128, as in T5X's gin files.
T5_VOCAB_SIZE = 32128
# The logical axes of every cached key/value array: [batch, length, heads, kv].
KV_CACHE_AXES = ("batch", "length", "heads", "kv")

param_with_axes = nn_partitioning.param_with_axes


@flax.struct.dataclass
class T5Config:
  """Hyperparameters, with the field names and defaults of T5X's `network.T5Config`.

  Attributes:
    vocab_size: V, rows of the shared embedding and width of the logits.
    dtype: activation dtype; parameters are cast to it where used.
    emb_dim: width of the residual stream (T5 `d_model`).
    num_heads: attention heads.
    num_encoder_layers: encoder layers.
    num_decoder_layers: decoder layers.
    head_dim: width of one head (T5 `d_kv`).
    mlp_dim: width of the MLP's hidden layer (T5 `d_ff`).
    mlp_activations: one activation per input projection, multiplied together:
      `('relu',)` for v1.0, `('gelu', 'linear')` (gated GELU) for v1.1. Each is
      `'linear'`, the name of a `flax.linen` function, or a callable.
    dropout_rate: dropout during training (`enable_dropout=True`); decoding never
      drops out.
    logits_via_embedding: True (v1.0) for logits through the transposed shared
      embedding, scaled by emb_dim ** -0.5; False (v1.1) for `decoder/logits_dense`.
    output_vocab_size: None (the logits' width is vocab_size), or N: an untied output
      layer `decoder/logits_dense` of N columns only, the logits of a shortlist of N
      ids (`specdec.drafts.shortlist.OutputShortlist` maps them back to V). Not a
      T5X field.
  """

  vocab_size: int
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str | Callable[..., Array]] = ("relu",)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  output_vocab_size: int | None = None


def _v1_1(**dims) -> T5Config:
  return T5Config(
    vocab_size=T5_VOCAB_SIZE,
    dtype=jnp.bfloat16,
    head_dim=64,
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.0,
    logits_via_embedding=False,
    **dims,
  )


def _v1_0(**dims) -> T5Config:
  return T5Config(
    vocab_size=T5_VOCAB_SIZE,
    dtype=jnp.bfloat16,
    mlp_activations=("relu",),
    dropout_rate=0.0,
    logits_via_embedding=True,
    **dims,
  )


def _layers(n: int) -> dict[str, int]:
  return dict(num_encoder_layers=n, num_decoder_layers=n)


# The published sizes (T5X `t5x/examples/t5/t5_1_{0,1}/*.gin`), in bfloat16 as there
# and without dropout, for inference. `dataclasses.replace(cfg, dtype=jnp.float32)`
# gives float32 activations.
CONFIGS: dict[str, T5Config] = {
  "t5_1_1_small": _v1_1(emb_dim=512, num_heads=6, mlp_dim=1024, **_layers(8)),
  "t5_1_1_base": _v1_1(emb_dim=768, num_heads=12, mlp_dim=2048, **_layers(12)),
  "t5_1_1_large": _v1_1(emb_dim=1024, num_heads=16, mlp_dim=2816, **_layers(24)),
  "t5_1_1_xl": _v1_1(emb_dim=2048, num_heads=32, mlp_dim=5120, **_layers(24)),
  "t5_1_1_xxl": _v1_1(emb_dim=4096, num_heads=64, mlp_dim=10240, **_layers(24)),
  "t5_small": _v1_0(emb_dim=512, num_heads=8, head_dim=64, mlp_dim=2048, **_layers(6)),
  "t5_base": _v1_0(emb_dim=768, num_heads=12, head_dim=64, mlp_dim=3072, **_layers(12)),
  "t5_large": _v1_0(emb_dim=1024, num_heads=16, head_dim=64, mlp_dim=4096, **_layers(24)),
  "t5_3b": _v1_0(emb_dim=1024, num_heads=32, head_dim=128, mlp_dim=16384, **_layers(24)),
  "t5_11b": _v1_0(emb_dim=1024, num_heads=128, head_dim=128, mlp_dim=65536, **_layers(24)),
}


def check_config(cfg: T5Config) -> None:
  """Raises TypeError/ValueError naming the first bad field of `cfg`."""
  if not isinstance(cfg, T5Config):
    raise TypeError(f"config must be a t5.T5Config, got {type(cfg).__name__}")
  for name in (
    "vocab_size",
    "emb_dim",
    "num_heads",
    "num_encoder_layers",
    "num_decoder_layers",
    "head_dim",
    "mlp_dim",
  ):
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"config.{name} must be a positive int, got {value!r}")
  if not isinstance(cfg.mlp_activations, tuple) or not cfg.mlp_activations:
    raise TypeError(
      "config.mlp_activations must be a non-empty tuple (it is hashed "
      f"as static jit metadata), got {cfg.mlp_activations!r}"
    )
  for act in cfg.mlp_activations:
    _activation(act)
  if not 0.0 <= cfg.dropout_rate < 1.0:
    raise ValueError(f"config.dropout_rate must be in [0, 1), got {cfg.dropout_rate!r}")
  if not jnp.issubdtype(jnp.dtype(cfg.dtype), jnp.floating):
    raise ValueError(f"config.dtype must be a float dtype, got {cfg.dtype!r}")
  n = cfg.output_vocab_size
  if n is not None:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= cfg.vocab_size:
      raise ValueError(
        f"config.output_vocab_size must be None or an int in [1, {cfg.vocab_size}], got {n!r}"
      )
    if cfg.logits_via_embedding:
      raise ValueError(
        "config.output_vocab_size needs an untied output layer (logits_via_embedding=False)"
      )


def _activation(fn_or_name: str | Callable[..., Array]) -> Callable[..., Array]:
  """T5X's activation lookup: 'linear', a `flax.linen` function name, or a callable."""
  if fn_or_name == "linear":
    return lambda x: x
  if isinstance(fn_or_name, str):
    fn = getattr(nn, fn_or_name, None)
    if not callable(fn):
      raise ValueError(f"config.mlp_activations: unknown activation {fn_or_name!r}")
    return fn
  if callable(fn_or_name):
    return fn_or_name
  raise TypeError(f"config.mlp_activations: {fn_or_name!r} is neither a name nor a callable")


# ------------------------------------------------------------------------------
# Relative position buckets.
# ------------------------------------------------------------------------------
def relative_position_bucket(
  relative_position: np.ndarray,
  bidirectional: bool = True,
  num_buckets: int = NUM_BUCKETS,
  max_distance: int = MAX_DISTANCE,
) -> np.ndarray:
  """T5's bucket of `relative_position` = key position - query position (numpy).

  The formula of Mesh TensorFlow and T5X (`RelativePositionBiases`), float32 `log`
  and `eps` included, so that every bucket matches theirs: half the buckets are exact
  distances, the rest logarithmic up to `max_distance`, beyond which all distances
  share the last bucket. Bidirectional (encoder) attention spends half the buckets on
  keys after the query; unidirectional (decoder) attention maps them to bucket 0.

  Args:
    relative_position: int array, any shape.
    bidirectional: False for the causal decoder.
    num_buckets: buckets in all.
    max_distance: distance from which all distances share a bucket.

  Returns:
    int32 array of the same shape, values in [0, num_buckets).
  """
  ret = np.zeros(np.shape(relative_position), np.int32)
  n = -np.asarray(relative_position, np.int32)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  val_if_large = max_exact + (
    np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
    / np.log(max_distance / max_exact)
    * (num_buckets - max_exact)
  ).astype(np.int32)
  val_if_large = np.minimum(val_if_large, num_buckets - 1)
  return ret + np.where(is_small, n, val_if_large).astype(np.int32)


@functools.cache
def _bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
  """int32[2 * max_distance + 1]: the bucket of every relative position in
  [-max_distance, max_distance]; positions beyond share the end buckets."""
  positions = np.arange(-max_distance, max_distance + 1)
  return relative_position_bucket(positions, bidirectional, num_buckets, max_distance)


def bucket_lookup(
  relative_position: Array,
  bidirectional: bool,
  num_buckets: int = NUM_BUCKETS,
  max_distance: int = MAX_DISTANCE,
) -> Array:
  """`relative_position_bucket` for traced positions (any shape), by table lookup.

  A table computed once with numpy keeps the buckets bit-identical to T5X's (XLA's
  `log` may round differently at the bucket edges). Clipping to +-max_distance is
  exact: every distance >= max_distance is in the last bucket.
  """
  table = jnp.asarray(_bucket_table(bidirectional, num_buckets, max_distance))
  clipped = jnp.clip(relative_position, -max_distance, max_distance)
  return table[clipped + max_distance]


# ------------------------------------------------------------------------------
# Masks.
# ------------------------------------------------------------------------------
def mask_to_bias(mask: Array) -> Array:
  """float32 additive attention bias: 0 where `mask` (bool or 0/1) allows, else a
  large negative number."""
  return jnp.where(mask > 0, 0.0, MASKED_LOGIT_BIAS).astype(jnp.float32)


def make_attention_mask(
  query_input: Array,
  key_input: Array,
  pairwise_fn: Callable[[Array, Array], Array] = jnp.logical_and,
) -> Array:
  """bool[B, 1, q, k] from `query_input` [B, q] and `key_input` [B, k]."""
  return pairwise_fn(query_input[:, :, None], key_input[:, None, :])[:, None]


def make_decoder_mask(
  decoder_target_tokens: Array, decoder_segment_ids: Array | None = None
) -> Array:
  """bool[B, 1, L, L]: causal, no padding targets, and (packed) same segment."""
  length = decoder_target_tokens.shape[-1]
  causal = jnp.tril(jnp.ones((length, length), jnp.bool_))[None, None]
  mask = causal & make_attention_mask(decoder_target_tokens > 0, decoder_target_tokens > 0)
  if decoder_segment_ids is not None:
    mask &= make_attention_mask(decoder_segment_ids, decoder_segment_ids, jnp.equal)
  return mask


# ------------------------------------------------------------------------------
# Layers.
# ------------------------------------------------------------------------------
class DenseGeneral(nn.Module):
  """A bias-free linear map over `axis`, with T5X's 2-D `kernel` [prod(in), prod(out)].

  Attributes:
    features: output feature dims.
    axis: input axes contracted.
    dtype: computation dtype.
    kernel_init: initializer of the 2-D kernel.
    kernel_axes: logical names of the kernel's two axes.
  """

  features: int | Sequence[int]
  axis: int | Sequence[int] = -1
  dtype: Any = jnp.float32
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  kernel_axes: tuple[str, ...] = ()

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    features = tuple(np.atleast_1d(self.features).tolist())
    axis = tuple(a % inputs.ndim for a in np.atleast_1d(self.axis).tolist())
    inputs = jnp.asarray(inputs, self.dtype)
    in_shape = tuple(inputs.shape[a] for a in axis)
    kernel = param_with_axes(
      "kernel",
      self.kernel_init,
      (int(np.prod(in_shape)), int(np.prod(features))),
      jnp.float32,
      axes=self.kernel_axes,
    )
    lead = inputs.ndim - len(axis)

    def unpacked(inputs: Array) -> Array:
      if axis == tuple(range(lead, inputs.ndim)):
        # One 2-D matrix product [tokens, in] x [in, out]: its gradient with respect
        # to the kernel is then one 2-D product too; a dot_general contracting the
        # batch and length axes together runs ~2x slower on XLA:CPU in training.
        flat = inputs.reshape((-1, kernel.shape[0]))
        y = jnp.dot(flat, jnp.asarray(kernel, self.dtype))
        return y.reshape(inputs.shape[:lead] + features)
      w = jnp.reshape(jnp.asarray(kernel, self.dtype), in_shape + features)
      return jax.lax.dot_general(inputs, w, ((axis, tuple(range(len(axis)))), ((), ())))

    packed = cpu.packed_variable(self, "kernel")
    if packed is not None and axis == tuple(range(lead, inputs.ndim)):
      flat = inputs.reshape(inputs.shape[:lead] + (-1,))
      if cpu.use_kernel(flat, packed):
        n = int(np.prod(features))

        def unpacked_flat(flat: Array) -> Array:
          return unpacked(flat.reshape(inputs.shape)).reshape(flat.shape[:-1] + (n,))

        y = cpu.packed_matmul(flat, packed, n, unpacked_flat)
        return y.reshape(inputs.shape[:lead] + features).astype(self.dtype)
    return unpacked(inputs)


class LayerNorm(nn.Module):
  """T5's layer norm: scale by the root mean square (no mean, no bias), in float32."""

  epsilon: float = LAYER_NORM_EPSILON
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    mean2 = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * jax.lax.rsqrt(mean2 + self.epsilon), self.dtype)
    scale = param_with_axes(
      "scale", nn.initializers.ones, (x.shape[-1],), jnp.float32, axes=("embed",)
    )
    return y * jnp.asarray(scale, self.dtype)


class Embed(nn.Module):
  """The shared token embedding `embedding` [vocab, embed].

  Lookup is a gather, not T5X's one-hot contraction (`one_hot=True`, a TPU choice):
  a contraction reads the whole table for every decode step, which on CPU and GPU
  costs as much as the output layer. XLA partitions the gather from a vocab-sharded
  table without gathering the table (test_sharding checks).
  """

  num_embeddings: int
  features: int
  dtype: Any = jnp.float32
  attend_dtype: Any = jnp.float32
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

  def setup(self):
    self.embedding = param_with_axes(
      "embedding",
      self.embedding_init,
      (self.num_embeddings, self.features),
      jnp.float32,
      axes=("vocab", "embed"),
    )

  def __call__(self, inputs: Array) -> Array:
    """inputs: int[...] -> [..., features] in `dtype`.

    Ids outside [0, num_embeddings) are clipped into it (a negative id reads row 0,
    the padding id, which is also how the attention masks count it; an id >= V reads
    row V - 1): `jnp.take`'s default fill would make them NaN, and a traced id cannot
    raise. `T5` raises `ValueError` for such ids when they are concrete.
    """
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise TypeError(f"token ids must be integers, got {inputs.dtype}")
    return jnp.take(jnp.asarray(self.embedding, self.dtype), inputs, axis=0, mode="clip")

  def attend(self, query: Array) -> Array:
    """query: [..., features] -> [..., num_embeddings], in `attend_dtype`."""
    packed = cpu.packed_variable(self, "embedding")
    query = jnp.asarray(query, self.attend_dtype)

    def unpacked(query: Array) -> Array:
      flat = query.reshape((-1, query.shape[-1]))  # 2-D, as in DenseGeneral.
      logits = jnp.dot(flat, jnp.asarray(self.embedding, self.attend_dtype).T)
      return logits.reshape(query.shape[:-1] + (self.num_embeddings,))

    if packed is not None and cpu.use_kernel(query, packed):
      return cpu.packed_matmul(query, packed, self.num_embeddings, unpacked)
    return unpacked(query)


class RelativePositionBiases(nn.Module):
  """T5's learned relative position bias, `rel_embedding` [heads, buckets].

  The bias is float32 whatever the model's dtype: it is added to float32 logits.

  Attributes:
    num_heads: H.
    num_buckets: buckets of `relative_position_bucket`.
    max_distance: its saturation distance.
    embedding_init: initializer of `rel_embedding`.
  """

  num_heads: int
  num_buckets: int = NUM_BUCKETS
  max_distance: int = MAX_DISTANCE
  embedding_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")

  @nn.compact
  def __call__(
    self, query_positions: ArrayLike, key_positions: ArrayLike, bidirectional: bool
  ) -> Array:
    """float32[..., H, q, k]: the bias of queries at `query_positions` [..., q] for
    keys at `key_positions` [..., k].

    Positions may be numpy constants (a full forward pass) or traced per-row
    positions [B, q] (a decode chunk). The gather is a one-hot contraction, as in
    T5X, so that a heads-sharded table stays sharded.
    """
    relative = jnp.asarray(key_positions)[..., None, :] - jnp.asarray(query_positions)[..., :, None]
    buckets = bucket_lookup(relative, bidirectional, self.num_buckets, self.max_distance)
    table = param_with_axes(
      "rel_embedding",
      self.embedding_init,
      (self.num_heads, self.num_buckets),
      jnp.float32,
      axes=("heads", "relpos_buckets"),
    )
    one_hot = jax.nn.one_hot(buckets, self.num_buckets, dtype=jnp.float32)
    return jnp.einsum("hn,...qkn->...hqk", jnp.asarray(table, jnp.float32), one_hot)


class MultiHeadDotProductAttention(nn.Module):
  """T5 attention: no 1/sqrt(head_dim) on the logits (it is folded into the query
  initializer, as in Mesh TensorFlow), float32 logits and softmax.

  Attributes:
    num_heads: H.
    head_dim: D.
    out_features: width of the output projection (the model's emb_dim).
    dtype: computation dtype of the projections and of the weighted values.
    dropout_rate: dropout on the attention weights during training.
    kernel_init: initializer of the projection kernels.
  """

  num_heads: int
  head_dim: int
  out_features: int
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "normal")

  def setup(self):
    projection = functools.partial(
      DenseGeneral,
      axis=-1,
      features=(self.num_heads, self.head_dim),
      kernel_axes=("embed", "joined_kv"),
      dtype=self.dtype,
    )
    depth_scaling = np.sqrt(self.head_dim).astype(np.float32)
    query_init = lambda *args: self.kernel_init(*args) / depth_scaling
    self.query = projection(kernel_init=query_init)
    self.key = projection(kernel_init=self.kernel_init)
    self.value = projection(kernel_init=self.kernel_init)
    self.out = DenseGeneral(
      features=self.out_features,
      axis=(-2, -1),
      kernel_init=self.kernel_init,
      kernel_axes=("joined_kv", "embed"),
      dtype=self.dtype,
    )

  def project_kv(self, inputs_kv: Array) -> tuple[Array, Array]:
    """inputs_kv: [B, k, E] -> (key, value), each [B, k, H, D]."""
    return self.key(inputs_kv), self.value(inputs_kv)

  def attend(
    self, inputs_q: Array, key: Array, value: Array, bias: Array | None, deterministic: bool
  ) -> Array:
    """Attention of `inputs_q` [B, q, E] over `key`/`value` [B, k, H, D].

    Args:
      inputs_q: query inputs.
      key: keys.
      value: values.
      bias: float32, broadcastable to [B, H, q, k]: relative position bias plus
        mask bias; None for neither.
      deterministic: disables dropout.

    Returns:
      [B, q, out_features].
    """
    query = self.query(inputs_q)
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    if bias is not None:
      logits = logits + bias
    weights = jax.nn.softmax(logits, axis=-1)
    if not deterministic and self.dropout_rate > 0.0:
      keep_prob = 1.0 - self.dropout_rate
      # T5X drops whole key columns, shared across query positions.
      keep_shape = weights.shape[:-2] + (1,) + weights.shape[-1:]
      keep = jax.random.bernoulli(self.make_rng("dropout"), keep_prob, keep_shape)
      weights = weights * keep / keep_prob
    x = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(self.dtype), value)
    return self.out(x)

  def __call__(
    self, inputs_q: Array, inputs_kv: Array, bias: Array | None = None, deterministic: bool = False
  ) -> Array:
    """Attention of `inputs_q` [B, q, E] over `inputs_kv` [B, k, E] -> [B, q, E]."""
    key, value = self.project_kv(inputs_kv)
    return self.attend(inputs_q, key, value, bias, deterministic)


class MlpBlock(nn.Module):
  """T5's feed-forward block: one input projection per activation (`wi`, or `wi_0`,
  `wi_1`, ... when gated), their product, then `wo`.

  Attributes:
    intermediate_dim: width of the hidden layer.
    activations: see `T5Config.mlp_activations`.
    kernel_init: initializer of the kernels.
    intermediate_dropout_rate: dropout on the hidden layer during training.
    dtype: computation dtype.
  """

  intermediate_dim: int
  activations: Sequence[str | Callable[..., Array]] = ("relu",)
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  intermediate_dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool = False) -> Array:
    """inputs: [B, L, E] -> [B, L, E]."""
    hidden = []
    for idx, act in enumerate(self.activations):
      name = "wi" if len(self.activations) == 1 else f"wi_{idx}"
      x = DenseGeneral(
        self.intermediate_dim,
        dtype=self.dtype,
        kernel_init=self.kernel_init,
        kernel_axes=("embed", "mlp"),
        name=name,
      )(inputs)
      hidden.append(_activation(act)(x))
    x = functools.reduce(operator.mul, hidden)
    x = nn.Dropout(rate=self.intermediate_dropout_rate, broadcast_dims=(-2,))(
      x, deterministic=deterministic
    )
    return DenseGeneral(
      inputs.shape[-1],
      dtype=self.dtype,
      kernel_init=self.kernel_init,
      kernel_axes=("mlp", "embed"),
      name="wo",
    )(x)


def _attention(cfg: T5Config, **kwargs) -> MultiHeadDotProductAttention:
  return MultiHeadDotProductAttention(
    num_heads=cfg.num_heads,
    head_dim=cfg.head_dim,
    out_features=cfg.emb_dim,
    dtype=cfg.dtype,
    dropout_rate=cfg.dropout_rate,
    **kwargs,
  )


def _mlp(cfg: T5Config, **kwargs) -> MlpBlock:
  return MlpBlock(
    intermediate_dim=cfg.mlp_dim,
    activations=cfg.mlp_activations,
    intermediate_dropout_rate=cfg.dropout_rate,
    dtype=cfg.dtype,
    **kwargs,
  )


class EncoderLayer(nn.Module):
  """Pre-norm self-attention and MLP, each with a residual connection."""

  config: T5Config

  @nn.compact
  def __call__(self, inputs: Array, bias: Array, deterministic: bool) -> Array:
    """inputs: [B, S, E]; bias: float32 [B|1, H|1, S, S] -> [B, S, E]."""
    cfg = self.config
    dropout = nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))
    x = LayerNorm(dtype=cfg.dtype, name="pre_attention_layer_norm")(inputs)
    x = _attention(cfg, name="attention")(x, x, bias, deterministic)
    x = dropout(x, deterministic=deterministic) + inputs
    y = LayerNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
    y = _mlp(cfg, name="mlp")(y, deterministic)
    return dropout(y, deterministic=deterministic) + x


class DecoderLayer(nn.Module):
  """Pre-norm self-attention, encoder-decoder attention and MLP.

  `__call__` is the full (training) pass; `extend` feeds a chunk against cached keys
  and values.
  """

  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = LayerNorm(dtype=cfg.dtype)
    self.self_attention = _attention(cfg)
    self.pre_cross_attention_layer_norm = LayerNorm(dtype=cfg.dtype)
    self.encoder_decoder_attention = _attention(cfg)
    self.pre_mlp_layer_norm = LayerNorm(dtype=cfg.dtype)
    self.mlp = _mlp(cfg)
    self.dropout = nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))

  def _cross_attention_and_mlp(
    self,
    x: Array,
    cross_key: Array,
    cross_value: Array,
    cross_bias: Array | None,
    deterministic: bool,
  ) -> Array:
    y = self.pre_cross_attention_layer_norm(x)
    y = self.encoder_decoder_attention.attend(y, cross_key, cross_value, cross_bias, deterministic)
    y = self.dropout(y, deterministic=deterministic) + x
    z = self.pre_mlp_layer_norm(y)
    z = self.mlp(z, deterministic)
    return self.dropout(z, deterministic=deterministic) + y

  def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
    """encoded: [B, S, E] -> encoder-decoder attention (key, value), each [B, S, H, D]."""
    return self.encoder_decoder_attention.project_kv(encoded)

  def __call__(
    self,
    inputs: Array,
    encoded: Array,
    self_bias: Array | None,
    cross_bias: Array | None,
    deterministic: bool,
  ) -> Array:
    """inputs: [B, L, E], encoded: [B, S, E]; biases float32 [B|1, H|1, L, L|S]."""
    x = self.pre_self_attention_layer_norm(inputs)
    x = self.self_attention(x, x, self_bias, deterministic)
    x = self.dropout(x, deterministic=deterministic) + inputs
    return self._cross_attention_and_mlp(x, *self.cross_kv(encoded), cross_bias, deterministic)

  def extend(
    self,
    inputs: Array,
    cache: tuple[Array, Array],
    positions: Array,
    cross: tuple[Array, Array],
    self_bias: Array,
    cross_bias: Array | None,
    deterministic: bool,
  ) -> tuple[Array, tuple[Array, Array]]:
    """Feeds a chunk against this layer's cache.

    Args:
      inputs: [B, k, E], the chunk's residual stream.
      cache: (key, value), each [B, T, H, D].
      positions: int32[B, k], the chunk's cache slots (those >= T are dropped).
      cross: encoder-decoder (key, value), each [B, S, H, D].
      self_bias: float32 [B, H, k, T], relative position and causal/stale mask.
      cross_bias: float32 broadcastable to [B, H, k, S], encoder padding.
      deterministic: disables dropout.

    Returns:
      ([B, k, E], the cache with the chunk's keys and values written).
    """
    x = self.pre_self_attention_layer_norm(inputs)
    new_key, new_value = self.self_attention.project_kv(x)
    cache = (write_cache(cache[0], new_key, positions), write_cache(cache[1], new_value, positions))
    x = self.self_attention.attend(x, *cache, self_bias, deterministic)
    x = self.dropout(x, deterministic=deterministic) + inputs
    return self._cross_attention_and_mlp(x, *cross, cross_bias, deterministic), cache


def write_cache(cache: Array, new: Array, positions: Array) -> Array:
  """cache[b, positions[b, j]] = new[b, j]; every other slot is unchanged.

  A scatter of the k new slots per row, which XLA performs in place on the
  loop-carried cache: O(k) memory traffic per call, where T5X's one-hot contraction
  (`einsum('bkt,bkhd->bthd')` and a select) reads and writes the whole cache,
  O(T). Slots at or past T are dropped (`mode='drop'`): a full row keeps what it
  has. The positions of a row are distinct and ascending, so the scatter needs no
  atomics. It is a per-row scatter under `vmap`, i.e. one with the batch as an
  operand batching dimension: XLA's SPMD partitioner keeps a cache sharded over
  'batch' (each device writes its own rows) and over 'heads' (a window dimension,
  written shard by shard) without gathering it.

  Args:
    cache: [B, T, H, D].
    new: [B, k, H, D].
    positions: int[B, k], slot of each new row; >= 0.

  Returns:
    [B, T, H, D] in cache's dtype.
  """

  def write_row(row: Array, values: Array, slots: Array) -> Array:
    return row.at[slots].set(
      values.astype(row.dtype), mode="drop", indices_are_sorted=True, unique_indices=True
    )

  return jax.vmap(write_row)(cache, new, positions)


class Encoder(nn.Module):
  """The encoder stack: embedding, layers, final norm."""

  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(
    self,
    encoder_input_tokens: Array,
    encoder_mask: Array | None = None,
    deterministic: bool = False,
  ) -> Array:
    """encoder_input_tokens: int[B, S]; encoder_mask: [B, 1, S, S] -> [B, S, E]."""
    cfg = self.config
    if encoder_input_tokens.ndim != 2:
      raise ValueError(
        f"encoder_input_tokens must be [batch, length], got shape {encoder_input_tokens.shape}"
      )
    positions = np.arange(encoder_input_tokens.shape[1])
    relpos = RelativePositionBiases(num_heads=cfg.num_heads, name="relpos_bias")
    bias = relpos(positions, positions, True)[None]
    if encoder_mask is not None:
      bias = bias + mask_to_bias(encoder_mask)
    x = self.shared_embedding(encoder_input_tokens.astype(jnp.int32))
    x = nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))(
      x, deterministic=deterministic
    ).astype(cfg.dtype)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(config=cfg, name=f"layers_{i}")(x, bias, deterministic)
    x = LayerNorm(dtype=cfg.dtype, name="encoder_norm")(x)
    return nn.Dropout(rate=cfg.dropout_rate)(x, deterministic=deterministic)


class Decoder(nn.Module):
  """The decoder stack: embedding, layers, final norm, logits.

  `__call__` has T5X's signature; with `decode=True` it keeps its cache in the
  mutable 'cache' collection, as T5X's `EncoderDecoderModel.predict_batch` expects,
  but takes chunks of any length. `cross_kv` and `extend` are the functional cache
  interface that `T5` uses.
  """

  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBiases(num_heads=cfg.num_heads)
    self.layers = [DecoderLayer(config=cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = LayerNorm(dtype=cfg.dtype)
    if not cfg.logits_via_embedding:
      # float32 logits, as in T5X, for a stable softmax.
      self.logits_dense = DenseGeneral(
        cfg.output_vocab_size or cfg.vocab_size, dtype=jnp.float32, kernel_axes=("embed", "vocab")
      )
    self.dropout = nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))

  def _embed(self, tokens: Array, deterministic: bool) -> Array:
    y = self.shared_embedding(tokens.astype(jnp.int32))
    return self.dropout(y, deterministic=deterministic).astype(self.config.dtype)

  def _logits(self, y: Array, deterministic: bool, per_position: bool = False) -> Array:
    """y: [B, L, E] -> float32 logits [B, L, V].

    `per_position` computes the output layer one position at a time (L matrix-vector
    products instead of one [L, E] x [E, V] product): the same numbers, and on XLA's
    CPU about half the time for a 2..6-token chunk at V = 32128, whose matrix product
    re-packs the whole [E, V] kernel on every call (see `T5.per_position_logits`).
    """
    y = self.decoder_norm(y)
    y = self.dropout(y, deterministic=deterministic)
    if per_position and y.shape[1] > 1:
      return jnp.concatenate([self._project(y[:, j : j + 1]) for j in range(y.shape[1])], axis=1)
    return self._project(y)

  def _project(self, y: Array) -> Array:
    if self.config.logits_via_embedding:
      # T5 v1.0 ties the output layer to the embedding and rescales (Mesh TF).
      return self.shared_embedding.attend(y) / np.sqrt(y.shape[-1]).astype(np.float32)
    return self.logits_dense(y)

  def cross_kv(self, encoded: Array) -> tuple[tuple[Array, Array], ...]:
    """encoded: [B, S, E] -> per layer, encoder-decoder (key, value) [B, S, H, D]."""
    return tuple(layer.cross_kv(encoded) for layer in self.layers)

  def extend(
    self,
    tokens: Array,
    lengths: Array,
    caches: Sequence[tuple[Array, Array]],
    cross: Sequence[tuple[Array, Array]],
    cross_bias: Array | None,
    deterministic: bool = True,
    per_position_logits: bool = False,
  ) -> tuple[Array, tuple[tuple[Array, Array], ...]]:
    """Feeds `tokens` [B, k] at positions lengths[b], lengths[b]+1, ... of each row.

    Query j of row b (position p = lengths[b] + j) attends to cache slots t <= p:
    the row's earlier tokens and the chunk's first j+1. This one inequality is both
    the causal mask inside the chunk and the mask of stale slots left by `rewind`.

    Args:
      tokens: int[B, k].
      lengths: int32[B], tokens already in each row's cache.
      caches: per layer, self-attention (key, value) [B, T, H, D].
      cross: per layer, encoder-decoder (key, value) [B, S, H, D].
      cross_bias: float32 broadcastable to [B, H, k, S] (encoder padding), or None.
      deterministic: disables dropout.
      per_position_logits: the output layer one position at a time (`_logits`).

    Returns:
      (float32 logits [B, k, V], the caches with the chunk written).
    """
    capacity = caches[0][0].shape[1]
    query_positions = lengths[:, None] + jnp.arange(tokens.shape[1])  # [B, k]
    key_positions = jnp.arange(capacity)  # [T]
    visible = key_positions[None, None, :] <= query_positions[:, :, None]  # [B, k, T]
    self_bias = (
      self.relpos_bias(query_positions, key_positions, False) + mask_to_bias(visible)[:, None]
    )  # [B, H, k, T]
    y = self._embed(tokens, deterministic)
    new_caches = []
    for layer, cache, layer_cross in zip(self.layers, caches, cross):
      y, cache = layer.extend(
        y, cache, query_positions, layer_cross, self_bias, cross_bias, deterministic
      )
      new_caches.append(cache)
    return self._logits(y, deterministic, per_position_logits), tuple(new_caches)

  @nn.compact
  def __call__(
    self,
    encoded: Array,
    decoder_input_tokens: Array,
    decoder_positions: Array | None = None,
    decoder_mask: Array | None = None,
    encoder_decoder_mask: Array | None = None,
    deterministic: bool = False,
    decode: bool = False,
    max_decode_length: int | None = None,
  ) -> Array:
    """T5X's decoder call: logits [B, L, V] for `decoder_input_tokens` [B, L].

    `decoder_positions` is accepted for T5X's signature and, as in T5X, unused: the
    relative positions are those of the token axis (of the cache with `decode`).
    With `decode=True` the first call (no 'cache' yet) allocates a cache of
    `max_decode_length` (default L) positions and returns the full causal pass; each
    later call feeds its L tokens at the cache's per-row positions.
    """
    cfg = self.config
    if decoder_input_tokens.ndim != 2:
      raise ValueError(
        f"decoder_input_tokens must be [batch, length], got shape {decoder_input_tokens.shape}"
      )
    cross_bias = None if encoder_decoder_mask is None else mask_to_bias(encoder_decoder_mask)
    if decode:
      batch, length = decoder_input_tokens.shape
      initialized = self.has_variable("cache", "lengths")
      capacity = max_decode_length or length
      kv_shape = (batch, capacity, cfg.num_heads, cfg.head_dim)
      lengths = self.variable("cache", "lengths", jnp.zeros, (batch,), jnp.int32)
      cache_vars = [
        tuple(
          self.variable("cache", f"{kind}_{i}", jnp.zeros, kv_shape, cfg.dtype)
          for kind in ("cached_key", "cached_value")
        )
        for i in range(cfg.num_decoder_layers)
      ]
      if initialized:
        logits, caches = self.extend(
          decoder_input_tokens,
          lengths.value,
          [(k.value, v.value) for k, v in cache_vars],
          self.cross_kv(encoded),
          cross_bias,
          deterministic,
        )
        for (key_var, value_var), (key, value) in zip(cache_vars, caches):
          key_var.value, value_var.value = key, value
        lengths.value = lengths.value + length
        return logits
      decoder_mask = make_decoder_mask(jnp.ones_like(decoder_input_tokens))
    positions = np.arange(decoder_input_tokens.shape[1])
    self_bias = self.relpos_bias(positions, positions, False)[None]
    if decoder_mask is not None:
      self_bias = self_bias + mask_to_bias(decoder_mask)
    y = self._embed(decoder_input_tokens, deterministic)
    for layer in self.layers:
      y = layer(y, encoded, self_bias, cross_bias, deterministic)
    return self._logits(y, deterministic)


class Transformer(nn.Module):
  """The T5 encoder-decoder, with T5X's parameter tree and `network.Transformer` API.

  Attributes:
    config: a `T5Config`.
  """

  config: T5Config

  def setup(self):
    cfg = self.config
    check_config(cfg)
    self.shared_embedding = Embed(
      num_embeddings=cfg.vocab_size,
      features=cfg.emb_dim,
      dtype=cfg.dtype,
      attend_dtype=jnp.float32,
      name="token_embedder",
    )
    self.encoder = Encoder(config=cfg, shared_embedding=self.shared_embedding)
    self.decoder = Decoder(config=cfg, shared_embedding=self.shared_embedding)

  def encode(
    self,
    encoder_input_tokens: Array,
    encoder_segment_ids: Array | None = None,
    enable_dropout: bool = True,
  ) -> Array:
    """encoder_input_tokens: int[B, S] (0 = padding) -> encoded [B, S, E]."""
    if encoder_input_tokens.ndim != 2:
      raise ValueError(
        f"encoder_input_tokens must be [batch, length], got shape {encoder_input_tokens.shape}"
      )
    mask = make_attention_mask(encoder_input_tokens > 0, encoder_input_tokens > 0)
    if encoder_segment_ids is not None:
      mask &= make_attention_mask(encoder_segment_ids, encoder_segment_ids, jnp.equal)
    return self.encoder(encoder_input_tokens, mask, deterministic=not enable_dropout)

  def decode(
    self,
    encoded: Array,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    encoder_segment_ids: Array | None = None,
    decoder_segment_ids: Array | None = None,
    decoder_positions: Array | None = None,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: int | None = None,
  ) -> Array:
    """T5X's decoder branch: float32 logits [B, L, V].

    Args:
      encoded: [B, S, E] from `encode`.
      encoder_input_tokens: int[B, S], for the encoder padding mask.
      decoder_input_tokens: int[B, L], the targets shifted right (start id 0).
      decoder_target_tokens: int[B, L], for the decoder padding mask (ignored with
        `decode`, as in T5X).
      encoder_segment_ids: int[B, S] for packed examples (not with `decode`).
      decoder_segment_ids: int[B, L] for packed examples.
      decoder_positions: accepted for T5X's signature; unused, as there.
      enable_dropout: enables dropout.
      decode: use and update the 'cache' collection (see `Decoder.__call__`).
      max_decode_length: cache capacity when `decode` allocates it.
    """
    if decode:
      if encoder_segment_ids is not None:
        raise ValueError("encoder_segment_ids: packing is not supported with decode")
      decoder_mask = None
      encoder_decoder_mask = make_attention_mask(
        jnp.ones_like(decoder_target_tokens, jnp.bool_), encoder_input_tokens > 0
      )
    else:
      decoder_mask = make_decoder_mask(decoder_target_tokens, decoder_segment_ids)
      encoder_decoder_mask = make_attention_mask(
        decoder_target_tokens > 0, encoder_input_tokens > 0
      )
    if encoder_segment_ids is not None:
      if decoder_segment_ids is None:
        raise ValueError("decoder_segment_ids: needed with encoder_segment_ids (packed examples)")
      encoder_decoder_mask &= make_attention_mask(
        decoder_segment_ids, encoder_segment_ids, jnp.equal
      )
    return self.decoder(
      encoded,
      decoder_input_tokens,
      decoder_positions=decoder_positions,
      decoder_mask=decoder_mask,
      encoder_decoder_mask=encoder_decoder_mask,
      deterministic=not enable_dropout,
      decode=decode,
      max_decode_length=max_decode_length,
    )

  def __call__(
    self,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    encoder_segment_ids: Array | None = None,
    decoder_segment_ids: Array | None = None,
    encoder_positions: Array | None = None,
    decoder_positions: Array | None = None,
    *,
    enable_dropout: bool = True,
    decode: bool = False,
  ) -> Array:
    """The full model (T5X signature): float32 logits [B, L, V].

    `encoder_positions` and `decoder_positions` are accepted and unused, as in T5X.
    """
    del encoder_positions
    encoded = self.encode(
      encoder_input_tokens, encoder_segment_ids=encoder_segment_ids, enable_dropout=enable_dropout
    )
    return self.decode(
      encoded,
      encoder_input_tokens,
      decoder_input_tokens,
      decoder_target_tokens,
      encoder_segment_ids=encoder_segment_ids,
      decoder_segment_ids=decoder_segment_ids,
      decoder_positions=decoder_positions,
      enable_dropout=enable_dropout,
      decode=decode,
    )

  def cross_kv(self, encoded: Array) -> tuple[tuple[Array, Array], ...]:
    """encoded: [B, S, E] -> per decoder layer, (key, value) [B, S, H, D]."""
    return self.decoder.cross_kv(encoded)

  def extend_decoder(
    self,
    tokens: Array,
    lengths: Array,
    caches: Sequence[tuple[Array, Array]],
    cross: Sequence[tuple[Array, Array]],
    encoder_mask: Array,
    per_position_logits: bool = False,
  ) -> tuple[Array, tuple[tuple[Array, Array], ...]]:
    """`Decoder.extend` without dropout; encoder_mask: bool[B, S] (True = token)."""
    cross_bias = mask_to_bias(encoder_mask)[:, None, None, :]
    return self.decoder.extend(
      tokens,
      lengths,
      caches,
      cross,
      cross_bias,
      deterministic=True,
      per_position_logits=per_position_logits,
    )


# ------------------------------------------------------------------------------
# Parameters.
# ------------------------------------------------------------------------------
def _dummy_tokens() -> tuple[Array, Array, Array]:
  ones = jnp.ones((1, 1), jnp.int32)
  return ones, ones, ones


@functools.partial(jax.jit, static_argnums=0)
def _init_variables(cfg: T5Config, rng: Array) -> Mapping[str, Any]:
  # One compiled program: op-by-op initialization of a deep model is much slower.
  return Transformer(cfg).init(rng, *_dummy_tokens(), enable_dropout=False)


def init_variables(cfg: T5Config, rng: Array) -> Mapping[str, Any]:
  """`Transformer(cfg).init`: {'params': ..., 'params_axes': ...} (T5X's init)."""
  check_config(cfg)
  return _init_variables(cfg, rng)


def init_params(cfg: T5Config, rng: Array) -> dict[str, Any]:
  """Random parameters with T5X's initializers (float32 leaves)."""
  return init_variables(cfg, rng)["params"]


@functools.lru_cache(maxsize=64)
def _param_shapes(cfg: T5Config) -> dict[str, Any]:
  return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))


def param_shapes(cfg: T5Config) -> dict[str, Any]:
  """The parameter tree of `cfg` as `jax.ShapeDtypeStruct`s, allocating nothing."""
  check_config(cfg)
  # A fresh tree each call: callers may edit it; the cached one must not change.
  return jax.tree.map(lambda x: x, _param_shapes(cfg))


def _init_std(cfg: T5Config, path, shape) -> float | None:
  """T5X's initializer scale for the leaf at `path`: None for layer-norm scales (ones);
  1 for the embedding; 1/sqrt(fan_in) for kernels, a further 1/sqrt(head_dim) for
  queries; 1/sqrt(buckets) for the relative position tables."""
  if path[-1].key == "scale":
    return None
  if path[-1].key == "embedding":
    return 1.0
  std = 1.0 / np.sqrt(shape[-1] if path[-1].key == "rel_embedding" else shape[0])
  if path[-2].key == "query":
    std /= np.sqrt(cfg.head_dim)
  return float(std)


def random_params(cfg: T5Config, seed: int = 0, dtype: Any = np.float32) -> dict[str, Any]:
  """Random parameters drawn with numpy at T5X's initializer scales.

  Normal with std 1/sqrt(fan_in) for kernels (and a further 1/sqrt(head_dim) for
  queries, as in T5X), 1/sqrt(buckets) for the relative position tables, 1 for the
  embedding; layer-norm scales are 1. Unlike
  `init_params` this compiles nothing, so it is fast at any size: for tests and
  benchmarks, where the weights' exact distribution does not matter.
  """
  rng = np.random.default_rng(seed)

  def draw(path, leaf) -> np.ndarray:
    std = _init_std(cfg, path, leaf.shape)
    if std is None:
      return np.ones(leaf.shape, dtype)
    return (rng.standard_normal(leaf.shape, np.float32) * std).astype(dtype)

  return jax.tree_util.tree_map_with_path(draw, param_shapes(cfg))


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def _normal_leaf(key: Array, std: Array, shape: tuple[int, ...], dtype: Any) -> Array:
  return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)


def device_random_params(cfg: T5Config, seed: int = 0, dtype: Any = None) -> dict[str, Any]:
  """`random_params`' scales, drawn by `jax.random` on the default device in `dtype`
  (the config's by default), leaf by leaf: for accelerator benchmarks of large
  shapes (T5-XXL: 11B parameters, 22 GB in bfloat16), which numpy would draw on the
  host in minutes and hold there in float32 (44 GB) before the copy."""
  dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(param_shapes(cfg))
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  out = []
  for key, (path, leaf) in zip(keys, leaves):
    std = _init_std(cfg, path, leaf.shape)
    out.append(
      jnp.ones(leaf.shape, dtype)
      if std is None
      else _normal_leaf(key, jnp.float32(std), tuple(leaf.shape), dtype)
    )
  return jax.tree_util.tree_unflatten(treedef, out)


def param_count(cfg: T5Config) -> int:
  """Number of parameters of `cfg` (from `param_shapes`)."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(param_shapes(cfg)))


# ------------------------------------------------------------------------------
# The DecodeModel.
# ------------------------------------------------------------------------------
def decode_matrices(cfg: T5Config, params: Any) -> dict[str, tuple[Array, bool]]:
  """{path: (matrix, transposed)}: every weight matrix a decoder step reads once per
  token: each decoder layer's self-attention query, key, value and out, the
  encoder-decoder query and out, the MLP kernels ([in, out], transposed False) and
  the output layer (`decoder/logits_dense/kernel`, or v1.0's tied
  `token_embedder/embedding` [V, E], transposed True). Encoder weights and the
  encoder-decoder key / value projections (run once per input, over all its
  positions) are not among them."""
  check_config(cfg)
  flat = traverse_util.flatten_dict(params, sep="/")
  matrices = {}
  for name, value in flat.items():
    if (
      name.startswith("decoder/")
      and name.endswith("/kernel")
      and not re.search(r"encoder_decoder_attention/(key|value)/", name)
    ):
      matrices[name] = (value, False)
  if cfg.logits_via_embedding:
    matrices["token_embedder/embedding"] = (flat["token_embedder/embedding"], True)
  return matrices


def pack_params(cfg: T5Config, params: Any, dtype: Any = None) -> dict[str, Any]:
  """The `packed` variable collection: a tile-major copy
  (`specdec.backends.cpu.pack`) of every matrix of `decode_matrices`, under the same
  module paths (v1.0's tied embedding as [E, V]).

  With it, `Transformer.apply({'params': ..., 'packed': ...})` reads those weights once
  per decoder call of up to `specdec.backends.cpu.MAX_ROWS` tokens on a CPU. The numbers
  are those of the unpacked products up to float32 rounding of the sums' order.
  Weights that bfloat16 holds exactly (a checkpoint stored in bfloat16) are copied in
  bfloat16: half the bytes to read per step, each widened back to the same float32
  value, so the same numbers. `dtype` (None: that automatic choice; float32 or
  bfloat16) is `specdec.backends.cpu.pack_tree`'s.
  """
  return cpu.pack_tree(decode_matrices(cfg, params), dtype)


@flax.struct.dataclass
class T5State:
  """Decode state of `T5`.

  Attributes:
    caches: per decoder layer, self-attention (key, value), each [B, T, H, D]; slots
      at or past `lengths[b]` are stale.
    cross: per decoder layer, encoder-decoder (key, value), each [B, S, H, D],
      computed once by `init`.
    encoder_mask: bool[B, S], True at input tokens (id != 0).
    lengths: int32[B], decoder tokens fed so far per row.
  """

  caches: tuple[tuple[Array, Array], ...]
  cross: tuple[tuple[Array, Array], ...]
  encoder_mask: Array
  lengths: Array


def state_logical_axes(state: T5State) -> T5State:
  """A tree like `state` whose leaves are `PartitionSpec`s of logical axis names."""
  spec = jax.sharding.PartitionSpec
  kv = lambda tree: jax.tree.map(lambda _: spec(*KV_CACHE_AXES), tree)
  return T5State(
    caches=kv(state.caches),
    cross=kv(state.cross),
    encoder_mask=spec("batch", "length"),  # type: ignore[arg-type]  # spec tree
    lengths=spec("batch"),  # type: ignore[arg-type]  # a spec tree, not an array
  )


@flax.struct.dataclass
class T5:
  """T5 as a `specdec.models.base.DecodeModel` (encoder-decoder, chunked cache).

  `init(inputs, max_length)` encodes `inputs` (0 = padding) and caches every decoder
  layer's encoder-decoder keys and values; decoding starts from token 0, which `init`
  has not fed (lengths start at 0). `extend` feeds a chunk of k tokens at each row's
  own position, so the target scores gamma+1 drafted tokens in one call.

  Attributes:
    config: a `T5Config` (static).
    params: the parameter tree (T5X's `target`), leaves float32 or bfloat16.
    max_decode_length: the most decoder positions `init` may allocate, or None for
      no limit (relative positions do not bound the length).
    per_position_logits: (static) chunks of at most this many tokens compute their
      output layer one position at a time (0: never). The logits are the same; only
      the speed differs. On XLA's CPU a [k, E] x [E, V] product with a kernel of
      tens of MB costs about as much for k = 2 as for k = 8 (the kernel is re-packed
      on every call), 3.5-6 matrix-vector products, while k separate ones cost k, so
      chunks of up to 6 are verified up to twice as fast this way
      (`scripts/bench_verify.py`); on accelerators one product is better (0, the
      default). Packed weights make it unnecessary (`with_packed_weights` sets 0).
    packed: None, or `pack_params(config, params)`: the decoder weights' tile-major
      copy that lets a CPU verify a chunk for about the cost of one token
      (`with_packed_weights`).
  """

  config: T5Config = flax.struct.field(pytree_node=False)
  params: Any
  max_decode_length: int | None = flax.struct.field(pytree_node=False, default=None)
  per_position_logits: int = flax.struct.field(pytree_node=False, default=0)
  packed: Any = None

  def __post_init__(self):
    check_config(self.config)
    chunk = self.per_position_logits
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
      raise ValueError(
        f"per_position_logits must be an int >= 0 (the longest chunk "
        f"computed position by position), got {chunk!r}"
      )
    limit = self.max_decode_length
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
      raise ValueError(f"max_decode_length must be a positive int or None, got {limit!r}")

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  def _apply(self, method: Callable[..., Any], *args, **kwargs) -> Any:
    if not isinstance(self.params, Mapping) or "decoder" not in self.params:
      found = (
        sorted(self.params) if isinstance(self.params, Mapping) else type(self.params).__name__
      )
      raise ValueError(
        "params must be the parameter tree (keys token_embedder, "
        f"encoder, decoder), not a variables dict; got {found}"
      )
    variables = {"params": self.params}
    if self.packed is not None:
      variables[cpu.PACKED] = self.packed
    return self.module.apply(variables, *args, method=method, **kwargs)

  def with_packed_weights(self) -> T5:
    """This model with `packed` set (and `per_position_logits` 0) where
    `specdec.backends.cpu.enabled()` (a single CPU device with the kernel built) and the
    model is float32; unchanged elsewhere. The copy is made once, here: a decoder
    chunk of up to `specdec.backends.cpu.MAX_ROWS` tokens then reads every decoder weight
    once (`scripts/bench_verify.py`)."""
    if self.packed is not None or not cpu.enabled() or jnp.dtype(self.config.dtype) != jnp.float32:
      return self
    return dataclasses.replace(
      self, packed=pack_params(self.config, self.params), per_position_logits=0
    )

  def encode(self, inputs: Array) -> Array:
    """inputs: int[B, S] -> encoded [B, S, E], without dropout.

    Raises ValueError naming `inputs` for concrete ids outside [0, V); traced ids
    there are clipped into it (`Embed`).
    """
    base.check_tokens("inputs", inputs, self.vocab_size)
    return self._encode(inputs)

  def _encode(self, inputs: Array) -> Array:
    return self._apply(Transformer.encode, inputs, enable_dropout=False)

  def init(self, inputs: Array, max_length: int) -> T5State:
    """Encodes `inputs` [B, S] and allocates `max_length` decoder positions.

    Ids as in `encode`: concrete ones outside [0, V) raise, traced ones are clipped.
    """
    base.check_tokens("inputs", inputs, self.vocab_size)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
      raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    if self.max_decode_length is not None and max_length > self.max_decode_length:
      raise ValueError(
        f"max_length={max_length} exceeds this model's max_decode_length={self.max_decode_length}"
      )
    cfg = self.config
    encoded = self._encode(inputs)
    batch = inputs.shape[0]
    kv_shape = (batch, max_length, cfg.num_heads, cfg.head_dim)
    empty = tuple(
      (jnp.zeros(kv_shape, cfg.dtype), jnp.zeros(kv_shape, cfg.dtype))
      for _ in range(cfg.num_decoder_layers)
    )
    return T5State(
      caches=empty,
      cross=self._apply(Transformer.cross_kv, encoded),
      encoder_mask=inputs > PAD_ID,
      lengths=jnp.zeros((batch,), jnp.int32),
    )

  def start_tokens(self, inputs: Array) -> Array:
    """int32[B] of the decoder start id 0."""
    base.check_tokens("inputs", inputs)
    return jnp.full((inputs.shape[0],), DECODER_START_ID, jnp.int32)

  def extend(self, state: T5State, tokens: Array) -> tuple[Array, T5State]:
    """tokens: int[B, k] -> (float32 logits [B, k, V], state advanced by k).

    Writes only the chunk's k slots of each row's cache (`write_cache`). A row whose
    cache is full drops the keys it cannot store; the samplers size the cache
    (`init`'s max_length) so that this never happens. Concrete ids outside [0, V)
    raise ValueError naming `tokens`; traced ones are clipped into it (`Embed`).

    Chunks and single steps. A chunk's logits equal those of feeding its tokens one
    at a time only up to floating-point rounding: the same sums in another order (a
    [k, E] x [E, V] product, attention over the chunk's keys) and, in bfloat16, other
    fusions (XLA may keep a value in float32 on one path and round it on the other).
    Greedy speculative decoding (Section 2.3) outputs the target's greedy decode token
    for token exactly when every argmax it takes on a verification chunk is the argmax
    of the single-step logits. What is guaranteed is therefore: identity wherever the
    top two single-step logits are more than 2 max|chunk - single| apart at every
    position (each of the two may move by that much; exact ties break to the lowest
    id either way); a closer pair may flip, and the decodes part there. Measured on the
    shipped pair (`scripts/bench_identity.py`, CPU): |chunk - single| up to ~5e-6 in
    float32, where such near-ties are rare, and up to ~1e-2 in bfloat16, where at
    scale argmax flips are to be expected.
    """
    base.check_tokens("tokens", tokens, self.vocab_size)
    batch, capacity = state.caches[0][0].shape[:2]
    if tokens.shape[0] != batch:
      raise ValueError(f"tokens has batch {tokens.shape[0]}, the state has {batch}")
    if tokens.shape[1] > capacity:
      raise ValueError(
        f"tokens: a chunk of {tokens.shape[1]} exceeds the cache of "
        f"{capacity} positions allocated by init(max_length)"
      )
    per_position = tokens.shape[1] <= self.per_position_logits  # k = 1: one product
    logits, caches = self._apply(
      Transformer.extend_decoder,
      tokens,
      state.lengths,
      state.caches,
      state.cross,
      state.encoder_mask,
      per_position_logits=per_position,
    )
    return logits, dataclasses.replace(
      state, caches=caches, lengths=state.lengths + tokens.shape[1]
    )

  def rewind(self, state: T5State, lengths: Array) -> T5State:
    """Rolls row b back to min(current, lengths[b]) tokens; stale slots are masked."""
    return dataclasses.replace(state, lengths=base.rewound(state.lengths, lengths))

  def lengths(self, state: T5State) -> Array:
    """int32[B], decoder tokens fed so far per row."""
    return state.lengths


def tiny_config(version: str = "1.1", **overrides) -> T5Config:
  """A small float32 config for tests and examples (emb 32, 2 heads of 8, 2 layers,
  vocab 64); `overrides` replace any field."""
  if version not in ("1.0", "1.1"):
    raise ValueError(f"version must be '1.0' or '1.1', got {version!r}")
  gated = version == "1.1"
  cfg = T5Config(
    vocab_size=64,
    dtype=jnp.float32,
    emb_dim=32,
    num_heads=2,
    num_encoder_layers=2,
    num_decoder_layers=2,
    head_dim=8,
    mlp_dim=64,
    mlp_activations=("gelu", "linear") if gated else ("relu",),
    dropout_rate=0.0,
    logits_via_embedding=not gated,
  )
  return dataclasses.replace(cfg, **overrides)
