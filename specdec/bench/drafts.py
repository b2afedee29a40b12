"""The drafts the benchmarks compare beside a pair's own: Table 3's n-gram drafts and
layer-skipping self-speculative drafts, and the corpora the n-grams count.

Leviathan, Kalman & Matias (2023), Table 3, list a unigram and a bigram draft for
every target; `ngram_drafts` is the one place they are built (add-1 smoothing,
`specdec.drafts.ngram`), from one of three corpora: a T5 pair's training-side text
(`t5_corpus`), a decoder-only pair's shipped text without the held-out prompts'
texts (`lm_text_corpus`), or any target's own greedy outputs on other prompts
(`target_output_corpus`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec import data, pretrained
from specdec.bench.inputs import batched
from specdec.data.lm_prompts import right_pad
from specdec.distributions import SamplingConfig
from specdec.drafts import ngram
from specdec.sample import autoregressive_sample

NGRAM_DRAFTS = ("unigram", "bigram")
# The decoder-only pairs' n-gram text: CNN/DM articles and German newstest2014.
LM_TEXT_SOURCES = ((data.CNNDM_TASK, "article"), (data.WMT_TASK, "de"))
# A layer-skipping draft's name: "skip:<comma-separated layer indices>".
SKIP_PREFIX = "skip:"


def ngram_drafts(
  corpus: Sequence[Sequence[int]],
  vocab_size: int,
  names: Sequence[str] = NGRAM_DRAFTS,
  start_token: int | None = 0,
) -> dict[str, Any]:
  """{name: draft} for `names` of 'unigram' / 'bigram', counted over `corpus` (token
  sequences). `start_token`: the bigram's context before a sequence's first token
  (T5's decoder start 0; None where the sequences begin with the target's own start
  token, as `target_output_corpus`'s do)."""
  out = {}
  for name in names:
    if name == "unigram":
      out[name] = ngram.Unigram.from_corpus(corpus, vocab_size)
    elif name == "bigram":
      out[name] = ngram.Bigram.from_corpus(corpus, vocab_size, start_token=start_token)
    else:
      raise ValueError(f"drafts: unknown n-gram draft {name!r}; have {NGRAM_DRAFTS}")
  return out


def t5_corpus(
  vocab, task: str, examples: Sequence[Mapping[str, str]] = (), limit: int | None = None
) -> list[list[int]]:
  """A T5 pair's n-gram text, ids of each text then EOS: the shipped Multi30k German
  training captions for the German tasks, the articles of `examples` (those not
  measured) for 'cnndm'."""
  if task == "cnndm":
    lines = [e["inputs"][len(data.SUMMARIZE_PREFIX) :] for e in examples]
  else:
    lines = data.read_lines(data.MULTI30K_TRAIN_DE_FILE)
  return [vocab.encode(s) + [data.EOS_ID] for s in lines[:limit]]


def lm_text_corpus(tokenizer, eos_id: int, exclude: Sequence[str] = ()) -> list[list[int]]:
  """Token streams of the shipped text (`LM_TEXT_SOURCES`), each ended by EOS;
  examples whose first 64 characters occur in a string of `exclude` (the held-out
  prompts) are left out."""
  corpus = []
  for task, field in LM_TEXT_SOURCES:
    for example in data.load_examples(task):
      text = example[field]
      if text and any(text[:64] in e for e in exclude):
        continue
      corpus.append(tokenizer.encode(text, add_special_tokens=False) + [eos_id])
  return corpus


def target_output_corpus(
  target,
  prompts: Sequence[Sequence[int]] | np.ndarray,
  eos_id: int,
  max_new_tokens: int,
  batch: int,
) -> list[list[int]]:
  """Per prompt, [the target's start token, its greedy output up to and including
  EOS]: what a draft sees and must predict when drafting for the target (build the
  bigram with start_token=None)."""
  if isinstance(prompts, np.ndarray):
    inputs = prompts
  else:
    inputs = right_pad(prompts, getattr(target, "pad_id", None))
  corpus = []
  greedy = SamplingConfig(temperature=0.0)
  for x, size in batched(inputs, batch):
    out = autoregressive_sample(
      target, x, jax.random.key(0), max_new_tokens=max_new_tokens, sampling=greedy, eos_id=eos_id
    )
    start = np.asarray(target.start_tokens(x))
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    corpus += [[int(start[b])] + tokens[b, : lengths[b]].tolist() for b in range(size)]
  return corpus


def layer_skip_draft(target, name: str):
  """The target without some decoder layers ("skip:3,5"): the self-speculative drafts
  of Zhang et al. ("Draft & Verify", arXiv:2309.08168), over the target's own
  arrays (`llama.Llama.with_layers`). Raises ValueError naming a malformed name."""
  num_layers = target.config.num_layers
  try:
    skip = sorted({int(i) for i in name[len(SKIP_PREFIX) :].split(",")})
  except ValueError:
    skip = []
  if not skip or skip[0] < 0 or skip[-1] >= num_layers or len(skip) == num_layers:
    raise ValueError(
      f"drafts: {name!r} must list some but not all of the layer "
      f"indices 0..{num_layers - 1} after {SKIP_PREFIX!r}"
    )
  return target.with_layers([i for i in range(num_layers) if i not in skip])


def build(
  names: Sequence[str], workload, corpus: list[list[int]] | None, start_token: int | None
) -> dict[str, Any]:
  """The drafts named: the workload's own (already loaded), another shipped draft
  of its pair, a "skip:..." layer-skipping draft, or an n-gram draft of `corpus`."""
  out = {}
  for name in names:
    if name in workload.drafts:
      out[name] = workload.drafts[name]
    elif name in NGRAM_DRAFTS:
      if corpus is None:
        raise ValueError(f"drafts: {name!r} needs an n-gram corpus")
      out.update(ngram_drafts(corpus, workload.target.vocab_size, [name], start_token))
    elif name.startswith(SKIP_PREFIX):
      out[name] = layer_skip_draft(workload.target, name)
    elif workload.pair in pretrained.LM_PAIRS:
      out[name] = pretrained.load_pair(workload.pair, draft=name)[1]
    elif workload.pair in pretrained.PAIRS:
      out[name] = pretrained.load_model(workload.pair, name)
    else:
      raise ValueError(
        f"drafts: unknown draft {name!r} for {workload.pair}; have "
        f"{list(workload.drafts)}, {list(NGRAM_DRAFTS)} and "
        f"'{SKIP_PREFIX}<layers>'"
      )
  return out
