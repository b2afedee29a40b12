"""The shipped model pairs: trained offline by `scripts/train_pair.py`, loaded in one line.

    target, draft, vocab = specdec.pretrained.load_pair("multi30k_ende")

`multi30k_ende` is a T5 v1.1 target and two much smaller T5 v1.1 drafts of one
architecture, all trained from scratch on Multi30k English->German with T5's
SentencePiece vocabulary: `draft` on the German references, `draft_distilled` on the
target's own greedy outputs (sequence-level distillation), which it predicts far
better at temperature 0 and worse at temperature 1 (`best_draft`); the model
card (`specdec/weights/multi30k_ende/MODEL_CARD.md`) gives data, sizes, training and
measured quality and acceptance. Weights are stored in bfloat16 in the T5X checkpoint
layout (`specdec.checkpoints.load_t5x`) and loaded in float32 by default: XLA's CPU
bfloat16 is emulated and slow.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp

from specdec import checkpoints, data
from specdec.models import t5

WEIGHTS_DIR = pathlib.Path(__file__).resolve().parent / "weights"
PAIRS = ("multi30k_ende",)


def vocab_path() -> str:
  """The shipped T5 SentencePiece model."""
  return str(data.VOCAB_FILE)


def pair_dir(name: str) -> pathlib.Path:
  if name not in PAIRS:
    raise ValueError(f"name: unknown pair {name!r}; shipped pairs: {list(PAIRS)}")
  path = WEIGHTS_DIR / name
  if not (path / "pair.json").is_file():
    raise FileNotFoundError(f"name: the weights of {name!r} are missing from {path}")
  return path


def pair_info(name: str = "multi30k_ende") -> dict[str, Any]:
  """The pair's metadata: configs, checkpoint paths, training summary, measurements."""
  with open(pair_dir(name) / "pair.json") as f:
    return json.load(f)


def _config(fields: dict[str, Any], dtype) -> t5.T5Config:
  return t5.T5Config(**dict(fields, dtype=dtype,
                            mlp_activations=tuple(fields["mlp_activations"]),
                            dropout_rate=0.0))


def drafts(name: str = "multi30k_ende") -> tuple[str, ...]:
  """The drafts a pair ships ('draft', then any others such as 'draft_distilled')."""
  info = pair_info(name)
  return tuple(k for k in info if k.startswith("draft") and isinstance(info[k], dict)
               and "checkpoint" in info[k])


def best_draft(name: str = "multi30k_ende", temperature: float = 0.0,
               metrics: dict[str, Any] | None = None) -> str:
  """The shipped draft with the highest measured alpha on the pair's own test set at
  this temperature (0 or 1, the two measured; others use the nearer), from the model
  card's measurements (or `metrics`, in its layout, while they are being measured);
  'draft' when none are recorded."""
  if metrics is None:
    metrics = pair_info(name).get("metrics", {})
  key = "0" if temperature < 0.5 else "1"
  alphas = {d: metrics.get("alpha", {}).get(d, {}).get("multi30k_test_2016", {}).get(key)
            for d in drafts(name)}
  alphas = {d: a for d, a in alphas.items() if a is not None}
  return max(alphas, key=alphas.get) if alphas else "draft"


# Chunks up to this long verify faster with per-position output layers on a CPU
# (`scripts/bench_verify.py`: 2-6 per position, 7 even, 8 one product).
CPU_PER_POSITION_LOGITS = 6


def load_model(name: str, which: str, dtype=jnp.float32,
               per_position_logits: int | None = None) -> t5.T5:
  """One model of a pair ('target' or 'draft') as a `DecodeModel`.

  `per_position_logits` (`T5.per_position_logits`): None chooses
  `CPU_PER_POSITION_LOGITS` for the target on a CPU backend, where it makes the
  verification of up to 6 tokens up to twice as fast (`scripts/bench_verify.py`), and
  0 otherwise; the draft's output layer is small enough for one product.
  """
  info = pair_info(name)
  if which not in ("target",) + drafts(name):
    raise ValueError(f"which must be one of {['target', *drafts(name)]}, got {which!r}")
  cfg = _config(info[which]["config"], dtype)
  params = checkpoints.load_t5x(str(pair_dir(name) / info[which]["checkpoint"]), cfg,
                                dtype=dtype)
  # On the device once: numpy leaves would be copied in again on every jit call
  # (tens of MB per decode, as long as several decoded tokens on a CPU).
  if per_position_logits is None:
    per_position_logits = (CPU_PER_POSITION_LOGITS if which == "target"
                           and jax.default_backend() == "cpu" else 0)
  return t5.T5(cfg, jax.device_put(params), per_position_logits=per_position_logits)


def load_pair(name: str = "multi30k_ende", dtype=jnp.float32,
              per_position_logits: int | None = None, draft: str = "draft"):
  """(target, draft, vocabulary): two `T5` DecodeModels and T5's SentencePiece vocab.

  `draft`: which shipped draft (`drafts(name)`; `best_draft(name, temperature)` picks
  by measured acceptance). `per_position_logits`: see `load_model` (None: the
  target's on a CPU).
  """
  if draft not in drafts(name):
    raise ValueError(f"draft must be one of {list(drafts(name))}, got {draft!r}")
  return (load_model(name, "target", dtype, per_position_logits),
          load_model(name, draft, dtype, per_position_logits),
          data.Vocabulary())


def test_sentences(name: str = "multi30k_ende", split: str = "test_2016_flickr"
                   ) -> list[tuple[str, str]]:
  """(English, German reference) pairs shipped with the pair."""
  info = pair_info(name)
  if split not in info["test_sets"]:
    raise ValueError(f"split: {split!r} is not shipped; have {sorted(info['test_sets'])}")
  base = pair_dir(name)
  en = data.read_lines(base / info["test_sets"][split]["en"])
  de = data.read_lines(base / info["test_sets"][split]["de"])
  return list(zip(en, de))
