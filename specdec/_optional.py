"""Optional dependencies: imported at the call that needs them, or a clear ImportError.

specdec's base install runs the sampler and the shipped T5 pair (jax, flax, numpy,
tensorstore, sentencepiece). Every other third-party package belongs to an extra named
after a task (pyproject.toml's `[project.optional-dependencies]`, the README's table):

    lm           the SmolLM2 pair, GGUF files and Hugging Face Llama checkpoints
    checkpoints  reading and writing your own Hugging Face and Orbax checkpoints
    t5x          the gin configs, seqio tasks and their metrics
    hf           the comparison with transformers (torch)
    bench        every `python -m specdec.bench` subcommand

Each optional import in the library goes through `require`, so a missing package
raises an `ImportError` that names the extra that installs it, e.g.
`pip install 'specdec[lm]'`.
"""

from __future__ import annotations

import importlib
import types

__all__ = ["EXTRAS", "install_command", "require"]

EXTRAS = ("lm", "checkpoints", "t5x", "hf", "bench")


def install_command(*extras: str) -> str:
  """`pip install 'specdec[a]'` (or 'specdec[b]' ...) for the given extras."""
  if not extras or any(e not in EXTRAS for e in extras):
    raise ValueError(f"extras: each must be one of {EXTRAS}, got {extras!r}")
  return " or ".join(f"pip install 'specdec[{e}]'" for e in extras)


def require(module: str, *extras: str, purpose: str | None = None) -> types.ModuleType:
  """`importlib.import_module(module)`, or an ImportError naming the extra(s).

  Args:
    module: the dotted module to import (e.g. 'safetensors.numpy').
    *extras: the extras of specdec that install it, the task's own first.
    purpose: what needs it, for the message (e.g. 'reading GGUF files').

  Raises:
    ValueError: `extras` empty or not all of `EXTRAS`.
    ImportError: the module (or a package it needs) is missing; the message names
      `pip install 'specdec[<extra>]'` and chains the original error.
  """
  command = install_command(*extras)
  try:
    return importlib.import_module(module)
  except ImportError as e:
    top = module.split(".")[0]
    what = f"{purpose} needs" if purpose else "specdec needs"
    raise ImportError(f"{what} the optional package `{top}` ({e}): {command}", name=top) from e
