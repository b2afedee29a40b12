"""The three held-out evaluation sets of a SmolLM2 draft, and their loader.

    python scripts/research/lm_eval_sets.py      # (re)writes the derived sets

Each is a JSONL file in `specdec/data/eval_sets/` (provenance in its PROVENANCE.md),
one object a line with `content` (the user message) and where it came from:

* `chat.jsonl`: generic chat prompts written for this set by hand (questions,
  how-tos, explanations, advice, short writing, lists, simple code, translations,
  summaries of a given paragraph); none comes from a data set, and no training prompt
  shares a word 8-gram with one (`lm_chat_prompts.overlapping`).
* `cnndm_summaries.jsonl`: summaries of the CNN/DM test articles held out of every
  shipped SmolLM2 draft's training (`specdec.data.lm_prompts.is_heldout`: every 10th
  article from the 8th), two passages each (the opening sentences, and the sentences
  after them, which no prompt has ever held), with instructions written here (none is
  a training instruction).
* `smollm2_eval_prompts.jsonl`: the 64 evaluation prompts the shipped draft was
  measured on (`specdec/weights/smollm2_135m_instruct/eval_prompts.jsonl`), a
  byte-for-byte copy, frozen here so that a new draft's `package` stage (which rewrites
  the shipped file) cannot change the set that shows no regression.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shutil

from specdec import data
from specdec.data import lm_prompts

EVAL_DIR = data.DATA_DIR / "eval_sets"
SETS = dict(
  chat="chat.jsonl", cnndm="cnndm_summaries.jsonl", eval_prompts="smollm2_eval_prompts.jsonl"
)
SHIPPED_EVAL_PROMPTS = (
  data.DATA_DIR.parent / "weights" / "smollm2_135m_instruct" / "eval_prompts.jsonl"
)
# Today's set, as copied (so that a changed shipped file is noticed).
SHIPPED_EVAL_PROMPTS_SHA256 = "1b4646f9a0de7c183278f78f0d3f2e5877d50e5c60b70df8c2cf38e03c694464"

# Instructions of the summarization set: none is one of `lm_prompts.INSTRUCTIONS`.
CNNDM_INSTRUCTIONS = (
  "Summarize this news article in two or three sentences:\n\n",
  "Write a short summary of the following news excerpt:\n\n",
)
# Sentences of each passage, and its length at most (about 200 tokens).
CNNDM_PASSAGE_SENTENCES = 6
CNNDM_PASSAGE_CHARS = 900


def path(name: str) -> pathlib.Path:
  if name not in SETS:
    raise ValueError(f"name: unknown evaluation set {name!r}; have {list(SETS)}")
  return EVAL_DIR / SETS[name]


def load(name: str) -> list[dict]:
  """The prompts of one set (`SETS`), in file order: dicts with `content`."""
  with open(path(name), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def contents(name: str) -> list[str]:
  return [p["content"] for p in load(name)]


def sentences(text: str) -> list[str]:
  """`text`'s sentences (whitespace collapsed), split as `lm_prompts` splits them."""
  return [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s]


def passage(parts: list[str], max_chars: int = CNNDM_PASSAGE_CHARS) -> str:
  """Whole sentences from the start of `parts` within `max_chars` (at least one)."""
  out = parts[0]
  for s in parts[1:]:
    if len(out) + 1 + len(s) > max_chars:
      break
    out += " " + s
  return out


def cnndm_prompts() -> list[dict]:
  """Two prompts per held-out CNN/DM test article: its opening sentences with the
  first instruction, and the next sentences with the second."""
  rows = data.read_jsonl(data.CNNDM_FILE, ("article", "id"))
  out = []
  n = CNNDM_PASSAGE_SENTENCES
  for index, row in enumerate(rows):
    if not lm_prompts.is_heldout(index):
      continue
    parts = sentences(row["article"])
    for k, (lo, hi) in enumerate(((0, n), (n, 2 * n))):
      if len(parts) <= lo:
        continue
      out.append(
        dict(
          content=CNNDM_INSTRUCTIONS[k] + passage(parts[lo:hi]),
          source="cnndm",
          index=index,
          id=row["id"],
          passage=k,
          first_sentence=lo,
        )
      )
  return out


def sha256(file: pathlib.Path) -> str:
  return hashlib.sha256(file.read_bytes()).hexdigest()


def write_jsonl(file: pathlib.Path, rows: list[dict]) -> None:
  with open(file, "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main() -> None:
  write_jsonl(path("cnndm"), cnndm_prompts())
  shutil.copyfile(SHIPPED_EVAL_PROMPTS, path("eval_prompts"))
  for name in SETS:
    print(name, len(load(name)), sha256(path(name)))


if __name__ == "__main__":
  main()
