"""Per-row random keys: a row's draws depend on its own key and iteration only.

The samplers' convention (`specdec.sample`), public so that whatever replays part of a
decode (the benchmarks' draft loop) draws what the decode draws.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def wrap_raw_key(rng: Array) -> Array:
  """A raw uint32 key array as a typed key: the default PRNG implementation's shape
  first (threefry: [..., 2]), else rbg's [..., 4] (`jax.random.key_impl` names)."""
  if rng.dtype != jnp.uint32:
    raise ValueError(
      "rng must be a PRNG key (jax.random.key or PRNGKey), or one per row; got "
      f"dtype {rng.dtype}, shape {rng.shape}"
    )
  try:
    return jax.random.wrap_key_data(rng)
  except (TypeError, ValueError) as default_error:
    if rng.shape[-1:] == (4,):
      return jax.random.wrap_key_data(rng, impl="rbg")
    raise ValueError(
      f"rng: a raw key of shape {rng.shape} fits no PRNG implementation "
      f"({default_error}); pass jax.random.key(...) or jax.random.PRNGKey(...)"
    ) from default_error


def row_keys(rng: Array, batch: int) -> Array:
  """One typed PRNG key per row, from one key (folded with the row index) or [B]."""
  if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = wrap_raw_key(rng)
  if rng.shape == ():
    return jax.vmap(lambda b: jax.random.fold_in(rng, b))(jnp.arange(batch))
  if rng.shape == (batch,):
    return rng
  raise ValueError(f"rng must be one key or one key per row ({batch}), got key shape {rng.shape}")


def iteration_keys(row_keys: Array, iterations: Array, num: int) -> Array:
  """[B] keys and per-row iteration counts -> [B, num] keys, fresh each iteration."""
  return jax.vmap(lambda k, i: jax.random.split(jax.random.fold_in(k, i), num))(
    row_keys, iterations
  )
