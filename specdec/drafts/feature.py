"""A draft that reads the target's features (EAGLE), as a `Proposer`.

The draft model itself is `specdec.drafts.eagle.FeatureDraft`. Its q at a position
depends on the target's feature (last hidden state) of the position before, which the
target computes in its verification call. So that the draft's cache never keeps its
own guesses for committed positions, each iteration re-feeds it every token the last
iteration committed ([x_1..x_n, t]), each with the target's feature of the position
before it, as the first chunk of the next draft step. q is still just a draft
distribution: the output law is Mp's either way (Appendix A.1).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec.drafts.base import (
  Proposal,
  draw,
  no_drafts,
  owe,
  stack_drafts,
  step_keys,
  where_active,
)
from specdec.verify import take_position

Array = jax.Array


@flax.struct.dataclass
class FeatureProposerState:
  """Attributes:
  draft_state: the feature draft's state; holds every committed token but `pending`.
  pending: int32[B, W], the tokens committed since the draft last ran, then
    placeholders (W = max gamma + 1).
  pending_features: [B, W, d], the target's feature of the position before each.
  num_pending: int32[B], real tokens in `pending` (1 to W).
  start: int32[B], the draft's length when the current iteration began.
  """

  draft_state: Any
  pending: Array
  pending_features: Array
  num_pending: Array
  start: Array


@flax.struct.dataclass
class FeatureProposer:
  """`specdec.drafts.eagle.FeatureDraft` driven by the target's features (a
  `FeatureReader`)."""

  draft: Any
  reads_target_features = True

  @property
  def vocab_size(self) -> int:
    return self.draft.vocab_size

  @property
  def feature_size(self) -> int:
    return self.draft.feature_size

  def start(self, inputs, capacity, max_gamma, zero_gamma, target_features):
    width = max_gamma + 1
    batch = inputs.shape[0]
    start = self.draft.start_tokens(inputs)
    draft_state = self.draft.init(inputs, capacity, target_features)
    features = jnp.zeros((batch, width, target_features.shape[-1]), target_features.dtype)
    if inputs.shape[1] > 1:
      # The start token is fed with the feature of the prompt's last fed position.
      before = self.draft.lengths(draft_state) - 1
      first = take_position(target_features, jnp.maximum(before, 0))
      features = features.at[:, 0].set(jnp.where((before >= 0)[:, None], first, 0))
    return FeatureProposerState(
      draft_state=draft_state,
      pending=jnp.tile(start[:, None], (1, width)),
      pending_features=features,
      num_pending=jnp.ones_like(start),
      start=jnp.zeros_like(start),
    )

  def propose(self, state, keys, sampling, gamma):
    draft = self.draft
    start = draft.lengths(state.draft_state)
    if gamma == 0:
      return no_drafts(start.shape[0], self.vocab_size, sampling, state.replace(start=start))
    logits, features, draft_state = draft.extend(
      state.draft_state, state.pending, state.pending_features
    )
    draft_state = draft.rewind(draft_state, start + state.num_pending)
    logits1 = take_position(logits, state.num_pending - 1)
    feature1 = take_position(features, state.num_pending - 1)

    def step(carry, step_key):
      draft_state, x_prev, feature_prev = carry
      logits, features, draft_state = draft.extend(
        draft_state, x_prev[:, None], feature_prev[:, None]
      )
      x, bad, q = draw(logits[:, 0], step_key, sampling)
      return (draft_state, x, features[:, 0]), (x, q, bad)

    first = draw(logits1, keys[:, 0], sampling)
    (draft_state, _, _), rest = jax.lax.scan(
      step, (draft_state, first[0], feature1), step_keys(keys, sampling), length=gamma - 1
    )
    x, q, bad = stack_drafts(first, rest, sampling)
    return Proposal(x, q, bad, state.replace(draft_state=draft_state, start=start))

  def commit(self, state, chunk, n, gamma, features, active):
    width = state.pending.shape[1]
    if gamma == 0:
      return self._owe(state, chunk[:, 0], features[:, 0], active)
    # The draft keeps the tokens up to `last` only, and owes [x_1..x_n, t] (`chunk`),
    # each with the target's feature of the position before it.
    pad = width - (gamma + 1)
    pending = jnp.pad(chunk, ((0, 0), (0, pad)), mode="edge")
    pending_features = jnp.pad(features, ((0, 0), (0, pad), (0, 0)))
    new = dict(pending=pending, pending_features=pending_features, num_pending=n + 1)
    old = dict(
      pending=state.pending, pending_features=state.pending_features, num_pending=state.num_pending
    )
    kept = jnp.where(active, state.start + state.num_pending, state.start)
    return state.replace(
      draft_state=self.draft.rewind(state.draft_state, kept), **where_active(active, new, old)
    )

  def _owe(self, state, t, feature, active):
    """An iteration without drafts: t and its feature join `pending` (`owe`)."""
    pending, num_pending = owe(state.pending, state.num_pending, t, active)
    features, _ = owe(state.pending_features, state.num_pending, feature, active)
    return state.replace(pending=pending, pending_features=features, num_pending=num_pending)
