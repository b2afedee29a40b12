"""Random-weight T5 presets for shape benchmarks (`python -m specdec.bench costs
--target-config`), and the multiply-adds of a T5 decoder step (Theorem 3.11's c-hat)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from specdec.models import t5


def t5_shape_config(name: str, vocab_size: int = t5.T5_VOCAB_SIZE) -> t5.T5Config:
  """A `t5.CONFIGS` preset (or 'tiny'): float32 on a CPU (XLA:CPU's bfloat16 is
  emulated), the preset's bfloat16 elsewhere. Raises naming an unknown `name`."""
  if name == "tiny":
    return t5.tiny_config("1.1", vocab_size=vocab_size)
  if name not in t5.CONFIGS:
    raise ValueError(f"config: unknown T5 config {name!r}; have 'tiny' and {sorted(t5.CONFIGS)}")
  cfg = t5.CONFIGS[name]
  if jax.default_backend() == "cpu":
    cfg = cfg.replace(dtype=jnp.float32)
  return cfg


def random_t5_params(cfg: t5.T5Config, seed: int) -> Any:
  """Random weights for shape benchmarks: numpy's float32 draw on a CPU; on an
  accelerator drawn there, in the config's dtype (bfloat16 for the presets), as
  inference stores them (`t5.device_random_params`)."""
  if jax.default_backend() == "cpu":
    return jax.device_put(t5.random_params(cfg, seed=seed))
  return t5.device_random_params(cfg, seed=seed)


def decode_ops_per_token(cfg) -> int:
  """Multiply-adds of one decoder step of a T5 config (the encoder runs once per
  input and is left out): per layer the self-attention's q, k, v, o projections,
  the cross-attention's q and o (its k, v are computed once from the encoder), the
  MLP; then the logits layer. Attention over the cache is not counted (it is small
  next to the projections at the paper's lengths)."""
  inner = cfg.num_heads * cfg.head_dim
  per_layer = (
    4 * cfg.emb_dim * inner
    + 2 * cfg.emb_dim * inner
    + (len(cfg.mlp_activations) + 1) * cfg.emb_dim * cfg.mlp_dim
  )
  return int(cfg.num_decoder_layers * per_layer + cfg.emb_dim * cfg.vocab_size)
