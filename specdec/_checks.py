"""Argument checks shared by the samplers: each bad argument raises an error naming it."""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax.numpy as jnp
import numpy as np

from specdec.distributions import SamplingConfig
from specdec.models.base import DecodeModel, check_token_ids


def check_positive_int(name: str, value: Any) -> int:
  """`value` as an int >= 1 (Python or numpy integer), or an error naming `name`."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
  if value < 1:
    raise ValueError(f"{name} must be >= 1, got {value}")
  return int(value)


def check_lenience(lenience: Any) -> float:
  """`lenience` as a float in (0, 1], or a ValueError naming it (Appendix A.5)."""
  if (
    isinstance(lenience, (bool, np.bool_))
    or not isinstance(lenience, numbers.Real)
    or math.isnan(lenience)
    or not 0.0 < float(lenience) <= 1.0
  ):
    raise ValueError(
      f"lenience must be a number in (0, 1] (1: exact Algorithm 1), got {lenience!r}"
    )
  return float(lenience)


def check_common(
  model: DecodeModel,
  name: str,
  inputs: Any,
  max_new_tokens: Any,
  sampling: Any,
  eos_id: Any,
  check_ids: bool = True,
) -> None:
  """Raises naming the bad argument. `check_ids` False skips reading the inputs' ids
  back (for a second model of the same vocabulary size: already checked)."""
  if not isinstance(model, DecodeModel):
    raise TypeError(f"{name} must implement specdec.models.DecodeModel, got {type(model).__name__}")
  check_positive_int("max_new_tokens", max_new_tokens)
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(f"sampling must be a specdec.SamplingConfig, got {type(sampling).__name__}")
  sampling.validate_vocab(model.vocab_size)
  shape, dtype = getattr(inputs, "shape", None), getattr(inputs, "dtype", None)
  if shape is None or dtype is None:
    raise TypeError(f"inputs must be an integer array [B, S], got {type(inputs).__name__}")
  if len(shape) != 2:
    raise ValueError(f"inputs must have rank 2 [B, S], got shape {tuple(shape)}")
  if not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f"inputs must have an integer dtype, got {dtype}")
  if shape[0] < 1 or shape[1] < 1:
    raise ValueError(f"inputs must be non-empty, got shape {tuple(shape)}")
  # Concrete ids are checked here, before the models are traced (inside the decode's
  # jit they cannot raise, and clip instead).
  if check_ids:
    check_token_ids("inputs", inputs, model.vocab_size)
  if eos_id is not None:
    if isinstance(eos_id, (bool, np.bool_)) or not isinstance(eos_id, numbers.Integral):
      raise TypeError(f"eos_id must be an int or None, got {eos_id!r}")
    if not 0 <= int(eos_id) < model.vocab_size:
      raise ValueError(f"eos_id must be in [0, {model.vocab_size}), got {eos_id}")
