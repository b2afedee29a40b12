"""The demo's inputs (`python -m specdec.bench demo`): one small set per task of the
paper's Table 2 (Leviathan et al. 2023), none of them text a shipped draft was
trained or tuned on.

* EnDe: the Multi30k test_2016 sentences shipped with the T5 pair (its drafts were
  trained on Multi30k train only).
* CNN/DM: `CNNDM_ARTICLES`, articles of the shipped CNN/DailyMail test subset
  (`specdec/data/PROVENANCE.md`) that the SmolLM2 draft never saw: the draft's
  prompts (`specdec.data.lm_prompts.split`) hold out every tenth article
  (`lm_prompts.is_heldout`), and 18 of those 25 make the pair's evaluation prompts
  (`eval_prompts.jsonl`, on which its context lookup was tuned); the demo takes the
  other seven, in file order.
* Chat: `lm_prompts.DEMO_PROMPTS`, written for the demo.
"""

from __future__ import annotations

from specdec import data
from specdec.data import lm_prompts

# Indices in `data.CNNDM_FILE` of the held-out articles outside the SmolLM2 pair's
# evaluation prompts (tests/test_demo.py checks both).
CNNDM_ARTICLES = (17, 67, 77, 117, 167, 187, 207)
SUMMARIZE = "Summarize: "
# An article is cut to its first sentences, so that a prompt stays within one pad
# length (about 250 tokens with SmolLM2's chat template).
ARTICLE_SENTENCES = 6
ARTICLE_MAX_CHARS = 900


def cnndm_articles(count: int) -> list[str]:
  """The first `count` of `CNNDM_ARTICLES`, each cut to its first sentences."""
  if not 1 <= count <= len(CNNDM_ARTICLES):
    raise ValueError(f"num_articles must be in [1, {len(CNNDM_ARTICLES)}], got {count}")
  records = data.read_jsonl(data.CNNDM_FILE, ("article",))
  return [
    lm_prompts.first_sentences(records[i]["article"], ARTICLE_SENTENCES, ARTICLE_MAX_CHARS)
    for i in CNNDM_ARTICLES[:count]
  ]


def cnndm_prompts(count: int) -> list[str]:
  """User messages asking for a summary of each of `cnndm_articles(count)`."""
  return [SUMMARIZE + a for a in cnndm_articles(count)]


def chat_prompts(count: int) -> list[str]:
  """The first `count` of `lm_prompts.DEMO_PROMPTS`."""
  if not 1 <= count <= len(lm_prompts.DEMO_PROMPTS):
    raise ValueError(f"num_prompts must be in [1, {len(lm_prompts.DEMO_PROMPTS)}], got {count}")
  return list(lm_prompts.DEMO_PROMPTS[:count])
