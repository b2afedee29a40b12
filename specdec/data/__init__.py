"""The paper's evaluation data and T5's vocabulary, shipped in the package, in plain Python.

Leviathan, Kalman & Matias (ICML 2023) measure speculative decoding on WMT EnDe and
CNN/DM (Table 2). This package holds the real test data for both (provenance in
`PROVENANCE.md` beside this file) and reads it with no TensorFlow: `python -m
specdec.run` uses it directly, and `specdec.tasks` wraps the same readers and
preprocessing in seqio tasks, so both see identical examples.

* `load_examples(task)`: the examples of a task, each {'inputs', 'targets', ...} with
  T5's text preprocessing ("translate English to German: ", "summarize: ") applied.
* `Vocabulary`: T5's SentencePiece vocabulary with its 100 sentinels, token for token
  what `seqio.SentencePieceVocabulary(VOCAB_FILE, extra_ids=100)` builds;
  `specdec.io.tokenizer.T5Tokenizer` is this vocabulary under the tokenizer protocol
  every shipped pair shares (`specdec.pretrained.load_pair`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import gzip
import json
import os
import pathlib

import numpy as np

DATA_DIR = pathlib.Path(__file__).resolve().parent
VOCAB_FILE = DATA_DIR / "t5_spm" / "spiece.model"
WMT14_EN_FILE = DATA_DIR / "wmt14_ende" / "newstest2014.en"
WMT14_DE_FILE = DATA_DIR / "wmt14_ende" / "newstest2014.de"
CNNDM_FILE = DATA_DIR / "cnndm" / "cnndm_test_frank250.jsonl"
# The German side of Multi30k train, for n-gram drafts (paper Table 3).
MULTI30K_TRAIN_DE_FILE = DATA_DIR / "multi30k" / "train.de.gz"

# T5's vocabulary: 32,000 pieces (pad 0, EOS 1, UNK 2) and 100 sentinel ids on top.
EXTRA_IDS = 100
PAD_ID = 0
EOS_ID = 1

# T5's task prefixes (Raffel et al. 2020, Appendix D; t5.data.preprocessors).
TRANSLATE_PREFIX = "translate English to German: "
SUMMARIZE_PREFIX = "summarize: "

WMT_TASK = "specdec_wmt14_ende"
CNNDM_TASK = "specdec_cnn_dailymail"
# The shipped files are test sets; they are the one split of the local tasks.
TEST_SPLIT = "test"


# ------------------------------------------------------------------------------
# Files.
# ------------------------------------------------------------------------------
def _existing_file(path: str | os.PathLike, name: str) -> pathlib.Path:
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{name}: no such file: {path}")
  return path


def read_lines(path: str | os.PathLike) -> list[str]:
  """The lines of a UTF-8 text file (gzip if it ends in .gz), without their newlines.

  Splits on '\\n' only: `str.splitlines` would also split inside a sentence at
  Unicode separators (U+2028, U+0085, ...), which real text contains.
  """
  path = _existing_file(path, "path")
  if path.suffix == ".gz":
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
      text = f.read()
  else:
    text = path.read_text(encoding="utf-8")
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  return lines


def read_parallel(
  source_file: str | os.PathLike, target_file: str | os.PathLike, source_key: str, target_key: str
) -> list[dict[str, str]]:
  """Line-aligned files -> [{source_key: line, target_key: line}, ...]."""
  sources = read_lines(_existing_file(source_file, "source_file"))
  targets = read_lines(_existing_file(target_file, "target_file"))
  if len(sources) != len(targets):
    raise ValueError(
      f"source_file {source_file} has {len(sources)} lines but "
      f"target_file {target_file} has {len(targets)}: not line-aligned"
    )
  return [{source_key: s, target_key: t} for s, t in zip(sources, targets)]


def read_jsonl(path: str | os.PathLike, fields: Sequence[str]) -> list[dict[str, str]]:
  """One JSON object a line -> [{field: value for field in fields}, ...]."""
  path = _existing_file(path, "path")
  examples = []
  for number, line in enumerate(read_lines(path), start=1):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{number}: not a JSON object: {e}") from e
    missing = [f for f in fields if f not in record]
    if missing:
      raise ValueError(f"{path}:{number}: missing field(s) {missing}")
    examples.append({f: record[f] for f in fields})
  return examples


# ------------------------------------------------------------------------------
# T5's preprocessing (the same strings the seqio tasks build with tf.strings).
# ------------------------------------------------------------------------------
def translate_en_de(example: Mapping[str, str]) -> dict[str, str]:
  """{'en', 'de'} -> {'inputs': 'translate English to German: ' + en, 'targets': de}."""
  return {"inputs": TRANSLATE_PREFIX + example["en"], "targets": example["de"]}


def summarize(example: Mapping[str, str]) -> dict[str, str]:
  """{'article', 'highlights'} -> {'inputs': 'summarize: ' + article, 'targets': ...}."""
  return {"inputs": SUMMARIZE_PREFIX + example["article"], "targets": example["highlights"]}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A task of the paper over the shipped files.

  Attributes:
    name: the task's name (also its seqio name).
    read: () -> raw examples, with the fields of the task's TFDS dataset.
    preprocess: raw example -> {'inputs': str, 'targets': str}.
    metric: 'bleu' or 'rouge', T5's metric of the task (`specdec.metrics`).
    tfds_name: the TFDS dataset with the same raw fields, for the full splits.
  """

  name: str
  read: Callable[[], list[dict[str, str]]]
  preprocess: Callable[[Mapping[str, str]], dict[str, str]]
  metric: str
  tfds_name: str


TASKS: dict[str, TaskSpec] = {
  WMT_TASK: TaskSpec(
    name=WMT_TASK,
    read=lambda: read_parallel(WMT14_EN_FILE, WMT14_DE_FILE, "en", "de"),
    preprocess=translate_en_de,
    metric="bleu",
    tfds_name="wmt14_translate/de-en:1.0.0",
  ),
  CNNDM_TASK: TaskSpec(
    name=CNNDM_TASK,
    read=lambda: read_jsonl(CNNDM_FILE, ("id", "article", "highlights")),
    preprocess=summarize,
    metric="rouge",
    tfds_name="cnn_dailymail:3.4.0",
  ),
}


def task_spec(task: str) -> TaskSpec:
  """The `TaskSpec` named `task`; ValueError listing the known names otherwise."""
  if task not in TASKS:
    raise ValueError(f"task: unknown task {task!r}; known tasks: {sorted(TASKS)}")
  return TASKS[task]


def load_examples(task: str, split: str = TEST_SPLIT) -> list[dict[str, str]]:
  """The preprocessed examples of `task`: raw fields plus 'inputs' and 'targets'."""
  spec = task_spec(task)
  if split != TEST_SPLIT:
    raise ValueError(
      f"split: the shipped data of {task} is its {TEST_SPLIT!r} split only, got {split!r}"
    )
  return [{**raw, **spec.preprocess(raw)} for raw in spec.read()]


# ------------------------------------------------------------------------------
# The vocabulary.
# ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _processor(model_file: str, extra_ids: int):
  """A SentencePieceProcessor of `model_file` with `extra_ids` sentinels appended.

  The sentinels are added to the model as user-defined pieces `▁<extra_id_i>`, the
  last piece being extra_id_0, exactly as seqio does: that makes them ids
  32000..32099 both when encoding ("<extra_id_0>" in text) and when decoding.
  """
  import sentencepiece
  from sentencepiece import sentencepiece_model_pb2

  # The protobuf-generated module has no type information: ModelProto is unknown.
  proto = sentencepiece_model_pb2.ModelProto  # type: ignore[attr-defined]  # generated
  model = proto.FromString(_existing_file(model_file, "model_file").read_bytes())
  for i in reversed(range(extra_ids)):
    model.pieces.add(piece=f"▁<extra_id_{i}>", score=0.0, type=proto.SentencePiece.USER_DEFINED)
  processor = sentencepiece.SentencePieceProcessor()
  processor.LoadFromSerializedProto(model.SerializeToString())
  return processor


class Vocabulary:
  """T5's SentencePiece vocabulary (pad 0, EOS 1, UNK 2) with `extra_ids` sentinels.

  Encodes and decodes as `seqio.SentencePieceVocabulary(model_file, extra_ids)`:
  `decode` stops after the first EOS and maps ids past the vocabulary (the model's
  embedding is padded to 32,128) to UNK.
  """

  def __init__(self, model_file: str | os.PathLike = VOCAB_FILE, extra_ids: int = EXTRA_IDS):
    if isinstance(extra_ids, bool) or not isinstance(extra_ids, int) or extra_ids < 0:
      raise ValueError(f"extra_ids must be an int >= 0, got {extra_ids!r}")
    self.model_file = str(_existing_file(model_file, "model_file"))
    self.extra_ids = extra_ids

  @property
  def _sp(self):
    return _processor(self.model_file, self.extra_ids)

  @property
  def vocab_size(self) -> int:
    """Pieces plus sentinels (32,100 for T5)."""
    return self._sp.GetPieceSize()

  def encode(self, text: str) -> list[int]:
    """text -> ids, without EOS."""
    if not isinstance(text, str):
      raise TypeError(f"text must be a str, got {type(text).__name__}")
    return self._sp.EncodeAsIds(text)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """ids -> text, up to the first EOS; padding decodes to nothing."""
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID) + 1]
    unk, size = self._sp.unk_id(), self.vocab_size
    return self._sp.DecodeIds([unk if i >= size else i for i in ids])

  def encode_padded(self, text: str, length: int) -> np.ndarray:
    """int32[length]: ids trimmed to length - 1, then EOS, then padding 0.

    seqio's `append_eos_after_trim` followed by the padding of T5X's feature
    converter.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
      raise ValueError(f"length must be an int >= 2 (room for a token and EOS), got {length!r}")
    ids = self.encode(text)[: length - 1] + [EOS_ID]
    out = np.full((length,), PAD_ID, np.int32)
    out[: len(ids)] = ids
    return out
