"""The `Proposer` protocol: step 1 of Algorithm 1, plugged into the decode loop.

A proposer drafts x_1..x_gamma with their distributions q_1..q_gamma (Leviathan et
al., 2023, Algorithm 1, step 1) and, after the target's verification, learns which
tokens were committed. The loop (`specdec.sample`) calls nothing else of it, so every
kind of draft -- a small model, a model mixed with context lookup, a shortlist head, a
layer-skipped target, a draft that reads the target's features -- is plugged in, not
branched on. Algorithm 1 is lossless for any q (Appendix A.1): what a proposer does
with its state cannot change the law of the output, only the acceptance rate.

Optional capabilities are declared, not guessed, each by its own protocol: a proposer
with `reads_target_features = True` is a `FeatureReader`, given the target's features
(its last hidden states) of the prompt and of every verified position, and the target
must then implement `FeatureModel` (`check_target` raises a `TypeError` naming what is
missing); a proposer that owes its draft model tokens after iterations without drafts
is a `CatchesUp`, and the loop lets it feed them before the next draft step.

`ModelProposer` wraps any `DecodeModel` (what `speculative_sample` does with a plain
draft model); `specdec.drafts.feature.FeatureProposer` drives a feature draft.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import flax.struct
import jax
import jax.numpy as jnp

from specdec.distributions import (
  SamplingConfig,
  greedy_tokens_checked,
  probabilities_checked,
  sample_categorical,
)
from specdec.models.base import DecodeModel, ShortlistLogits
from specdec.verify import take_position

Array = jax.Array


class Proposal(NamedTuple):
  """What `Proposer.propose` returns: step 1 of Algorithm 1 for each row.

  Attributes:
    x: int32[B, gamma], the drafts x_1..x_gamma, x_i ~ q_i.
    q: float32[B, gamma, V], their distributions q_1..q_gamma; None at temperature 0
      (x is then the draft's argmax and nothing else is needed).
    bad: int32[B], draft positions whose logits were not finite.
    state: the proposer's state after drafting.
  """

  x: Array
  q: Array | None
  bad: Array
  state: Any


@runtime_checkable
class Proposer(Protocol):
  """What the decode loop needs of a draft (step 1 of Algorithm 1).

  Attributes:
    vocab_size: V, as the target's.
    reads_target_features: whether `start` and `commit` want the target's features.
  """

  @property
  def vocab_size(self) -> int: ...

  reads_target_features: bool

  def start(
    self,
    inputs: Array,
    capacity: int,
    max_gamma: int,
    zero_gamma: bool,
    target_features: Array | None,
  ) -> Any:
    """The proposer's state for a decode of `inputs` [B, S] that commits at most
    `capacity` tokens, drafting up to `max_gamma` per iteration (and skipping
    iterations when `zero_gamma`). `target_features` [B, S - 1, d] or None."""
    ...

  def propose(self, state: Any, keys: Array, sampling: SamplingConfig, gamma: int) -> Proposal:
    """Drafts gamma (static, >= 0) tokens per row with `keys` [B, gamma]."""
    ...

  def commit(
    self, state: Any, chunk: Array, n: Array, gamma: int, features: Array | None, active: Array
  ) -> Any:
    """After verification: row b committed chunk[b, :n[b] + 1] ([x_1..x_n, t]);
    `features` [B, gamma + 1, d] are the target's at the verified positions (None
    unless `reads_target_features`); rows not `active` must not change."""
    ...


@runtime_checkable
class FeatureReader(Protocol):
  """A proposer that reads the target's features (`reads_target_features = True`).

  Attributes:
    feature_size: d, the size of the target's features it reads.
  """

  feature_size: int


@runtime_checkable
class CatchesUp(Protocol):
  """A proposer that may owe its draft model more tokens than its next draft step
  feeds (after iterations without drafts, gamma 0), and can feed them at once.

  Before each drafting iteration that follows one at gamma 0, the loop calls
  `catch_up` while any row `owes`: no draws are made, so the output's law is
  untouched.
  """

  def owes(self, state: Any) -> Array:
    """bool[B]: rows owing their draft model more than the next draft step feeds."""
    ...

  def catch_up(self, state: Any) -> Any:
    """Feeds owed tokens to the draft model; rows that owe nothing keep their state."""
    ...


@runtime_checkable
class FeatureModel(Protocol):
  """A target that gives its features to a proposer that reads them."""

  feature_size: int

  def init_with_features(self, inputs: Array, max_length: int) -> tuple[Any, Array]: ...

  def extend_with_features(self, state: Any, tokens: Array) -> tuple[Array, Array, Any]: ...


def check_target(proposer: Proposer, target: Any) -> None:
  """Raises unless `target` offers what `proposer` declares it reads."""
  if not proposer.reads_target_features:
    return
  if not isinstance(proposer, FeatureReader):
    raise TypeError(
      f"draft ({type(proposer).__name__}) reads the target's features "
      "but declares no feature_size (`FeatureReader`)"
    )
  missing = [
    m
    for m in ("init_with_features", "extend_with_features")
    if not callable(getattr(target, m, None))
  ]
  if missing:
    raise TypeError(
      f"draft reads the target's features, but target "
      f"({type(target).__name__}) has no {' / '.join(missing)}"
    )
  if getattr(target, "feature_size", None) != proposer.feature_size:
    raise ValueError(
      f"feature_size of target ({getattr(target, 'feature_size', None)}) "
      f"and draft ({proposer.feature_size}) differ: the draft reads the "
      "target's features"
    )


def draw(step_logits: Array, key: Array, sampling: SamplingConfig, ids: Array | None = None):
  """(x, bad, q) at one draft position; q is None at temperature 0, where x is the
  argmax and nothing else is needed. `ids`: the logits are a shortlist's
  (`draft_logits`), position n standing for token ids[n] (greedy only)."""
  if sampling.greedy:
    x, bad = greedy_tokens_checked(step_logits)
    return (x if ids is None else jnp.take(ids, x, axis=0)), bad, None
  q, bad = probabilities_checked(step_logits, sampling)
  return sample_categorical(key, q), bad, q


def draft_logits(draft: DecodeModel, state: Any, tokens: Array, sampling: SamplingConfig):
  """(logits, ids, state) of one draft call: at temperature 0 a draft that declares
  `ShortlistLogits` gives its N shortlist logits and their ids (the argmax needs no
  V-wide vocabulary); otherwise `extend`'s V-wide logits and ids None."""
  if sampling.greedy and isinstance(draft, ShortlistLogits):
    logits, state = draft.extend_shortlist(state, tokens)
    return logits, draft.shortlist_ids, state
  logits, state = draft.extend(state, tokens)
  return logits, None, state


def step_keys(keys: Array, sampling: SamplingConfig):
  """The keys of draft steps 2..gamma ([gamma - 1, B]), or None when greedy."""
  return None if sampling.greedy else jnp.swapaxes(keys[:, 1:], 0, 1)


def stack_drafts(first, rest, sampling: SamplingConfig):
  """(x [B, gamma], q [B, gamma, V] or None, bad [B]) from the first step's `draw`
  and the scanned steps' (x, q, bad), each [gamma - 1, B, ...]."""
  x1, bad1, q1 = first
  xs, qs, bads = rest
  x = jnp.concatenate([x1[:, None], jnp.swapaxes(xs, 0, 1)], axis=1)
  bad = bad1.astype(jnp.int32) + jnp.sum(bads, axis=0, dtype=jnp.int32)
  if sampling.greedy:
    return x, None, bad
  return x, jnp.concatenate([q1[:, None], jnp.swapaxes(qs, 0, 1)], axis=1), bad


def no_drafts(batch: int, vocab_size: int, sampling: SamplingConfig, state: Any) -> Proposal:
  """What `propose` returns for gamma = 0: nothing drafted."""
  q = None if sampling.greedy else jnp.zeros((batch, 0, vocab_size), jnp.float32)
  return Proposal(jnp.zeros((batch, 0), jnp.int32), q, jnp.zeros((batch,), jnp.int32), state)


def where_active(active: Array, new: Any, old: Any) -> Any:
  """`new` in active rows, `old` elsewhere, leaf by leaf (leading axis B): a finished
  row stops changing."""
  return jax.tree.map(
    lambda a, b: jnp.where(active.reshape(active.shape + (1,) * (a.ndim - 1)), a, b), new, old
  )


@flax.struct.dataclass
class ModelProposerState:
  """Attributes:
  draft_state: Mq's state; holds every committed token but the pending ones.
  pending: int32[B, W], tokens committed but not yet fed to Mq, then placeholders.
  num_pending: int32[B], real tokens in `pending` (1 to W).
  start: int32[B], Mq's length when the current iteration began.
  """

  draft_state: Any
  pending: Array
  num_pending: Array
  start: Array


@flax.struct.dataclass
class ModelProposer:
  """Any `DecodeModel` as a proposer: gamma autoregressive steps of Mq per iteration.

  Mq never runs on x_gamma, nor on the target's token t: both are owed to it and fed
  together with the next iteration's first draft step, as one chunk `pending` (no
  extra draft call). Shapes are static, so that first step always feeds 2 tokens
  ([x_gamma, t] or [t, placeholder]); the cache is rewound past the placeholder at
  once. Iterations that skip the draft (gamma 0) each add their t to `pending`, a
  window of the last 4 (`owe`); before the next drafting iteration the loop calls
  `catch_up` while any row `owes` more than 2, which feeds them in one draft call, so
  the first draft step stays 2 tokens wide (at 4 it cost ~3 % of every drafting
  iteration on the Multi30k pair, gamma 0 chosen or not).
  """

  draft: DecodeModel
  reads_target_features = False

  @property
  def vocab_size(self) -> int:
    return self.draft.vocab_size

  def start(self, inputs, capacity, max_gamma, zero_gamma, target_features=None):
    """The draft's cache holds `capacity` positions past the prompt (max_new_tokens +
    G + 1, G = `max_gamma`), 2 more when the rule can skip the draft (`zero_gamma`):
    the owed window is then 4 wide, and `catch_up` writes all 4 slots at once.

    Raises:
      ValueError: naming the draft and gamma, where the draft cannot hold that many.
    """
    width = 4 if zero_gamma else 2
    start = self.draft.start_tokens(inputs)
    needed = capacity + width - 2
    try:
      draft_state = self.draft.init(inputs, needed)
    except ValueError as e:
      extra = (
        ", plus 2 for a gamma rule that includes gamma 0 (the owed window)" if zero_gamma else ""
      )
      raise ValueError(
        f"draft: this decode needs {needed} positions past the prompt in the draft "
        f"(max_new_tokens + G + 1 = {capacity} with G = {max_gamma}, the largest "
        f"gamma{extra}), and the draft cannot hold them: {e}"
      ) from e
    return ModelProposerState(
      draft_state=draft_state,
      pending=jnp.tile(start[:, None], (1, width)),
      num_pending=jnp.ones_like(start),
      start=jnp.zeros_like(start),
    )

  def propose(self, state, keys, sampling, gamma):
    draft = self.draft
    start = draft.lengths(state.draft_state)
    if gamma == 0:
      return no_drafts(start.shape[0], self.vocab_size, sampling, state.replace(start=start))
    # At most 2 owed tokens here (`catch_up` fed any more).
    logits, ids, draft_state = draft_logits(
      draft, state.draft_state, state.pending[:, :2], sampling
    )
    draft_state = draft.rewind(draft_state, start + state.num_pending)
    logits1 = take_position(logits, state.num_pending - 1)

    def step(carry, step_key):
      draft_state, x_prev = carry
      logits, ids, draft_state = draft_logits(draft, draft_state, x_prev[:, None], sampling)
      x, bad, q = draw(logits[:, 0], step_key, sampling, ids)
      return (draft_state, x), (x, q, bad)

    first = draw(logits1, keys[:, 0], sampling, ids)
    (draft_state, _), rest = jax.lax.scan(
      step, (draft_state, first[0]), step_keys(keys, sampling), length=gamma - 1
    )
    x, q, bad = stack_drafts(first, rest, sampling)
    return Proposal(x, q, bad, state.replace(draft_state=draft_state, start=start))

  def commit(self, state, chunk, n, gamma, features, active):
    t = jnp.take_along_axis(chunk, n[:, None], axis=1)[:, 0]
    width = state.pending.shape[1]
    if gamma == 0:
      return self._owe(state, t, active)
    # Mq was fed the old pending's real tokens and x_1..x_{gamma-1}; of those, x_1..x_n
    # are committed but only x_1..x_{min(n, gamma-1)} were fed. It owes [t] after a
    # rejection (n < gamma) and [x_gamma, t] after a full accept.
    full = n == gamma
    kept = state.start + state.num_pending + jnp.minimum(n, gamma - 1)
    first = jnp.where(full, chunk[:, gamma - 1], t)
    pending = jnp.concatenate([first[:, None], jnp.tile(t[:, None], (1, width - 1))], axis=1)
    new = state.replace(
      draft_state=self.draft.rewind(state.draft_state, jnp.where(active, kept, state.start)),
      pending=pending,
      num_pending=1 + full.astype(jnp.int32),
    )
    return new.replace(
      pending=where_active(active, new.pending, state.pending),
      num_pending=where_active(active, new.num_pending, state.num_pending),
    )

  def owes(self, state) -> Array:
    """bool[B]: rows owing Mq more tokens than `propose`'s first step feeds (2)
    (`CatchesUp`)."""
    return state.num_pending > 2

  def catch_up(self, state):
    """Feeds every owed token but the last to Mq in one call (rows that owe 2 or fewer
    keep their cache length): afterwards each row owes 1 or 2. No draws, so the
    output's law is untouched (and q is what one wide first step would give)."""
    start = self.draft.lengths(state.draft_state)
    owes = self.owes(state)
    _, draft_state = self.draft.extend(state.draft_state, state.pending)
    keep = jnp.where(owes, start + state.num_pending - 1, start)
    last = jnp.take_along_axis(state.pending, state.num_pending[:, None] - 1, axis=1)
    width = state.pending.shape[1]
    return state.replace(
      draft_state=self.draft.rewind(draft_state, keep),
      pending=jnp.where(owes[:, None], jnp.tile(last, (1, width)), state.pending),
      num_pending=jnp.where(owes, 1, state.num_pending),
    )

  def _owe(self, state, t, active):
    """An iteration without drafts: t joins `pending` (`owe`)."""
    pending, num_pending = owe(state.pending, state.num_pending, t, active)
    return state.replace(pending=pending, num_pending=num_pending)


def owe(pending: Array, num_pending: Array, new: Array, active: Array):
  """Appends `new` [B, ...] to `pending` [B, W, ...] in active rows; a full window
  drops its oldest token instead of growing. No draft call: after a run of
  iterations without drafts the draft sees the last W tokens and not the ones
  before, which changes q (and so alpha), never the law of the output."""
  width = pending.shape[1]
  full = (num_pending >= width)[:, None]
  shifted = jnp.concatenate([pending[:, 1:], new[:, None]], axis=1)
  slot = jnp.arange(width)[None] == num_pending[:, None]
  slot = slot.reshape(slot.shape + (1,) * (pending.ndim - 2))
  full = full.reshape(full.shape + (1,) * (pending.ndim - 2))
  grown = jnp.where(slot, new[:, None], pending)
  updated = jnp.where(full, shifted, grown)
  keep = active.reshape(active.shape + (1,) * (pending.ndim - 1))
  return (
    jnp.where(keep, updated, pending),
    jnp.where(active, jnp.minimum(num_pending + 1, width), num_pending),
  )
