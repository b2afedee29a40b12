"""Writes a T5 pair's output shortlist: the ids its drafts may propose.

    python scripts/research/shortlist_pair.py [--name=multi30k_ende]

The Multi30k drafts were trained to write German captions: the ids of the training
targets (Multi30k train's German side, tokenized as `train_pair.encode_pairs` does,
truncated to 47 ids before EOS) and PAD are the tokens they were taught to output. Cutting
their output layer to those N columns (`specdec.drafts.shortlist.t5_output_shortlist`)
leaves q the full draft's distribution conditioned on the list, which Algorithm 1
accepts as any other q (Appendix A.1: lossless), at N / V of the output layer's
product; a greedy draft step takes its argmax over the N logits alone.

Writes `specdec/weights/<name>/shortlist.json` ({"ids": sorted ids, "source", the
share of tokens the list holds in the shipped test references}) and names it under
each draft of `pair.json` ("shortlist"), which `specdec.pretrained` reads; its size,
source and coverage go into `pair.json` ("output_shortlist") for the model card.
"""

from __future__ import annotations

import json

from absl import app, flags
import numpy as np

from specdec import data, pretrained
from specdec.models import t5

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined when run as a command only."""
  flags.DEFINE_string("name", "multi30k_ende", "The T5 pair.")
  flags.DEFINE_integer("max_target", 48, "Training targets' length (with EOS).")


def shortlist_ids(sentences, vocab, max_target: int) -> np.ndarray:
  """int32[N], sorted: every id of the tokenized `sentences` (+ EOS), and PAD."""
  targets = [vocab.encode(s) for s in sentences]
  ids = {data.PAD_ID, data.EOS_ID}
  for t in targets:
    ids.update(t[: max_target - 1])
  return np.asarray(sorted(ids), np.int32)


def coverage(ids: np.ndarray, sentences, vocab) -> float:
  """Share of the tokens of `sentences` (+ one EOS each) that `ids` holds."""
  inside = set(ids.tolist())
  tokens = [t for s in sentences for t in vocab.encode(s) + [data.EOS_ID]]
  return float(np.mean([t in inside for t in tokens]))


def main(argv):
  del argv
  name = FLAGS.name
  if name in pretrained.LM_PAIRS:
    raise app.UsageError(f"{name} is a decoder-only pair (its draft has its own list)")
  vocab = pretrained.load_tokenizer(name)
  train = [s for s in data.read_lines(data.MULTI30K_TRAIN_DE_FILE) if s.strip()]
  ids = shortlist_ids([s.strip() for s in train], vocab, FLAGS.max_target)
  refs = pretrained.test_sentences(name)
  test = coverage(ids, [r for _, r in refs], vocab)
  directory = pretrained.pair_dir(name)
  record = {
    "ids": ids.tolist(),
    "source": (
      "every id of Multi30k train's German side (29,000 captions, "
      "tokenized and truncated as the drafts were trained), EOS and "
      "PAD"
    ),
    "size": int(ids.size),
    "vocab_size": t5.T5_VOCAB_SIZE,
    "test_2016_reference_coverage": test,
  }
  (directory / pretrained.SHORTLIST_FILE).write_text(json.dumps(record) + "\n")
  info = pretrained.pair_info(name)
  for draft in pretrained.drafts(name):
    info[draft]["shortlist"] = pretrained.SHORTLIST_FILE
  info["output_shortlist"] = {k: v for k, v in record.items() if k != "ids"}
  (directory / "pair.json").write_text(json.dumps(info, indent=2) + "\n")
  print(f"{name}: {ids.size} ids, test_2016 references {100 * test:.2f} % on the list")


if __name__ == "__main__":
  define_flags()
  app.run(main)
