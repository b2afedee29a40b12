"""What the subcommands decode: a pair of `DecodeModel`s and its prompts.

A `--pair` is a shipped pair (`specdec.pretrained.list_pairs()`: a T5 translation
pair or a decoder-only chat pair) or one of the toy pairs `TOY_PAIRS` (random tiny
models and random prompts, for tests and dry runs: the numbers mean nothing, the
bookkeeping is the same). Every subcommand sees the models through the
`DecodeModel` protocol alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
from typing import Any

import jax
import numpy as np

from specdec import data, pretrained
from specdec.data.lm_prompts import right_pad

# Toy pairs: (family, vocabulary size, EOS id, pad id).
TOY_PAIRS = {"toy_llama": ("llama", 97, 2, 0), "toy_t5": ("t5", 64, 1, 0)}


@dataclasses.dataclass
class Workload:
  """A target, its drafts and its prompts.

  Attributes:
    pair: the pair's name.
    family: 'llama' (decoder-only, right-padded prompts) or 't5' (encoder inputs).
    target: the target `DecodeModel`.
    drafts: {name: draft `DecodeModel`}, same vocabulary.
    inputs: int32[N, S] prompts (T5: encoder ids; LM: chat ids right-padded with
      the target's pad_id), one shape for the whole set.
    eos_id: the id that ends a row.
    decode: ids -> text (None for toy pairs).
    references: the reference outputs (translations), or None.
    metric: 'bleu' / 'rouge' for `references`, or None.
    texts: the prompts' text, for the JSON (the user messages, or the sources).
  """

  pair: str
  family: str
  target: Any
  drafts: dict[str, Any]
  inputs: np.ndarray
  eos_id: int
  decode: Callable[[Sequence[int]], str] | None = None
  references: list[str] | None = None
  metric: str | None = None
  texts: list[str] | None = None


def is_lm_pair(pair: str) -> bool:
  return pair in pretrained.LM_PAIRS or TOY_PAIRS.get(pair, ("",))[0] == "llama"


def check_pair(pair: str) -> None:
  known = list(dict.fromkeys([*pretrained.PAIRS, *pretrained.LM_PAIRS, *TOY_PAIRS]))
  if pair not in known:
    raise ValueError(f"pair: unknown pair {pair!r}; have {known}")


def toy_models(pair: str, seed: int = 0) -> tuple[Any, Any]:
  """(target, draft) of a toy pair: random tiny models of one vocabulary (the draft
  smaller), float32."""
  family, vocab, _, pad = TOY_PAIRS[pair]
  if family == "llama":
    from specdec.models import llama

    models = []
    for layers, s in ((2, seed), (1, seed + 1)):
      cfg = llama.tiny_config(vocab_size=vocab, num_layers=layers)
      models.append(llama.Llama(cfg, jax.device_put(llama.random_params(cfg, seed=s)), pad_id=pad))
    return tuple(models)
  from specdec.models import t5

  models = []
  for layers, s in ((2, seed), (1, seed + 1)):
    cfg = t5.tiny_config(
      "1.1", vocab_size=vocab, num_encoder_layers=layers, num_decoder_layers=layers
    )
    models.append(t5.T5(cfg, jax.device_put(t5.random_params(cfg, seed=s))))
  return tuple(models)


def toy_inputs(pair: str, num: int, length: int = 8, seed: int = 0) -> np.ndarray:
  """int32[num, length] random prompts of a toy pair (ids above EOS and pad; T5's
  end with EOS, as encoded sources do)."""
  family, vocab, eos, _ = TOY_PAIRS[pair]
  rng = np.random.default_rng(seed)
  out = rng.integers(3, vocab, size=(num, length)).astype(np.int32)
  if family == "t5":
    out[:, -1] = eos
  return out


def chat_ids(tokenizer, messages: Sequence[str]) -> list[list[int]]:
  """Each user message with the chat template and the assistant's generation prompt."""
  return [
    list(
      tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True)
    )
    for m in messages
  ]


def load(
  pair: str,
  num: int,
  *,
  draft: str = "draft",
  input_length: int = 48,
  task: str = "multi30k",
  seed: int = 0,
) -> Workload:
  """The pair's target and draft ('draft' under `draft`'s name: a shipped draft, "+lookup"
  for a decoder-only pair's context lookup) and its first `num` held-out prompts.

  T5 pairs read `task`: 'multi30k' (the pair's own test sentences), 'wmt_ende' or
  'cnndm' (`specdec.data`), encoded and padded to `input_length`. Decoder-only pairs
  read their held-out chat prompts (`pretrained.lm_eval_prompts`), right-padded to
  the longest.
  """
  check_pair(pair)
  if num < 1:
    raise ValueError(f"num: need at least one prompt, got {num}")
  if pair in TOY_PAIRS:
    family, _, eos, _ = TOY_PAIRS[pair]
    target, small = toy_models(pair, seed)
    return Workload(pair, family, target, {draft: small}, toy_inputs(pair, num, seed=seed), eos)
  if pair in pretrained.LM_PAIRS:
    target, model, tok = pretrained.load_pair(pair, draft=draft)
    messages = list(pretrained.lm_eval_prompts(pair))[:num]
    inputs = right_pad(chat_ids(tok, messages), target.pad_id)
    return Workload(
      pair, "llama", target, {draft: model}, inputs, tok.eos_id, decode=tok.decode, texts=messages
    )
  target, model, vocab = pretrained.load_pair(pair, draft=draft)
  examples = task_examples(task, pair)[:num]
  inputs = np.stack([vocab.encode_padded(e["inputs"], input_length) for e in examples])
  return Workload(
    pair,
    "t5",
    target,
    {draft: model},
    inputs.astype(np.int32),
    data.EOS_ID,
    decode=vocab.decode,
    references=[e["targets"] for e in examples],
    metric=TASK_METRICS[task],
    texts=[e["inputs"] for e in examples],
  )


TASK_METRICS = {"multi30k": "bleu", "wmt_ende": "bleu", "cnndm": "rouge"}


def task_examples(task: str, pair: str) -> list[dict[str, str]]:
  """A T5 task's examples, each {'inputs': text with T5's prefix, 'targets': text}."""
  if task == "multi30k":
    return [
      dict(inputs=data.TRANSLATE_PREFIX + en, targets=de)
      for en, de in pretrained.test_sentences(pair)
    ]
  if task in ("wmt_ende", "cnndm"):
    return data.load_examples({"wmt_ende": data.WMT_TASK, "cnndm": data.CNNDM_TASK}[task])
  raise ValueError(f"task: unknown task {task!r}; have {sorted(TASK_METRICS)}")


def texts_of(workload: Workload, outputs: Sequence[Any]) -> list[str] | None:
  """The decoded text of each [1, ...] `SampleOutput` (None without a tokenizer)."""
  if workload.decode is None:
    return None
  return [workload.decode(np.asarray(o.tokens)[0, : int(o.lengths[0])].tolist()) for o in outputs]
