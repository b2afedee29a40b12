"""T5 pairs (family "t5"): a T5 v1.1 target and smaller T5 v1.1 drafts of one
vocabulary, in T5X checkpoints (bfloat16 values, loaded in float32 by default: XLA's
CPU bfloat16 is emulated and slow), and T5's SentencePiece tokenizer."""

from __future__ import annotations

import json
from typing import Any

import jax

from specdec import data
from specdec.io import tokenizer as tokenizer_lib
from specdec.models import t5
from specdec.pretrained.registry import PairSpec, pair_dir


def vocab_path() -> str:
  """The shipped T5 SentencePiece model."""
  return str(data.VOCAB_FILE)


# Chunks up to this long verify faster with per-position output layers on a CPU
# (2-6 per position, 7 even, 8 one product, measured on the shipped target).
CPU_PER_POSITION_LOGITS = 6


def _t5_config(fields: dict[str, Any], dtype) -> t5.T5Config:
  return t5.T5Config(
    **dict(fields, dtype=dtype, mlp_activations=tuple(fields["mlp_activations"]), dropout_rate=0.0)
  )


def load_model(
  spec: PairSpec, which: str, dtype, per_position_logits: int | None, shortlist: bool = True
):
  """`specdec.pretrained.load_model` of a T5 pair (`which` already checked): a `t5.T5`
  from its T5X checkpoint, its weights packed or `per_position_logits` chosen as
  `specdec.pretrained.load_model` says, and its output layer cut to its shortlist
  where it has one and `shortlist` asks for it."""
  from specdec.io import t5x

  name, info = spec.name, spec.metadata
  cfg = _t5_config(info[which]["config"], dtype)
  params = t5x.load_t5x(str(pair_dir(name) / spec.checkpoints[which]), cfg, dtype=dtype)
  # On the device once: numpy leaves would be copied in again on every jit call
  # (tens of MB per decode, as long as several decoded tokens on a CPU).
  chosen = per_position_logits is None
  if per_position_logits is None:
    per_position_logits = (
      CPU_PER_POSITION_LOGITS if which == "target" and jax.default_backend() == "cpu" else 0
    )
  model = t5.T5(cfg, jax.device_put(params), per_position_logits=per_position_logits)
  model = model.with_packed_weights() if chosen else model
  listed = info[which].get("shortlist")
  if shortlist and listed:
    from specdec.drafts import shortlist as shortlist_lib

    ids = json.loads((pair_dir(name) / listed).read_text())["ids"]
    return shortlist_lib.t5_output_shortlist(model, ids)
  return model


def load_pair(
  spec: PairSpec, dtype, per_position_logits: int | None, draft: str, shortlist: bool = True
):
  """`specdec.pretrained.load_pair`'s (target, draft, tokenizer) of a T5 pair (`draft`
  already checked)."""
  return (
    load_model(spec, "target", dtype, per_position_logits),
    load_model(spec, draft, dtype, per_position_logits, shortlist),
    tokenizer_lib.T5Tokenizer(),
  )


def load_tokenizer(spec: PairSpec) -> tokenizer_lib.T5Tokenizer:
  """The tokenizer of a T5 pair: T5's SentencePiece model."""
  del spec
  return tokenizer_lib.T5Tokenizer()
