"""The roofline a decode step is held to: what streaming its weight matrices once
costs on this machine (`python -m specdec.bench costs`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec import costs


@functools.partial(jax.jit, static_argnums=0)
def _stream_all(
  transposed: tuple[bool, ...], weights: tuple[jax.Array, ...], x: jax.Array
) -> jax.Array:
  total = jnp.zeros((), jnp.float32)
  for w, t in zip(weights, transposed):
    v = jnp.resize(x, (w.shape[1] if t else w.shape[0],))
    y = w @ v if t else v @ w
    total = total + y[0]
  return total


def weight_stream_seconds(
  matrices: dict[str, tuple[jax.Array, bool]], repeats: int = 5
) -> tuple[float, int]:
  """The roofline a decode step is held to: (seconds, bytes) of one matrix-vector
  product through each of `matrices` ({name: (w, transposed)}: w [in, out], or
  [out, in] when transposed, such as a tied embedding), all in one compiled
  program, minimum over `repeats`.

  XLA's matrix-vector path streams a matrix at about the machine's memory bandwidth,
  so this is what reading a step's weights once costs here, with no attention,
  norms or cache work: a one-token step can approach it from above, and verifying k
  tokens for v(k) ~ 1 means staying near it.
  """
  transposed = tuple(t for _, t in matrices.values())
  weights = tuple(w for w, _ in matrices.values())
  nbytes = sum(int(w.size) * w.dtype.itemsize for w in weights)
  x = jnp.ones((8,), jnp.float32)
  jax.block_until_ready(_stream_all(transposed, weights, x))
  return costs.min_seconds(lambda: _stream_all(transposed, weights, x), repeats), nbytes
