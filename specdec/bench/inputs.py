"""Benchmark inputs: the translation pair's encoded sources in batches, and length
buckets, a few static input shapes so that a run over a whole test set compiles a
handful of times, not once per input length. (Decoder-only prompts are padded by
`specdec.data.lm_prompts.right_pad`.)"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from specdec import data


def encode_sources(vocab, sentences, length: int) -> np.ndarray:
  """int32[N, length]: the task prefix, the sentence, EOS, padding (one shape)."""
  return np.stack([vocab.encode_padded(data.TRANSLATE_PREFIX + s, length) for s in sentences])


def batched(inputs: np.ndarray, batch: int):
  """(inputs [batch, L], real rows): the last batch is filled with copies of row 0."""
  for start in range(0, len(inputs), batch):
    chunk = inputs[start : start + batch]
    size = len(chunk)
    if size < batch:
      chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - size, axis=0)])
    yield jnp.asarray(chunk), size


def bucket_lengths(max_length: int, smallest: int = 16) -> tuple[int, ...]:
  """Powers of two from `smallest` below `max_length`, then `max_length` itself."""
  if max_length < 2:
    raise ValueError(f"max_length must be >= 2, got {max_length}")
  out, n = [], smallest
  while n < max_length:
    out.append(n)
    n *= 2
  return tuple(out) + (max_length,)


def pad_to_bucket(ids: Any, buckets: tuple[int, ...], pad_id: int = 0) -> np.ndarray:
  """int32[1, L]: `ids` (EOS included) right-padded with `pad_id` (0, T5's padding, by
  default; a `llama.Llama`'s own pad_id for its prompts) to the smallest bucket L that
  holds them; ids longer than the largest bucket raise ValueError."""
  ids = np.asarray(ids, np.int32).reshape(-1)
  for length in buckets:
    if ids.size <= length:
      out = np.full((1, length), pad_id, np.int32)
      out[0, : ids.size] = ids
      return out
  raise ValueError(f"ids: {ids.size} tokens exceed the largest bucket {buckets[-1]}")
