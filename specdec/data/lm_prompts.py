"""Chat prompts for a decoder-only target, built deterministically from shipped text.

    from specdec.data import lm_prompts
    train, evaluation = lm_prompts.split()
    ids = lm_prompts.encode(tokenizer, evaluation[0])   # chat template applied
    inputs = lm_prompts.right_pad([ids], pad_id)        # int32[1, S]

Three shipped sources (provenance and licences in `specdec/data/PROVENANCE.md` and the
multi30k_ende model card), each with its own instructions:

* newstest2014 English sources: "Translate to German: ...", "Continue this text: ...",
  "Explain in simple words: ...";
* CNN/DailyMail test articles, cut to their first sentences: "Summarize: ...",
  "What is this article about? ...";
* Multi30k test_2016 English captions: "Describe this scene in more detail: ...",
  "Write a short story that begins: ...", "Translate to German: ...".

`DEMO_PROMPTS` are the demo's: written for it in English, none taken from those
sources, so that no draft was distilled or tuned on them.

Every source text gets each of its source's instructions (so one text gives 2-3
prompts). The evaluation split holds out whole source texts, a fixed stride of each
source, so no evaluation text appears in any training prompt under any instruction;
`split` checks that. Orders are fixed (a seeded permutation), so a prefix of the
training list is a balanced mix of sources and instructions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import re
from typing import Any

import numpy as np

from specdec import data

MULTI30K_EN_FILE = data.DATA_DIR.parent / "weights" / "multi30k_ende" / "test_2016_flickr.en"

INSTRUCTIONS = {
  "wmt": ("Translate to German: ", "Continue this text: ", "Explain in simple words: "),
  "cnndm": ("Summarize: ", "What is this article about? "),
  "multi30k": (
    "Describe this scene in more detail: ",
    "Write a short story that begins: ",
    "Translate to German: ",
  ),
}
SOURCES = tuple(INSTRUCTIONS)
# CNN/DM articles are cut to this many sentences, so that chat prompts stay short
# (about 150 tokens with SmolLM2's template at 3 sentences).
CNNDM_SENTENCES = 3
CNNDM_MAX_CHARS = 600
# Every HOLDOUT_STRIDE-th text of each source (from HOLDOUT_OFFSET) is held out for
# evaluation; the evaluation prompts are drawn from those texts only.
HOLDOUT_STRIDE = 10
HOLDOUT_OFFSET = 7
EVAL_PROMPTS = 64
SEED = 0

# The demo's chat prompts (`python -m specdec.bench demo`): what a 135M instruct model
# answers well -- short explanations, a summary, a continuation -- in English.
# Written for the demo, outside `SOURCES`: no distillation or evaluation prompt holds
# them (tests/test_demo.py checks), so the demo's alpha is measured on unseen text.
DEMO_PROMPTS = (
  "Explain in simple words why the sky is blue.",
  "What is photosynthesis? Explain it in two sentences.",
  "Give three tips for staying healthy.",
  "Summarize in one sentence: Bees visit flowers to collect nectar and pollen. As "
  "they move from flower to flower, they carry pollen with them, which helps plants "
  "make seeds and fruit. Without bees, many of the foods we eat would be much "
  "harder to grow.",
  "Explain in simple words how a rainbow forms.",
  "Continue this text: Once upon a time, in a small village by the sea, there lived",
  "Why do we need to sleep? Answer briefly.",
  "Explain what a computer program is to a child.",
)


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One user message and where it came from.

  Attributes:
    content: the user message (instruction + text).
    source: one of `SOURCES`.
    index: the text's index in its source.
    instruction: the instruction's index in `INSTRUCTIONS[source]`.
  """

  content: str
  source: str
  index: int
  instruction: int

  @property
  def text(self) -> str:
    """The source text, without the instruction."""
    return self.content[len(INSTRUCTIONS[self.source][self.instruction]) :]

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def first_sentences(
  text: str, count: int = CNNDM_SENTENCES, max_chars: int = CNNDM_MAX_CHARS
) -> str:
  """The first `count` sentences of `text` (whitespace collapsed), fewer if they pass
  `max_chars`, and at least the first sentence cut to whole words within `max_chars`."""
  sentences = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
  out = sentences[0]
  for sentence in sentences[1:count]:
    if len(out) + 1 + len(sentence) > max_chars:
      break
    out += " " + sentence
  if len(out) > max_chars:
    out = out[:max_chars].rsplit(" ", 1)[0]
  return out


def source_texts(source: str) -> list[str]:
  """The texts of one shipped source, in file order."""
  if source == "wmt":
    return data.read_lines(data.WMT14_EN_FILE)
  if source == "cnndm":
    return [first_sentences(r["article"]) for r in data.read_jsonl(data.CNNDM_FILE, ("article",))]
  if source == "multi30k":
    return data.read_lines(MULTI30K_EN_FILE)
  raise ValueError(f"source: unknown source {source!r}; have {list(SOURCES)}")


def is_heldout(index: int) -> bool:
  """Whether text `index` of a source belongs to the evaluation split."""
  return index % HOLDOUT_STRIDE == HOLDOUT_OFFSET


def all_prompts(sources: Sequence[str] = SOURCES) -> list[Prompt]:
  """Every (text, instruction) prompt of `sources`, in source and file order."""
  out = []
  for source in sources:
    for index, text in enumerate(source_texts(source)):
      if not text.strip():
        continue
      for k, instruction in enumerate(INSTRUCTIONS[source]):
        out.append(Prompt(instruction + text, source, index, k))
  return out


def _round_robin(prompts: Sequence[Prompt], seed: int) -> list[Prompt]:
  """The prompts shuffled within each source, then taken from the sources in turn, so
  that every prefix mixes the sources (CNN/DM, the smallest, runs out first)."""
  rng = np.random.default_rng(seed)
  queues = {}
  for source in SOURCES:
    mine = [p for p in prompts if p.source == source]
    queues[source] = [mine[i] for i in rng.permutation(len(mine))]
  out = []
  while any(queues.values()):
    for source in SOURCES:
      if queues[source]:
        out.append(queues[source].pop())
  return out


def split(
  num_eval: int = EVAL_PROMPTS, seed: int = SEED, fits: Callable[[str], bool] | None = None
) -> tuple[list[Prompt], list[Prompt]]:
  """(training prompts, evaluation prompts), both in a fixed mixed order.

  Args:
    num_eval: evaluation prompts (the first of the held-out texts' prompts, one
      instruction per text, sources and instructions taken in turn).
    seed: the order.
    fits: keeps only prompts whose content passes (e.g. a token-length limit).

  Raises:
    AssertionError: a held-out text appears in a training prompt (never: the split
      is by text, and this checks it).
  """
  prompts = [p for p in all_prompts() if fits is None or fits(p.content)]
  # A held-out text that recurs elsewhere in a source (short news lines, captions)
  # is held out there too.
  heldout_texts = {p.text for p in prompts if is_heldout(p.index)}
  train = _round_robin([p for p in prompts if p.text not in heldout_texts], seed)
  heldout = _round_robin([p for p in prompts if is_heldout(p.index)], seed + 1)
  evaluation: list[Any] = []
  seen: set[Any] = set()
  for p in heldout:
    # One prompt per held-out text, so that the evaluation covers more texts.
    if (p.source, p.index) not in seen and len(evaluation) < num_eval:
      seen.add((p.source, p.index))
      evaluation.append(p)
  check_disjoint(train, evaluation)
  return train, evaluation


def check_disjoint(train: Sequence[Prompt], evaluation: Sequence[Prompt]) -> None:
  """Raises AssertionError when an evaluation prompt's source text (by position or by
  content) is in a training prompt."""
  places = {(p.source, p.index) for p in train}
  texts = {p.text for p in train}
  leaked = [p for p in evaluation if (p.source, p.index) in places or p.text in texts]
  assert not leaked, f"evaluation texts in training prompts: {leaked[:3]}"


def encode(tokenizer, content: str) -> list[int]:
  """The chat-template ids of one user message, ready for the assistant's answer."""
  return tokenizer.apply_chat_template(
    [{"role": "user", "content": content}], add_generation_prompt=True
  )


def right_pad(prompts: Any, pad_id: int | None, length: int | None = None) -> np.ndarray:
  """int32[N, S]: token-id prompts right-padded with `pad_id` to `length` (None: the
  longest), `llama.Llama`'s convention for ragged prompts.

  Raises ValueError when a prompt ends with `pad_id` (it would be read as padding),
  when prompts differ in length and `pad_id` is None, or when one exceeds `length`.
  """
  prompts = [np.asarray(p, np.int64).reshape(-1) for p in prompts]
  if not prompts or any(p.size == 0 for p in prompts):
    raise ValueError("prompts: need at least one prompt, each of at least one token")
  longest = max(p.size for p in prompts)
  length = longest if length is None else length
  if longest > length:
    raise ValueError(f"prompts: a prompt of {longest} tokens exceeds length {length}")
  if pad_id is None and any(p.size != length for p in prompts):
    raise ValueError("prompts: of different lengths, but there is no pad_id")
  out = np.full((len(prompts), length), 0 if pad_id is None else pad_id, np.int32)
  for i, p in enumerate(prompts):
    if pad_id is not None and p[-1] == pad_id:
      raise ValueError(
        f"prompts: prompt {i} ends with pad_id={pad_id}, which would be read as padding"
      )
    out[i, : p.size] = p
  return out
