"""T5X's example decoder-only Transformer in Flax, with a cache that verifies chunks.

The network is that of T5X's `t5x/examples/decoder_only/network.py` (the decoder
stack of T5 without encoder-decoder attention, trained as a language model or a
prefix LM, Raffel et al. 2020, section 3.2.1): pre-norm RMS layer norms, T5's
relative position bias (one table shared by all layers, unidirectional buckets
everywhere, the prefix included), self-attention without 1/sqrt(head_dim) (folded
into the query initializer), a ReLU or gated MLP, and logits through the embedding
(scaled by emb_dim ** -0.5) or `logits_dense`. Its layers are those of
`specdec.models.t5`, and its parameter tree and logical axes are T5X's:

    decoder/token_embedder/embedding [V, E]
    decoder/relpos_bias/rel_embedding [H, 32]
    decoder/layers_{i}/pre_self_attention_layer_norm/scale [E]
    decoder/layers_{i}/self_attention/{query,key,value}/kernel [E, H * D]
    decoder/layers_{i}/self_attention/out/kernel [H * D, E]
    decoder/layers_{i}/pre_mlp_layer_norm/scale [E]
    decoder/layers_{i}/mlp/{wi | wi_0, wi_1, ...}/kernel [E, F], mlp/wo/kernel [F, E]
    decoder/decoder_norm/scale [E]
    decoder/logits_dense/kernel [E, V]   (logits_via_embedding=False only)

so a T5X checkpoint of `network.DecoderWrapper` loads with no renaming
(`specdec.io.load_t5x(path)` reads it), and `Transformer` can be the
`module` of T5X's `DecoderOnlyModel` for training and scoring.

Prompts are passed as T5X's `DecoderOnlyModel.predict_batch_with_aux` passes them to
its decode_fn: `inputs` int[B, S] is `decoder_input_tokens * decoder_causal_attention`,
i.e. the BOS id 0 at position 0, row b's prompt at positions 1..P_b, zeros after,
where P_b = the number of non-zero ids in inputs[b, 1:] (T5X's `initial_index`; so
a prompt must not contain id 0, as in T5X). Decoding starts from the prompt's last
token inputs[b, P_b]. With `bidirectional_prefix` (T5X's
`inputs_bidirectional_attention`, a prefix LM) positions 0..P_b attend to each other
in both directions, as T5X's prefill does with `decoder_causal_attention`; the
decoded tokens are causal either way.

Speculative decoding (Leviathan, Kalman & Matias, ICML 2023) needs the target to score
gamma + 1 tokens in one call (Algorithm 1, "run Mp in parallel") with every row at
its own position. `T5XDecoder` implements `DecodeModel` with one self-attention
cache per layer [B, T, H, D] that `extend` advances by a chunk of k tokens per row,
writing only the chunk's k slots (T5's scatter write); query j of row b (position
p = lengths[b] + j) attends to the slots t <= p, which is at once the causal mask
inside the chunk and the mask of the stale slots that `rewind` leaves.

Attention logits, softmax and the relative position bias are float32 whatever the
activation dtype; T5X's network computes them in its dtype (`float32_logits=False`),
so in bfloat16 the two differ by rounding (in float32 they agree to rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
from typing import Any

from flax import linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec.models import base, t5

Array = jax.Array

# The logical axes of every cached key/value array: [batch, length, heads, kv].
KV_CACHE_AXES = t5.KV_CACHE_AXES
# T5X's decoder-only inputs start with this id (seqio's DecoderFeatureConverter
# shifts the sequence right by one, inserting 0), and count non-zero ids as prompt.
BOS_ID = 0


@flax.struct.dataclass
class DecoderOnlyConfig:
  """Hyperparameters, with the field names and defaults of T5X's decoder-only
  `network.TransformerConfig`.

  Attributes:
    vocab_size: V, rows of the embedding and width of the logits.
    dtype: activation and cache dtype; parameters are cast to it where used.
    emb_dim: E, width of the residual stream.
    num_heads: H, attention heads.
    num_layers: decoder layers.
    head_dim: D, width of one head.
    mlp_dim: F, width of the MLP's hidden layer.
    mlp_activations: one activation per input projection, multiplied together
      (`('relu',)`, or `('gelu', 'linear')` for gated GELU), as `t5.T5Config`.
    dropout_rate: dropout during training; decoding never drops out.
    logits_via_embedding: True for logits through the transposed embedding scaled
      by emb_dim ** -0.5 (T5X's decoder-only gin files), False for `logits_dense`.
  """

  vocab_size: int
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 8
  num_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str | Callable[..., Array]] = ("relu",)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False


def _t5_config(cfg: DecoderOnlyConfig) -> t5.T5Config:
  """The `t5.T5Config` whose decoder layers, less cross-attention, are `cfg`'s."""
  return t5.T5Config(
    vocab_size=cfg.vocab_size,
    dtype=cfg.dtype,
    emb_dim=cfg.emb_dim,
    num_heads=cfg.num_heads,
    num_encoder_layers=cfg.num_layers,
    num_decoder_layers=cfg.num_layers,
    head_dim=cfg.head_dim,
    mlp_dim=cfg.mlp_dim,
    mlp_activations=cfg.mlp_activations,
    dropout_rate=cfg.dropout_rate,
    logits_via_embedding=cfg.logits_via_embedding,
  )


def check_config(cfg: DecoderOnlyConfig) -> None:
  """Raises TypeError/ValueError naming the first bad field of `cfg`."""
  if not isinstance(cfg, DecoderOnlyConfig):
    raise TypeError(f"config must be a t5x_decoder.DecoderOnlyConfig, got {type(cfg).__name__}")
  layers = cfg.num_layers
  if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
    raise ValueError(f"config.num_layers must be a positive int, got {layers!r}")
  # Every other field means what it means in T5's decoder, and is checked there.
  t5.check_config(_t5_config(cfg))


def _t5x_preset(**sizes) -> DecoderOnlyConfig:
  return DecoderOnlyConfig(
    vocab_size=t5.T5_VOCAB_SIZE,
    dtype=jnp.bfloat16,
    head_dim=64,
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.0,
    logits_via_embedding=True,
    **sizes,
  )


# The sizes of T5X's t5x/examples/decoder_only/models/{base,large,xl,xxl}.gin, in
# bfloat16 as there and without dropout, for inference: 109,628,544 / 341,231,104 /
# 1,223,527,424 / 4,762,310,656 parameters, as T5X's network has them (`jax.eval_shape`
# of its init; the counts in those files' first lines, 134,307,072 for base, are of an
# older network).
CONFIGS: dict[str, DecoderOnlyConfig] = {
  "base": _t5x_preset(emb_dim=768, num_heads=12, num_layers=12, mlp_dim=2048),
  "large": _t5x_preset(emb_dim=1024, num_heads=16, num_layers=24, mlp_dim=2816),
  "xl": _t5x_preset(emb_dim=2048, num_heads=32, num_layers=24, mlp_dim=5120),
  "xxl": _t5x_preset(emb_dim=4096, num_heads=64, num_layers=24, mlp_dim=10240),
}


def tiny_config(**overrides) -> DecoderOnlyConfig:
  """A small float32 config for tests and examples (emb 32, 2 heads of 8, 2 layers,
  gated GELU, vocab 64, untied logits); `overrides` replace any field."""
  cfg = DecoderOnlyConfig(
    vocab_size=64,
    dtype=jnp.float32,
    emb_dim=32,
    num_heads=2,
    num_layers=2,
    head_dim=8,
    mlp_dim=64,
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.0,
    logits_via_embedding=False,
  )
  return dataclasses.replace(cfg, **overrides)


# ------------------------------------------------------------------------------
# Masks and positions.
# ------------------------------------------------------------------------------
def prefix_lengths(inputs: Array) -> Array:
  """int32[B]: P_b, the prompt tokens of each row of T5X's decoder-only `inputs`
  [B, S] (its non-zero ids after the BOS); T5X's `initial_index`."""
  return jnp.sum(inputs[:, 1:] != 0, axis=-1).astype(jnp.int32)


def make_decoder_mask(
  decoder_target_tokens: Array,
  decoder_causal_attention: Array | None = None,
  decoder_segment_ids: Array | None = None,
) -> Array:
  """bool[B, 1, L, L]: T5X's decoder-only `layers.make_decoder_mask`.

  Causal, or both ways between positions where `decoder_causal_attention` is 1 (the
  prefix of a prefix LM); no padding targets (id 0); and, packed, same segment.
  """
  mask = t5.make_decoder_mask(decoder_target_tokens, decoder_segment_ids)
  if decoder_causal_attention is None:
    return mask
  both_ways = t5.make_attention_mask(decoder_causal_attention > 0, decoder_causal_attention > 0)
  targets = t5.make_attention_mask(decoder_target_tokens > 0, decoder_target_tokens > 0)
  if decoder_segment_ids is not None:
    targets &= t5.make_attention_mask(decoder_segment_ids, decoder_segment_ids, jnp.equal)
  return mask | (both_ways & targets)


# ------------------------------------------------------------------------------
# Layers.
# ------------------------------------------------------------------------------
class DecoderLayer(nn.Module):
  """Pre-norm self-attention and MLP, each with a residual connection.

  `__call__` is the full (training) pass; `extend` feeds a chunk against this
  layer's cache.
  """

  config: DecoderOnlyConfig

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = t5.LayerNorm(dtype=cfg.dtype)
    self.self_attention = t5.MultiHeadDotProductAttention(
      num_heads=cfg.num_heads,
      head_dim=cfg.head_dim,
      out_features=cfg.emb_dim,
      dtype=cfg.dtype,
      dropout_rate=cfg.dropout_rate,
    )
    self.pre_mlp_layer_norm = t5.LayerNorm(dtype=cfg.dtype)
    self.mlp = t5.MlpBlock(
      intermediate_dim=cfg.mlp_dim,
      activations=cfg.mlp_activations,
      intermediate_dropout_rate=cfg.dropout_rate,
      dtype=cfg.dtype,
    )
    self.dropout = nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))

  def _mlp(self, x: Array, deterministic: bool) -> Array:
    y = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return self.dropout(y, deterministic=deterministic) + x

  def __call__(self, inputs: Array, bias: Array, deterministic: bool) -> Array:
    """inputs: [B, L, E]; bias: float32 [B|1, H|1, L, L] -> [B, L, E]."""
    x = self.pre_self_attention_layer_norm(inputs)
    x = self.self_attention(x, x, bias, deterministic)
    x = self.dropout(x, deterministic=deterministic) + inputs
    return self._mlp(x, deterministic)

  def extend(
    self,
    inputs: Array,
    cache: tuple[Array, Array],
    positions: Array,
    bias: Array,
    deterministic: bool,
  ) -> tuple[Array, tuple[Array, Array]]:
    """Feeds a chunk against this layer's cache.

    Args:
      inputs: [B, k, E], the chunk's residual stream.
      cache: (key, value), each [B, T, H, D].
      positions: int32[B, k], the chunk's cache slots (those >= T are dropped).
      bias: float32 [B, H, k, T], relative position and visibility.
      deterministic: disables dropout.

    Returns:
      ([B, k, E], the cache with the chunk's keys and values written).
    """
    x = self.pre_self_attention_layer_norm(inputs)
    new_key, new_value = self.self_attention.project_kv(x)
    cache = (
      t5.write_cache(cache[0], new_key, positions),
      t5.write_cache(cache[1], new_value, positions),
    )
    x = self.self_attention.attend(x, *cache, bias, deterministic)
    x = self.dropout(x, deterministic=deterministic) + inputs
    return self._mlp(x, deterministic), cache


class Decoder(nn.Module):
  """The stack: embedding, layers, final norm, logits (T5X's decoder-only `Decoder`).

  `__call__` is T5X's full pass; `extend` is the functional chunked-cache interface
  that `T5XDecoder` uses.
  """

  config: DecoderOnlyConfig

  def setup(self):
    cfg = self.config
    self.token_embedder = t5.Embed(
      num_embeddings=cfg.vocab_size, features=cfg.emb_dim, dtype=cfg.dtype, attend_dtype=jnp.float32
    )
    self.relpos_bias = t5.RelativePositionBiases(num_heads=cfg.num_heads)
    self.layers = [DecoderLayer(config=cfg) for _ in range(cfg.num_layers)]
    self.decoder_norm = t5.LayerNorm(dtype=cfg.dtype)
    if not cfg.logits_via_embedding:
      # float32 logits, as in T5X, for a stable softmax.
      self.logits_dense = t5.DenseGeneral(
        cfg.vocab_size, dtype=jnp.float32, kernel_axes=("embed", "vocab")
      )
    self.dropout = nn.Dropout(rate=self.config.dropout_rate, broadcast_dims=(-2,))

  def _embed(self, tokens: Array, deterministic: bool) -> Array:
    y = self.token_embedder(tokens.astype(jnp.int32))
    return self.dropout(y, deterministic=deterministic).astype(self.config.dtype)

  def _logits(self, y: Array, deterministic: bool) -> Array:
    """y: [B, L, E] -> float32 logits [B, L, V]."""
    y = self.dropout(self.decoder_norm(y), deterministic=deterministic)
    if self.config.logits_via_embedding:
      return self.token_embedder.attend(y) / np.sqrt(y.shape[-1]).astype(np.float32)
    return self.logits_dense(y)

  def extend(
    self,
    tokens: Array,
    lengths: Array,
    caches: Sequence[tuple[Array, Array]],
    prefix: Array | None = None,
    logits: bool = True,
  ) -> tuple[Array | None, tuple[tuple[Array, Array], ...]]:
    """Feeds `tokens` [B, k] at positions lengths[b], lengths[b] + 1, ... of each row.

    Query j of row b (position p = lengths[b] + j) attends to the cache slots t <= p
    (causal inside the chunk; stale slots masked) and, with `prefix`, also to the
    slots t <= prefix[b] when p <= prefix[b] (T5X's bidirectional prefix). Without
    dropout.

    Args:
      tokens: int[B, k].
      lengths: int32[B], tokens already in each row's cache.
      caches: per layer, (key, value) [B, T, H, D].
      prefix: int32[B], the last position of each row's bidirectional prefix, or
        None for causal attention everywhere.
      logits: False skips the output layer (a prefill) and returns None for them.

    Returns:
      (float32 logits [B, k, V] or None, the caches with the chunk written).
    """
    capacity = caches[0][0].shape[1]
    query = lengths[:, None] + jnp.arange(tokens.shape[1])  # [B, k]
    key = jnp.arange(capacity)  # [T]
    visible = key[None, None, :] <= query[:, :, None]  # [B, k, T]
    if prefix is not None:
      in_prefix = prefix[:, None, None]
      visible |= (query[:, :, None] <= in_prefix) & (key[None, None, :] <= in_prefix)
    bias = self.relpos_bias(query, key, False) + t5.mask_to_bias(visible)[:, None]  # [B, H, k, T]
    y = self._embed(tokens, deterministic=True)
    new_caches = []
    for layer, cache in zip(self.layers, caches):
      y, cache = layer.extend(y, cache, query, bias, deterministic=True)
      new_caches.append(cache)
    return (self._logits(y, True) if logits else None), tuple(new_caches)

  def __call__(
    self,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    decoder_segment_ids: Array | None = None,
    decoder_positions: Array | None = None,
    decoder_causal_attention: Array | None = None,
    *,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: int | None = None,
    prefill: bool | None = None,
    prefill_lengths: Array | None = None,
  ) -> Array:
    """T5X's decoder-only call: float32 logits [B, L, V] of a full (teacher-forced)
    pass over `decoder_input_tokens` [B, L].

    `decoder_positions` is accepted and unused, as in T5X (relative positions are
    those of the token axis). T5X's one-token cache (`decode`, `prefill`) is not
    implemented: decode with `T5XDecoder` (as `specdec.t5x`'s
    `SpeculativeDecoderOnlyModel` does), or with T5X's own network and the same
    checkpoint.
    """
    del decoder_positions, max_decode_length, prefill_lengths
    if decode or prefill:
      raise ValueError(
        "decode/prefill: specdec.models.t5x_decoder.Transformer has no T5X "
        "one-token cache; decode with T5XDecoder (specdec.t5x."
        "SpeculativeDecoderOnlyModel) or with T5X's decoder_only network"
      )
    if decoder_input_tokens.ndim != 2:
      raise ValueError(
        f"decoder_input_tokens must be [batch, length], got shape {decoder_input_tokens.shape}"
      )
    deterministic = not enable_dropout
    positions = np.arange(decoder_input_tokens.shape[1])
    mask = make_decoder_mask(decoder_target_tokens, decoder_causal_attention, decoder_segment_ids)
    bias = self.relpos_bias(positions, positions, False)[None] + t5.mask_to_bias(mask)
    y = self._embed(decoder_input_tokens, deterministic)
    for layer in self.layers:
      y = layer(y, bias, deterministic)
    return self._logits(y, deterministic)


class Transformer(nn.Module):
  """T5X's decoder-only `network.DecoderWrapper`: the `Decoder` under 'decoder'.

  Attributes:
    config: a `DecoderOnlyConfig`.
  """

  config: DecoderOnlyConfig

  def setup(self):
    check_config(self.config)
    self.decoder = Decoder(config=self.config)

  def __call__(self, *args, **kwargs) -> Array:
    """`Decoder.__call__` (T5X's signature)."""
    return self.decoder(*args, **kwargs)

  def extend(self, *args, **kwargs):
    """`Decoder.extend`."""
    return self.decoder.extend(*args, **kwargs)


# ------------------------------------------------------------------------------
# Parameters.
# ------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=0)
def _init_variables(cfg: DecoderOnlyConfig, rng: Array) -> Mapping[str, Any]:
  ones = jnp.ones((1, 1), jnp.int32)
  return Transformer(cfg).init(rng, ones, ones, enable_dropout=False)


def init_variables(cfg: DecoderOnlyConfig, rng: Array) -> Mapping[str, Any]:
  """`Transformer(cfg).init`: {'params': ..., 'params_axes': ...} (T5X's init)."""
  check_config(cfg)
  return _init_variables(cfg, rng)


def init_params(cfg: DecoderOnlyConfig, rng: Array) -> dict[str, Any]:
  """Random parameters with T5X's initializers (float32 leaves)."""
  return init_variables(cfg, rng)["params"]


def param_shapes(cfg: DecoderOnlyConfig) -> dict[str, Any]:
  """The parameter tree of `cfg` as `jax.ShapeDtypeStruct`s, allocating nothing."""
  check_config(cfg)
  return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))


def param_count(cfg: DecoderOnlyConfig) -> int:
  """Number of parameters of `cfg` (from `param_shapes`)."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(param_shapes(cfg)))


def random_params(cfg: DecoderOnlyConfig, seed: int = 0, dtype: Any = np.float32) -> dict[str, Any]:
  """Random parameters drawn with numpy at T5X's initializer scales (see
  `t5.random_params`); compiles nothing, so it is fast at any size."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf) -> np.ndarray:
    last = path[-1].key
    if last == "scale":
      return np.ones(leaf.shape, dtype)
    if last == "embedding":
      std = 1.0
    else:
      std = 1.0 / np.sqrt(leaf.shape[-1] if last == "rel_embedding" else leaf.shape[0])
      if path[-2].key == "query":
        std /= np.sqrt(cfg.head_dim)
    return (rng.standard_normal(leaf.shape, np.float32) * std).astype(dtype)

  return jax.tree_util.tree_map_with_path(draw, param_shapes(cfg))


# ------------------------------------------------------------------------------
# The DecodeModel.
# ------------------------------------------------------------------------------
@flax.struct.dataclass
class DecoderState:
  """Decode state of `T5XDecoder`.

  Attributes:
    caches: per layer, self-attention (key, value), each [B, T, H, D]; slots at or
      past `lengths[b]` are stale.
    lengths: int32[B], tokens fed so far per row (the BOS and the prompt included).
  """

  caches: tuple[tuple[Array, Array], ...]
  lengths: Array


def state_logical_axes(state: DecoderState) -> DecoderState:
  """A tree like `state` whose leaves are `PartitionSpec`s of logical axis names."""
  spec = jax.sharding.PartitionSpec
  return DecoderState(
    caches=jax.tree.map(lambda _: spec(*KV_CACHE_AXES), state.caches),
    lengths=spec("batch"),  # type: ignore[arg-type]  # a spec tree, not an array
  )


@functools.partial(jax.jit, static_argnames=("cfg", "logits"))
def _extend(
  cfg: DecoderOnlyConfig,
  params: Any,
  tokens: Array,
  lengths: Array,
  caches: Any,
  prefix: Array | None = None,
  logits: bool = True,
):
  # Compiled once per config and shape: called eagerly (tests, a REPL), an unrolled
  # layer stack op by op is slow; the samplers trace it into their own program.
  return Transformer(cfg).apply(
    {"params": params}, tokens, lengths, caches, prefix, logits, method=Transformer.extend
  )


@functools.partial(jax.jit, static_argnums=(0, 5))
def _prefill(
  cfg: DecoderOnlyConfig,
  params: Any,
  inputs: Array,
  prefix: Array,
  caches: Any,
  bidirectional_prefix: bool,
):
  """The caches with every row's inputs[b, :P_b + 1] fed from position 0 (the prompt's
  last token included, which a bidirectional prefix sees): one forward over the
  shortest bucket that holds the longest row (`base.bucketed_prefill`)."""
  zeros = jnp.zeros((inputs.shape[0],), jnp.int32)
  visible = prefix if bidirectional_prefix else None

  def feed(tokens, caches):
    return _extend(cfg, params, tokens, zeros, caches, visible, logits=False)[1]

  return base.bucketed_prefill(feed, inputs, jnp.max(prefix) + 1, caches)


@flax.struct.dataclass
class T5XDecoder:
  """T5X's decoder-only network as a `specdec.models.base.DecodeModel`.

  `inputs` int[B, S] are T5X's (module docstring): BOS 0, row b's prompt at
  1..P_b, zeros after. `start_tokens(inputs)` is inputs[b, P_b], the prompt's last
  token; `init(inputs, max_length)` fills the cache with positions 0..P_b - 1 in one
  chunked pass (lengths start at P_b) and allocates S - 1 + max_length positions,
  enough for `max_length` more tokens at any P_b <= S - 1. Each `extend` then feeds
  k tokens per row at that row's own position, so the target scores gamma + 1
  drafted tokens in one call, and `rewind` moves rows back.

  Token ids must be in [0, V): concrete `inputs` / `tokens` outside raise ValueError
  naming them; traced ones (inside `jax.jit`, e.g. the samplers) are clipped into
  range by the embedding's gather.

  Chunks and single steps agree up to float rounding only (see `t5.T5.extend` for
  what that guarantees of greedy identity).

  Attributes:
    config: a `DecoderOnlyConfig` (static).
    params: the parameter tree (T5X's `target`, keys {'decoder'}), leaves float32 or
      bfloat16.
    bidirectional_prefix: (static) T5X's `inputs_bidirectional_attention`: positions
      0..P_b attend to each other both ways (a prefix LM).
  """

  config: DecoderOnlyConfig = flax.struct.field(pytree_node=False)
  params: Any
  bidirectional_prefix: bool = flax.struct.field(pytree_node=False, default=False)

  def __post_init__(self):
    check_config(self.config)
    if not isinstance(self.bidirectional_prefix, bool):
      raise TypeError(f"bidirectional_prefix must be a bool, got {self.bidirectional_prefix!r}")

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  def _check_params(self) -> None:
    if not isinstance(self.params, Mapping) or "decoder" not in self.params:
      found = (
        sorted(self.params) if isinstance(self.params, Mapping) else type(self.params).__name__
      )
      raise ValueError(
        f"params must be the parameter tree (key decoder), not a variables dict; got {found}"
      )

  def forward(
    self,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array,
    decoder_causal_attention: Array | None = None,
  ) -> Array:
    """T5X's full teacher-forced pass (`DecoderOnlyModel._compute_logits`): float32
    logits [B, L, V]; `decoder_causal_attention` only with `bidirectional_prefix`,
    as T5X passes it."""
    for name, tokens in (
      ("decoder_input_tokens", decoder_input_tokens),
      ("decoder_target_tokens", decoder_target_tokens),
    ):
      base.check_tokens(name, tokens, self.vocab_size)
    self._check_params()
    causal = decoder_causal_attention if self.bidirectional_prefix else None
    return self.module.apply(  # type: ignore[return-value]  # no mutable=: not a pair
      {"params": self.params},
      decoder_input_tokens,
      decoder_target_tokens,
      decoder_causal_attention=causal,
      enable_dropout=False,
    )

  def prefix_lengths(self, inputs: Array) -> Array:
    """int32[B]: P_b (`prefix_lengths`), after checking `inputs`."""
    base.check_tokens("inputs", inputs, self.vocab_size)
    return prefix_lengths(jnp.asarray(inputs))

  def start_tokens(self, inputs: Array) -> Array:
    """int32[B]: inputs[b, P_b], the last prompt token (the BOS 0 for no prompt)."""
    last = self.prefix_lengths(inputs)
    return jnp.take_along_axis(jnp.asarray(inputs), last[:, None], axis=1)[:, 0].astype(jnp.int32)

  def init(self, inputs: Array, max_length: int) -> DecoderState:
    """Fills positions 0..P_b - 1 of each row's cache; allocates S - 1 + max_length.

    `inputs` are fed in one chunk, cut to the shortest of `base.prefill_buckets(S)`
    that holds every row's prompt: a row's slots from P_b on hold its padding (stale:
    masked, then overwritten by `extend`), except that with `bidirectional_prefix`
    position P_b, the prompt's last token, is seen by the prefix as in T5X's
    prefill. Padding past the bucket is never computed.
    """
    prefix = self.prefix_lengths(inputs)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
      raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    self._check_params()
    cfg = self.config
    batch, length = inputs.shape
    shape = (batch, length - 1 + max_length, cfg.num_heads, cfg.head_dim)
    caches = tuple(
      (jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype)) for _ in range(cfg.num_layers)
    )
    if length <= base.PREFILL_BUCKET:
      _, caches = _extend(
        cfg,
        self.params,
        jnp.asarray(inputs),
        jnp.zeros((batch,), jnp.int32),
        caches,
        prefix if self.bidirectional_prefix else None,
        logits=False,
      )
    else:
      caches = _prefill(
        cfg, self.params, jnp.asarray(inputs), prefix, caches, self.bidirectional_prefix
      )
    return DecoderState(caches=caches, lengths=prefix)

  def extend(self, state: DecoderState, tokens: Array) -> tuple[Array, DecoderState]:
    """tokens: int[B, k] -> (float32 logits [B, k, V], state advanced by k).

    Writes only the chunk's k slots of each row; a row whose cache is full drops the
    keys it cannot store (the samplers size `init` so that this never happens).
    """
    base.check_tokens("tokens", tokens, self.vocab_size)
    base.check_chunk(tokens, *state.caches[0][0].shape[:2])
    self._check_params()
    logits, caches = _extend(
      self.config, self.params, jnp.asarray(tokens), state.lengths, state.caches
    )
    return logits, DecoderState(caches=caches, lengths=state.lengths + tokens.shape[1])

  def rewind(self, state: DecoderState, lengths: Array) -> DecoderState:
    """Rolls row b back to min(current, lengths[b]) tokens; stale slots are masked."""
    return dataclasses.replace(state, lengths=base.rewound(state.lengths, lengths))

  def lengths(self, state: DecoderState) -> Array:
    """int32[B], tokens fed so far per row."""
    return state.lengths
