"""Whole decodes timed side by side: seconds per generated token, each decoder
compiled first, then the decoders timed in turn in each round (minimum per input), so
that a slow spell of a shared machine falls on all of them alike."""

from __future__ import annotations

from collections.abc import Callable
import time

import jax
import numpy as np

from specdec._checks import check_positive_int
from specdec.outputs import SampleOutput


def time_decodes(
  decode: Callable[[jax.Array, jax.Array], SampleOutput],
  inputs: list[jax.Array],
  key: jax.Array,
  repeats: int = 1,
) -> tuple[float, list[SampleOutput]]:
  """Seconds per generated token over `inputs` (each [1, S]), and the outputs.

  Each input is decoded once untimed (compiling if needed, and giving the output) and
  then `repeats` times timed; the time per token is the sum over inputs of each
  one's minimum time, over the total tokens. `time_decodes_paired` times several
  decoders in turn.
  """
  return time_decodes_paired({"decode": decode}, inputs, key, repeats)["decode"]


def time_each(
  decoders: dict[str, Callable[[jax.Array, jax.Array], SampleOutput]],
  inputs: list[jax.Array],
  key: jax.Array,
  repeats: int = 3,
) -> dict[str, tuple[list[float], list[SampleOutput]]]:
  """Per input, each decoder once untimed (compiling if needed, and giving the
  output), then `repeats` rounds timing each in turn, so that a slow spell of a shared
  machine falls on all of them alike. Returns, per decoder, (the minimum seconds of
  each input, the outputs)."""
  check_positive_int("repeats", repeats)
  out = {name: ([], []) for name in decoders}
  for i, x in enumerate(inputs):
    k = jax.random.fold_in(key, i)
    for name, decode in decoders.items():
      out[name][1].append(jax.block_until_ready(decode(x, k)))
    best = {name: float("inf") for name in decoders}
    for _ in range(repeats):
      for name, decode in decoders.items():
        start = time.perf_counter()
        jax.block_until_ready(decode(x, k).tokens)
        best[name] = min(best[name], time.perf_counter() - start)
    for name in decoders:
      out[name][0].append(best[name])
  return out


def time_decodes_paired(
  decoders: dict[str, Callable[[jax.Array, jax.Array], SampleOutput]],
  inputs: list[jax.Array],
  key: jax.Array,
  repeats: int = 3,
) -> dict[str, tuple[float, list[SampleOutput]]]:
  """`time_decodes` for several decoders side by side (`time_each`). Returns, per
  decoder, (seconds per generated token: the sum over inputs of the minimum times
  over its tokens, outputs)."""
  timed = time_each(decoders, inputs, key, repeats)
  return {
    name: (sum(seconds) / max(int(sum(np.sum(o.lengths) for o in outs)), 1), outs)
    for name, (seconds, outs) in timed.items()
  }
