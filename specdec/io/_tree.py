"""The parameter trees every checkpoint format maps onto: nested dicts of numpy arrays
keyed like `decoder/layers_0/self_attention/key/kernel`, and the checks shared by the
readers (a missing key, an unexpected key or a wrong shape named with both shapes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flax import traverse_util
import jax.numpy as jnp
import numpy as np

Params = dict[str, Any]
DTypeLike = Any


def join_key(path: Iterable[str]) -> str:
  return "/".join(path)


def flatten(tree: Mapping[str, Any]) -> dict[str, Any]:
  return {join_key(k): v for k, v in traverse_util.flatten_dict(tree).items()}


def unflatten(flat: Mapping[str, Any]) -> Params:
  return traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})


def float_dtype(dtype: DTypeLike | None) -> np.dtype | None:
  """`dtype` as a numpy float dtype (None stays None: keep the stored dtypes)."""
  if dtype is None:
    return None
  try:
    result = jnp.dtype(dtype)
  except TypeError as e:
    raise TypeError(f"dtype: {dtype!r} is not a dtype") from e
  if not jnp.issubdtype(result, jnp.floating):
    raise ValueError(f"dtype must be a float dtype, got {result}")
  return result


def check_flat(
  found: Mapping[str, tuple[int, ...]],
  expected: Mapping[str, tuple[int, ...]],
  describe: Callable[[str], str],
) -> None:
  """Checks flat {key: shape} against the expected one; `describe(key)` names a key.

  Raises:
    ValueError: naming the first missing key, unexpected key or mismatched shape,
      with both shapes.
  """
  for key in sorted(expected):
    if key not in found:
      raise ValueError(f"missing key {describe(key)}: the config expects shape {expected[key]}")
  for key in sorted(found):
    if key not in expected:
      raise ValueError(
        f"unexpected key {describe(key)} with shape "
        f"{tuple(found[key])}: not a parameter of this config"
      )
    if tuple(found[key]) != expected[key]:
      raise ValueError(
        f"shape mismatch for {describe(key)}: the checkpoint has "
        f"{tuple(found[key])}, the config expects {expected[key]}"
      )
