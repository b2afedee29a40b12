"""Proposers: what drafts x_1..x_gamma and q_1..q_gamma (step 1 of Algorithm 1).

`Proposer` is the one protocol the decode loop calls. `as_proposer` turns what users
pass as `draft` into one: a `DecodeModel` (a small model, `ContextLookup`,
`Shortlist`, a layer-skipped `Llama`, an n-gram table) becomes a `ModelProposer`; a
feature draft (`specdec.drafts.eagle.FeatureDraft`) a `FeatureProposer`; a
`Proposer` is used as it is.
"""

from __future__ import annotations

from typing import Any

from specdec.drafts.base import (
  CatchesUp,
  FeatureModel,
  FeatureReader,
  ModelProposer,
  ModelProposerState,
  Proposal,
  Proposer,
  check_target,
)
from specdec.drafts.feature import FeatureProposer, FeatureProposerState
from specdec.models.base import DecodeModel


def as_proposer(draft: Any) -> Proposer:
  """`draft` as a `Proposer`, or a TypeError naming `draft`."""
  from specdec.drafts import eagle

  if isinstance(draft, (ModelProposer, FeatureProposer)):
    return draft
  if isinstance(draft, eagle.FeatureDraft):
    return FeatureProposer(draft)
  if isinstance(draft, DecodeModel):
    return ModelProposer(draft)
  if isinstance(draft, Proposer):
    return draft
  raise TypeError(
    f"draft must implement specdec.models.DecodeModel or "
    f"specdec.drafts.Proposer, got {type(draft).__name__}"
  )


__all__ = [
  "CatchesUp",
  "FeatureModel",
  "FeatureProposer",
  "FeatureProposerState",
  "FeatureReader",
  "ModelProposer",
  "ModelProposerState",
  "Proposal",
  "Proposer",
  "as_proposer",
  "check_target",
]
