"""Speculative sampling (Algorithm 1 of Leviathan et al., 2023) and its baseline.

`speculative_sample(target, draft, ...)` decodes with a target Mp and a draft Mq so
that every output sequence has exactly Mp's distribution (Appendix A.1), taking
1 to gamma + 1 tokens per iteration. One iteration, per row b, independently:

  1. Draft: gamma autoregressive steps of Mq sample x_1..x_gamma, x_i ~ q_i.
  2. Verify: ONE call of Mp over the gamma + 1 positions [last, x_1..x_gamma] gives
     p_1..p_{gamma+1}.
  3. Accept: r_i ~ U(0, 1); n = the number of leading i with r_i < p_i(x_i)/q_i(x_i),
     tested as r_i q_i(x_i) < p_i(x_i) so that nothing is divided.
  4. Correct: t ~ norm(max(0, p_{n+1} - q_{n+1})) if n < gamma, else t ~ p_{gamma+1}
     (the same formula with q_{gamma+1} = 0); commit x_1..x_n, t.

Every random draw is exact to float32 precision for every token, however rare
(`distributions.sample_categorical`, `distributions.uniform`), so the output law is
Mp's at any vocabulary size, not Mp's rounded to a 2^-23 grid.

Lenience (Appendix A.5, opt-in, off by default): with l < 1, step 3 accepts iff
r_i l q_i(x_i) < p_i(x_i) and step 4 samples norm(max(0, p - l q)); no token then has
probability above p(x) / l, but the output is no longer Mp's (see `speculative_sample`).

The whole decode is one `lax.while_loop` inside one `jax.jit`; the draft steps are a
`lax.scan` inside it. Rows advance independently (each has its own n, position and
random key) and stop on EOS or `max_new_tokens`; a finished row stops changing.

A draft that reads the target's features (`reads_target_features`, e.g.
`specdec.models.eagle.FeatureDraft`) gets them from the verification call
(`extend_with_features`): each iteration re-feeds it every committed token with the
target's feature of the position before it, so that its cache never keeps its own
guesses for committed positions (`_draft_with_features`). q is still just a draft
distribution: the law of the output is Mp's either way.

The draft cache after a full accept: Mq never ran on x_gamma. Rather than spend an
extra draft call, the next iteration's first draft step feeds a 2-token chunk
[x_gamma, t]. Shapes are static, so that first step always feeds two tokens; when only
one is owed ([t]) the second slot is a placeholder whose logits are ignored and which
is rewound away at once.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp

import math
import numbers

import numpy as np

from specdec.distributions import (SamplingConfig, greedy_tokens, greedy_tokens_checked,
                                   nonfinite, probabilities, probabilities_checked,
                                   sample_categorical, uniform)
from specdec.models.base import DecodeModel, check_token_ids, write_rows

Array = jax.Array

# A residual max(0, p - q) with less mass than this is numerically empty: the
# paper's fallback case (p == q up to rounding), sampled from p instead.
_MIN_RESIDUAL_MASS = float(jnp.finfo(jnp.float32).tiny)


# ----------------------------------------------------------------------------- outputs


@flax.struct.dataclass
class SpeculativeStats:
  """Per-row statistics of a speculative decode, counted before EOS truncation.

  Attributes:
    iterations: int32[B], iterations the row ran (= target calls).
    drafted: int32[B], draft tokens proposed (gamma per iteration).
    accepted: int32[B], draft tokens accepted (sum of n). Tokens produced per row are
      accepted + iterations (each iteration adds n + 1).
    beta_sum: float32[B], sum over the row's decoded positions of
      beta = sum_x min(p(x), q(x)) (Corollary 3.6).
    beta_count: int32[B], how many positions `beta_sum` holds.
    rejected: int32[B], iterations that ended in a rejection (n < gamma); the others
      accepted all gamma drafts.
    nonfinite: int32[B], positions (draft steps and verified positions) whose logits
      held a NaN or +inf or no finite value (`distributions.nonfinite`). Non-zero
      means a model is broken: such positions are decoded from sanitized logits
      (uniform when nothing is finite), never as NaN.

  With lenience l < 1, beta is sum_x min(p(x) / l, q(x)) (Appendix A.5) at
  temperature > 0, and [p(x_i) >= l max p] at temperature 0: alpha_hat estimates the
  lenient acceptance rate.
  """

  iterations: Array
  drafted: Array
  accepted: Array
  beta_sum: Array
  beta_count: Array
  rejected: Array
  nonfinite: Array

  @property
  def alpha_hat(self) -> Array:
    """float32[B], the paper's estimate of alpha: the mean beta along the decode."""
    return self.beta_sum / jnp.maximum(self.beta_count, 1)

  @property
  def tokens_per_iteration(self) -> Array:
    """float32[B], measured counterpart of Equation 1."""
    return (self.accepted + self.iterations) / jnp.maximum(self.iterations, 1)

  @property
  def alpha_from_accepts(self) -> Array:
    """float32[B], alpha from the accept counts alone: accepted / (accepted + rejected).

    The maximum-likelihood estimate when every draft is accepted independently with
    probability alpha (the paper's simplifying assumption, Definition 3.1): an
    iteration is a run of successes ended by one failure or by reaching gamma.
    """
    return self.accepted / jnp.maximum(self.accepted + self.rejected, 1)


@flax.struct.dataclass
class AutoregressiveStats:
  """Per-row statistics of a baseline decode.

  Attributes:
    iterations: int32[B], target calls (one token each).
    nonfinite: int32[B], target positions whose logits held a NaN or +inf or no
      finite value (see `SpeculativeStats.nonfinite`).
  """

  iterations: Array
  nonfinite: Array


@flax.struct.dataclass
class SampleOutput:
  """What both samplers return.

  Attributes:
    tokens: int32[B, max_new_tokens], generated tokens; 0 (pad) after EOS and past a
      row's length.
    lengths: int32[B], generated tokens per row, EOS included.
    stats: `SpeculativeStats` or `AutoregressiveStats`.
    log_probs: float32[B, max_new_tokens], log p(token) of each output token under
      the target's sampling distribution (temperature, top-k and top-p applied: the
      p that Algorithm 1 verifies against, floored at log 1e-30), 0 past a row's
      length; all 0 at temperature 0. Summed over a row, this is T5X's
      `temperature_sample` score (rescale_log_probs=True, its default), read from the
      verification pass rather than from another forward pass.
  """

  tokens: Array
  lengths: Array
  stats: Any
  log_probs: Optional[Array] = None

  @property
  def scores(self) -> Array:
    """float32[B]: the log-probability of each row's output (sum of `log_probs`)."""
    return jnp.sum(self.log_probs, axis=-1)


# ------------------------------------------------------------- Algorithm 1, piece by piece


def residual(p: Array, q: Array, lenience: float = 1.0) -> Array:
  """norm(max(0, p - l q)) over the last axis, falling back to p when it has no mass.

  The distribution a rejected position is resampled from (Algorithm 1; with
  lenience l < 1, Appendix A.5). With q = 0 it is p itself, which is how the
  all-accepted case samples from p_{gamma+1}. For l < 1 it always has mass
  (sum(p - l q) = 1 - l > 0), so the fallback is only for l = 1 and p == q.
  """
  diff = jnp.maximum(p - _scale(q, lenience), 0.0)
  mass = jnp.sum(diff, axis=-1, keepdims=True)
  has_mass = mass > _MIN_RESIDUAL_MASS
  return jnp.where(has_mass, diff / jnp.where(has_mass, mass, 1.0), p)


def accepts(r: Array, p_x: Array, q_x: Array, lenience: float = 1.0) -> Array:
  """Accept x_i iff r_i < p_i(x_i) / (l q_i(x_i)), computed as r_i l q_i(x_i) < p_i(x_i).

  l = 1 is Algorithm 1; l < 1 is Appendix A.5's lenient test. r must be exact near 0
  (`distributions.uniform`) for the test to be exact when p(x) << q(x).
  """
  return r * _scale(q_x, lenience) < p_x


def beta(p: Array, q: Array, lenience: float = 1.0) -> Array:
  """sum_x min(p(x) / l, q(x)) over the last axis: the chance that x ~ q is accepted
  (Corollary 3.6; with lenience, Appendix A.5)."""
  return jnp.sum(jnp.minimum(_scale(p, 1.0 / lenience), q), axis=-1)


def _scale(x: Array, factor: float) -> Array:
  # A static factor of 1 leaves x untouched: l = 1 is bit for bit Algorithm 1.
  return x if factor == 1.0 else x * factor


def num_accepted(accepted: Array) -> Array:
  """n: the number of leading True values along the last axis. int32[...]."""
  return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=-1), axis=-1)


def _take(probs: Array, tokens: Array) -> Array:
  """probs[..., tokens] elementwise: probs [B, k, V], tokens [B, k] -> [B, k]."""
  return jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]


def _take_position(values: Array, index: Array) -> Array:
  """values[b, index[b]] for every row: values [B, k, ...], index int32[B]."""
  return jax.vmap(lambda v, i: v[i])(values, index)


def _wrap_raw_key(rng: Array) -> Array:
  """A raw uint32 key array as a typed key: the default PRNG implementation's shape
  first (threefry: [..., 2]), else rbg's [..., 4] (`jax.random.key_impl` names)."""
  if rng.dtype != jnp.uint32:
    raise ValueError(
        "rng must be a PRNG key (jax.random.key or PRNGKey), or one per row; got "
        f"dtype {rng.dtype}, shape {rng.shape}")
  try:
    return jax.random.wrap_key_data(rng)
  except (TypeError, ValueError) as default_error:
    if rng.shape[-1:] == (4,):
      return jax.random.wrap_key_data(rng, impl="rbg")
    raise ValueError(
        f"rng: a raw key of shape {rng.shape} fits no PRNG implementation "
        f"({default_error}); pass jax.random.key(...) or jax.random.PRNGKey(...)"
    ) from default_error


def _row_keys(rng: Array, batch: int) -> Array:
  """One typed PRNG key per row, from one key (folded with the row index) or [B]."""
  if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = _wrap_raw_key(rng)
  if rng.shape == ():
    return jax.vmap(lambda b: jax.random.fold_in(rng, b))(jnp.arange(batch))
  if rng.shape == (batch,):
    return rng
  raise ValueError(
      f"rng must be one key or one key per row ({batch}), got key shape {rng.shape}")


def _iteration_keys(row_keys: Array, iterations: Array, num: int) -> Array:
  """[B] keys and per-row iteration counts -> [B, num] keys, fresh each iteration."""
  return jax.vmap(lambda k, i: jax.random.split(jax.random.fold_in(k, i), num))(
      row_keys, iterations)


def _draft(draft: DecodeModel, state: Any, pending: Array, num_pending: Array,
           keys: Array, sampling: SamplingConfig, gamma: int):
  """Step 1: gamma draft steps.

  The first step feeds the 2-token chunk `pending` of which `num_pending` [B] (1 or
  2) tokens are real; the logits of the last real one give q_1, and the cache is
  rewound past the placeholder.

  Returns:
    x: int32[B, gamma], x_i ~ q_i.
    q: float32[B, gamma, V], q_1..q_gamma (None at temperature 0, where q_i is
      one-hot at x_i and the tokens are all the rest needs).
    bad: int32[B], draft positions with non-finite logits (`nonfinite`).
    state: the draft's state, holding the chunk's real tokens and x_1..x_{gamma-1}.
  """
  start = draft.lengths(state)
  logits, state = draft.extend(state, pending)
  state = draft.rewind(state, start + num_pending)
  logits1 = _take_position(logits, num_pending - 1)

  def step(carry, step_keys):
    state, x_prev = carry
    logits, state = draft.extend(state, x_prev[:, None])
    x, bad, q = _draw(logits[:, 0], step_keys, sampling)
    return (state, x), (x, q, bad)

  first = _draw(logits1, keys[:, 0], sampling)
  (state, _), rest = jax.lax.scan(step, (state, first[0]), _step_keys(keys, sampling),
                                  length=gamma - 1)
  return (*_drafts(first, rest, sampling), state)


def _draw(step_logits: Array, key: Array, sampling: SamplingConfig):
  """(x, bad, q) at one draft position: q is None at temperature 0, where x is the
  argmax and the rest needs nothing else."""
  if sampling.greedy:
    return *greedy_tokens_checked(step_logits), None
  q, bad = probabilities_checked(step_logits, sampling)
  return sample_categorical(key, q), bad, q


def _step_keys(keys: Array, sampling: SamplingConfig):
  """The keys the draft steps after the first scan over ([gamma - 1, B] keys), or
  None: greedy drafts draw nothing, so no keys are computed."""
  return None if sampling.greedy else jnp.swapaxes(keys[:, 1:], 0, 1)


def _drafts(first, rest, sampling: SamplingConfig):
  """(x [B, gamma], q [B, gamma, V] or None, bad [B]) from the first step's
  `_draw` and the scanned steps' (x, q, bad), each [gamma - 1, B, ...]."""
  x1, bad1, q1 = first
  xs, qs, bads = rest
  x = jnp.concatenate([x1[:, None], jnp.swapaxes(xs, 0, 1)], axis=1)
  bad = bad1.astype(jnp.int32) + jnp.sum(bads, axis=0, dtype=jnp.int32)
  if sampling.greedy:
    return x, None, bad
  return x, jnp.concatenate([q1[:, None], jnp.swapaxes(qs, 0, 1)], axis=1), bad


def _draft_with_features(draft: Any, state: Any, pending: Array,
                         pending_features: Array, num_pending: Array, keys: Array,
                         sampling: SamplingConfig, gamma: int):
  """Step 1 for a draft that reads the target's features (`reads_target_features`,
  `specdec.models.eagle`).

  The first step feeds the chunk `pending` [B, gamma + 1] of which `num_pending` [B]
  (1 to gamma + 1) tokens are real: the tokens committed by the last iteration, each
  with the target's feature of the position before it (`pending_features`), so that
  the draft's cache holds the target's features for every committed position. The
  logits of the last real token give q_1; each later step feeds the drafted token
  with the draft's own predicted feature. Returns as `_draft`.
  """
  start = draft.lengths(state)
  logits, features, state = draft.extend(state, pending, pending_features)
  state = draft.rewind(state, start + num_pending)
  logits1 = _take_position(logits, num_pending - 1)
  feature1 = _take_position(features, num_pending - 1)

  def step(carry, step_keys):
    state, x_prev, feature_prev = carry
    logits, features, state = draft.extend(state, x_prev[:, None],
                                           feature_prev[:, None])
    x, bad, q = _draw(logits[:, 0], step_keys, sampling)
    return (state, x, features[:, 0]), (x, q, bad)

  first = _draw(logits1, keys[:, 0], sampling)
  (state, _, _), rest = jax.lax.scan(step, (state, first[0], feature1),
                                     _step_keys(keys, sampling), length=gamma - 1)
  return (*_drafts(first, rest, sampling), state)


def reads_target_features(draft: Any) -> bool:
  """Whether `draft` is a feature draft (`specdec.models.eagle.FeatureDraft`)."""
  return bool(getattr(draft, "reads_target_features", False))


def speculative_step(p: Array, q: Array, x: Array, r: Array, key: Array,
                     lenience: float = 1.0):
  """Steps 3 and 4 of Algorithm 1 for a batch of rows.

  Args:
    p: float32[B, gamma + 1, V], target distributions p_1..p_{gamma+1}.
    q: float32[B, gamma, V], draft distributions q_1..q_gamma.
    x: int32[B, gamma], draft tokens, x_i ~ q_i.
    r: float32[B, gamma], uniforms r_i ~ U(0, 1), exact near 0 (`uniform`).
    key: [B] PRNG keys for the corrected token.
    lenience: l in (0, 1] (static); 1 is Algorithm 1, l < 1 Appendix A.5.

  Returns:
    n: int32[B], accepted draft tokens (0..gamma).
    t: int32[B], the token sampled from norm(max(0, p_{n+1} - l q_{n+1})) (or from
      p_{gamma+1} when n = gamma).
    beta: float32[B, gamma], sum_x min(p_i / l, q_i) at each drafted position.
  """
  gamma = x.shape[1]
  n = num_accepted(accepts(r, _take(p[:, :gamma], x), _take(q, x), lenience))
  # q_{gamma+1} = 0: row n of q, zeroed where n = gamma, without padding q.
  q_n = _take_position(q, jnp.minimum(n, gamma - 1)) * (n < gamma)[:, None]
  t = sample_categorical(key, residual(_take_position(p, n), q_n, lenience))
  return n, t, beta(p[:, :gamma], q, lenience)


def lenient_greedy_step(logits: Array, x: Array, sampling: SamplingConfig,
                        lenience: float):
  """Appendix A.5's temperature-0 variant: accept x_i iff p_i(x_i) >= l max(p_i).

  The paper prints "p(x) <= l * max(p)", which would accept exactly the unlikely
  tokens; it is read here as p(x) >= l max(p), which at l = 1 accepts the argmax
  only. p is the target's own distribution at temperature 1 after `sampling`'s top-k
  and top-p (temperature 0 itself is one-hot and offers no ratio; top-k / top-p are
  the user's statement of which tokens are allowed at all). The ratio p(x) / max(p)
  does not depend on that distribution's normalization. A rejected or fully
  accepted iteration continues with the target's greedy token, as at l = 1.

  Args:
    logits: [B, gamma + 1, V], the target's verification logits.
    x: int32[B, gamma], the draft's greedy tokens.
    sampling: the (greedy) sampling config; its top_k / top_p apply.
    lenience: l in (0, 1).

  Returns:
    (n, t, beta) as `greedy_step`, with beta_i = [x_i is accepted].
  """
  gamma = x.shape[1]
  target_tokens = greedy_tokens(logits)
  clean = probabilities(logits[:, :gamma], SamplingConfig(
      temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p))
  p_x = _take(clean, x)
  ok = (p_x > 0) & (p_x >= lenience * jnp.max(clean, axis=-1))
  n = num_accepted(ok)
  return n, _take_position(target_tokens, n), ok.astype(jnp.float32)


def greedy_step(target_tokens: Array, x: Array):
  """`speculative_step` at temperature 0, on tokens instead of distributions.

  p_i and q_i are one-hot at the target's argmax y_i and at x_i, so x_i is accepted
  iff x_i = y_i (r_i < p_i(x_i) / q_i(x_i) = 1 or 0), the residual at the first
  mismatch is one-hot at y_{n+1} (as is p_{gamma+1}), and beta_i = [x_i = y_i]: the
  same n, t and beta as `speculative_step` on the one-hot distributions, without
  materializing them over the vocabulary.

  Args:
    target_tokens: int32[B, gamma + 1], y_1..y_{gamma+1}, the target's greedy tokens.
    x: int32[B, gamma], the draft's greedy tokens.
  """
  gamma = x.shape[1]
  matches = x == target_tokens[:, :gamma]
  n = num_accepted(matches)
  return n, _take_position(target_tokens, n), matches.astype(jnp.float32)


# ------------------------------------------------------------------------ the decode loop


@flax.struct.dataclass
class _SpeculativeState:
  """The `lax.while_loop` carry of `speculative_sample`.

  Attributes:
    target_state: Mp's state; holds every committed token but `last`.
    draft_state: Mq's state; holds every committed token but `pending`'s real ones.
    last: int32[B], the newest committed token (fed first at the next verification).
    pending: int32[B, 2], the draft's next chunk ([x_gamma, t] or [t, placeholder]);
      for a feature draft int32[B, gamma + 1], every token the last iteration
      committed ([x_1..x_n, t], then placeholders).
    pending_features: None, or for a feature draft [B, gamma + 1, d]: the target's
      feature of the position before each pending token.
    num_pending: int32[B], real tokens in `pending` (1 or 2; 1 to gamma + 1 for a
      feature draft).
    tokens: int32[B, max_new_tokens + gamma + 1], committed tokens; each iteration
      writes gamma + 1 slots at the row's position, of which n + 1 are real.
    log_probs: float32[B, max_new_tokens + gamma + 1], log p of each committed token
      (written as `tokens` is).
    num_generated: int32[B], committed tokens per row (EOS included, capped at EOS).
    done: bool[B], the row has hit EOS or max_new_tokens.
    row_keys: [B] PRNG keys.
    stats: `SpeculativeStats`.
  """

  target_state: Any
  draft_state: Any
  last: Array
  pending: Array
  pending_features: Any
  num_pending: Array
  tokens: Array
  log_probs: Array
  num_generated: Array
  done: Array
  row_keys: Array
  stats: SpeculativeStats


def _first_eos(chunk: Array, valid: Array, eos_id: Optional[int]) -> Array:
  """Index of the first valid EOS in each row of chunk [B, k], or k. int32[B]."""
  k = chunk.shape[1]
  if eos_id is None:
    return jnp.full(chunk.shape[:1], k, jnp.int32)
  is_eos = (chunk == eos_id) & valid
  return jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), k).astype(jnp.int32)


# log p below this is reported as log(1e-30): a token the sampling transform rules
# out is never emitted, but rounding can leave p(t) = 0 for a token it emitted.
_LOG_FLOOR = 1e-30


def _log_probs(probs_at_tokens: Array) -> Array:
  return jnp.log(jnp.maximum(probs_at_tokens, _LOG_FLOOR))


def _finalize(tokens: Array, log_probs: Array, num_generated: Array,
              max_new_tokens: int):
  """Truncate to max_new_tokens and zero everything past each row's length."""
  lengths = jnp.minimum(num_generated, max_new_tokens)
  valid = jnp.arange(max_new_tokens) < lengths[:, None]
  tokens = jnp.where(valid, tokens[:, :max_new_tokens], 0)
  log_probs = jnp.where(valid, log_probs[:, :max_new_tokens], 0.0)
  return tokens, log_probs, lengths


@functools.partial(jax.jit, static_argnames=("gamma", "max_new_tokens", "sampling",
                                             "eos_id", "lenience"))
def _speculative_jit(target, draft, inputs, rng, *, gamma, max_new_tokens, sampling,
                     eos_id, lenience=1.0):
  batch = inputs.shape[0]
  capacity = max_new_tokens + gamma + 1
  start = target.start_tokens(inputs)
  zeros = jnp.zeros((batch,), jnp.int32)
  with_features = reads_target_features(draft)
  if with_features:
    target_state, prompt_features = target.init_with_features(inputs, capacity)
    draft_state = draft.init(inputs, capacity, prompt_features)
    pending = jnp.stack([start] * (gamma + 1), axis=1)
    pending_features = jnp.zeros((batch, gamma + 1, prompt_features.shape[-1]),
                                 prompt_features.dtype)
    if inputs.shape[1] > 1:
      # The start token is fed with the feature of the prompt's last fed position.
      before = target.lengths(target_state) - 1
      first = _take_position(prompt_features, jnp.maximum(before, 0))
      pending_features = pending_features.at[:, 0].set(
          jnp.where((before >= 0)[:, None], first, 0))
  else:
    target_state = target.init(inputs, capacity)
    draft_state = draft.init(inputs, capacity)
    pending = jnp.stack([start, start], axis=1)
    pending_features = None
  state = _SpeculativeState(
      target_state=target_state,
      draft_state=draft_state,
      last=start,
      pending=pending,
      pending_features=pending_features,
      num_pending=jnp.ones((batch,), jnp.int32),
      tokens=jnp.zeros((batch, capacity), jnp.int32),
      log_probs=jnp.zeros((batch, capacity), jnp.float32),
      num_generated=zeros,
      done=jnp.zeros((batch,), bool),
      row_keys=_row_keys(rng, batch),
      stats=SpeculativeStats(iterations=zeros, drafted=zeros, accepted=zeros,
                             beta_sum=jnp.zeros((batch,), jnp.float32),
                             beta_count=zeros, rejected=zeros, nonfinite=zeros))

  def cond_fn(s: _SpeculativeState):
    return jnp.any(~s.done)

  def body_fn(s: _SpeculativeState) -> _SpeculativeState:
    active = ~s.done
    keys = _iteration_keys(s.row_keys, s.stats.iterations, gamma + 2)
    draft_start = draft.lengths(s.draft_state)
    target_start = target.lengths(s.target_state)

    if with_features:
      x, q, draft_bad, draft_state = _draft_with_features(
          draft, s.draft_state, s.pending, s.pending_features, s.num_pending,
          keys[:, :gamma], sampling, gamma)
      logits, features, target_state = target.extend_with_features(
          s.target_state, jnp.concatenate([s.last[:, None], x], axis=1))
    else:
      x, q, draft_bad, draft_state = _draft(draft, s.draft_state, s.pending,
                                            s.num_pending, keys[:, :gamma], sampling,
                                            gamma)
      logits, target_state = target.extend(
          s.target_state, jnp.concatenate([s.last[:, None], x], axis=1))
    if sampling.greedy and lenience == 1.0:
      target_tokens, target_bad = greedy_tokens_checked(logits)
      n, t, betas = greedy_step(target_tokens, x)
    else:
      if sampling.greedy:
        target_bad = nonfinite(logits)
        n, t, betas = lenient_greedy_step(logits, x, sampling, lenience)
      else:
        p, target_bad = probabilities_checked(logits, sampling)
        r = jax.vmap(lambda k: uniform(k, (gamma,)))(keys[:, gamma])
        n, t, betas = speculative_step(p, q, x, r, keys[:, gamma + 1], lenience)
    bad = draft_bad + jnp.sum(target_bad, axis=1, dtype=jnp.int32)

    # Commit x_1..x_n, t: the chunk's slots past n hold t too and are never read.
    positions = jnp.arange(gamma + 1)
    chunk = jnp.where(positions[None] < n[:, None],
                      jnp.concatenate([x, x[:, :1]], axis=1), t[:, None])
    if sampling.greedy:
      chunk_log_probs = jnp.zeros(chunk.shape, jnp.float32)
    else:
      chunk_log_probs = _log_probs(_take(p, chunk))
    eos_at = _first_eos(chunk, positions[None] <= n[:, None], eos_id)
    hit_eos = eos_at <= n
    num_generated = s.num_generated + jnp.where(hit_eos, eos_at, n) + 1
    full = n == gamma

    def keep(new, old):
      return jnp.where(active.reshape(active.shape + (1,) * (new.ndim - 1)), new, old)

    on_path = jnp.arange(gamma)[None] <= n[:, None]
    stats = SpeculativeStats(
        iterations=s.stats.iterations + active,
        drafted=s.stats.drafted + gamma * active,
        accepted=s.stats.accepted + n * active,
        beta_sum=s.stats.beta_sum + jnp.sum(jnp.where(on_path, betas, 0.0), axis=1) * active,
        beta_count=s.stats.beta_count + jnp.minimum(n + 1, gamma) * active,
        rejected=s.stats.rejected + ((n < gamma) & active).astype(jnp.int32),
        nonfinite=s.stats.nonfinite + bad * active)
    # The draft's cache after this iteration holds every committed token but the
    # ones it is owed (the next `pending`). It was fed the old pending's real tokens
    # (s.num_pending of them, all committed earlier) and then x_1..x_{gamma-1}, one
    # per scan step (x_gamma is sampled, never fed). Of those, x_1..x_n are now
    # committed, but only x_1..x_{min(n, gamma-1)} were fed: so it keeps
    # draft_start + s.num_pending + min(n, gamma - 1) tokens. On a rejection (n <
    # gamma) it owes [t]; on a full accept (n = gamma) it owes [x_gamma, t].
    if with_features:
      # A feature draft re-feeds every committed token with the target's features:
      # it keeps the tokens up to `last` only, and owes [x_1..x_n, t] (`chunk`), each
      # with the target's feature of the position before it (the chunk's features
      # from `last` on).
      draft_kept = draft_start + s.num_pending
      pending = chunk
      pending_features = keep(features, s.pending_features)
      num_pending = n + 1
    else:
      draft_kept = draft_start + s.num_pending + jnp.minimum(n, gamma - 1)
      pending = jnp.stack([jnp.where(full, x[:, -1], t), t], axis=1)
      pending_features = None
      num_pending = 1 + full.astype(jnp.int32)
    return _SpeculativeState(
        target_state=target.rewind(target_state, keep(target_start + n + 1, target_start)),
        draft_state=draft.rewind(draft_state, keep(draft_kept, draft_start)),
        last=keep(t, s.last),
        pending=keep(pending, s.pending),
        pending_features=pending_features,
        num_pending=keep(num_pending, s.num_pending),
        tokens=keep(write_rows(s.tokens, chunk, s.num_generated), s.tokens),
        log_probs=keep(write_rows(s.log_probs, chunk_log_probs, s.num_generated),
                       s.log_probs),
        num_generated=keep(num_generated, s.num_generated),
        done=s.done | hit_eos | (num_generated >= max_new_tokens),
        row_keys=s.row_keys,
        stats=stats)

  s = jax.lax.while_loop(cond_fn, body_fn, state)
  tokens, log_probs, lengths = _finalize(s.tokens, s.log_probs, s.num_generated,
                                         max_new_tokens)
  return SampleOutput(tokens=tokens, lengths=lengths, stats=s.stats,
                      log_probs=log_probs)


@flax.struct.dataclass
class _AutoregressiveState:
  """The `lax.while_loop` carry of `autoregressive_sample` (fields as above)."""

  target_state: Any
  last: Array
  tokens: Array
  log_probs: Array
  num_generated: Array
  done: Array
  row_keys: Array
  iterations: Array
  nonfinite: Array


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "sampling", "eos_id"))
def _autoregressive_jit(target, inputs, rng, *, max_new_tokens, sampling, eos_id):
  batch = inputs.shape[0]
  zeros = jnp.zeros((batch,), jnp.int32)
  state = _AutoregressiveState(
      target_state=target.init(inputs, max_new_tokens + 1),
      last=target.start_tokens(inputs),
      tokens=jnp.zeros((batch, max_new_tokens), jnp.int32),
      log_probs=jnp.zeros((batch, max_new_tokens), jnp.float32),
      num_generated=zeros,
      done=jnp.zeros((batch,), bool),
      row_keys=_row_keys(rng, batch),
      iterations=zeros,
      nonfinite=zeros)

  def cond_fn(s: _AutoregressiveState):
    return jnp.any(~s.done)

  def body_fn(s: _AutoregressiveState) -> _AutoregressiveState:
    active = ~s.done
    start = target.lengths(s.target_state)
    logits, target_state = target.extend(s.target_state, s.last[:, None])
    keys = _iteration_keys(s.row_keys, s.iterations, 1)[:, 0]
    if sampling.greedy:
      t, bad = greedy_tokens_checked(logits[:, 0])
      log_p = jnp.zeros(t.shape, jnp.float32)
    else:
      p, bad = probabilities_checked(logits[:, 0], sampling)
      t = sample_categorical(keys, p)
      log_p = _log_probs(_take(p[:, None], t[:, None])[:, 0])
    hit_eos = jnp.zeros_like(active) if eos_id is None else t == eos_id
    num_generated = s.num_generated + active
    slot = jnp.minimum(s.num_generated, max_new_tokens - 1)
    tokens = write_rows(s.tokens, t[:, None], slot)
    log_probs = write_rows(s.log_probs, log_p[:, None], slot)
    return _AutoregressiveState(
        target_state=target.rewind(target_state, jnp.where(active, start + 1, start)),
        last=jnp.where(active, t, s.last),
        tokens=jnp.where(active[:, None], tokens, s.tokens),
        log_probs=jnp.where(active[:, None], log_probs, s.log_probs),
        num_generated=num_generated,
        done=s.done | (active & hit_eos) | (num_generated >= max_new_tokens),
        row_keys=s.row_keys,
        iterations=s.iterations + active,
        nonfinite=s.nonfinite + (bad & active).astype(jnp.int32))

  s = jax.lax.while_loop(cond_fn, body_fn, state)
  tokens, log_probs, lengths = _finalize(s.tokens, s.log_probs, s.num_generated,
                                         max_new_tokens)
  return SampleOutput(tokens=tokens, lengths=lengths,
                      stats=AutoregressiveStats(iterations=s.iterations,
                                                nonfinite=s.nonfinite),
                      log_probs=log_probs)


# ------------------------------------------------------------------- public entry points


def check_positive_int(name: str, value: Any) -> int:
  """`value` as an int >= 1 (Python or numpy integer), or an error naming `name`."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
  if value < 1:
    raise ValueError(f"{name} must be >= 1, got {value}")
  return int(value)


def check_lenience(lenience: Any) -> float:
  """`lenience` as a float in (0, 1], or a ValueError naming it (Appendix A.5)."""
  if (isinstance(lenience, (bool, np.bool_)) or not isinstance(lenience, numbers.Real)
      or math.isnan(lenience) or not 0.0 < lenience <= 1.0):
    raise ValueError(f"lenience must be a number in (0, 1] (1: exact Algorithm 1), "
                     f"got {lenience!r}")
  return float(lenience)


def _check_common(model: DecodeModel, name: str, inputs: Any, max_new_tokens: Any,
                  sampling: Any, eos_id: Any) -> None:
  if not isinstance(model, DecodeModel):
    raise TypeError(f"{name} must implement specdec.models.DecodeModel, got "
                    f"{type(model).__name__}")
  check_positive_int("max_new_tokens", max_new_tokens)
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(f"sampling must be a specdec.SamplingConfig, got "
                    f"{type(sampling).__name__}")
  sampling.validate_vocab(model.vocab_size)
  shape, dtype = getattr(inputs, "shape", None), getattr(inputs, "dtype", None)
  if shape is None or dtype is None:
    raise TypeError(f"inputs must be an integer array [B, S], got {type(inputs).__name__}")
  if len(shape) != 2:
    raise ValueError(f"inputs must have rank 2 [B, S], got shape {tuple(shape)}")
  if not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f"inputs must have an integer dtype, got {dtype}")
  if shape[0] < 1 or shape[1] < 1:
    raise ValueError(f"inputs must be non-empty, got shape {tuple(shape)}")
  # Concrete ids are checked here, before the models are traced (inside the decode's
  # jit they cannot raise, and clip instead).
  check_token_ids("inputs", inputs, model.vocab_size)
  if eos_id is not None:
    if isinstance(eos_id, (bool, np.bool_)) or not isinstance(eos_id, numbers.Integral):
      raise TypeError(f"eos_id must be an int or None, got {eos_id!r}")
    if not 0 <= eos_id < model.vocab_size:
      raise ValueError(f"eos_id must be in [0, {model.vocab_size}), got {eos_id}")


def speculative_sample(target: DecodeModel, draft: DecodeModel, inputs: Array,
                       rng: Array, *, gamma: int, max_new_tokens: int,
                       sampling: SamplingConfig = SamplingConfig(),
                       eos_id: Optional[int] = None,
                       lenience: float = 1.0) -> SampleOutput:
  """Samples from the target Mp with speculative decoding (Algorithm 1).

  Exactly Mp's output distribution (Appendix A.1) under `sampling` applied to both
  models (Section 2.3); at temperature 0, token for token Mp's greedy decode. Pure and
  traceable: call it directly (it jit-compiles once per static configuration) or
  inside your own `jax.jit` / `pjit`.

  Args:
    target: Mp, a `DecodeModel`.
    draft: Mq, a `DecodeModel` with the same vocabulary.
    inputs: int[B, S], whatever both models' `init` takes (T5: encoder tokens; a
      causal LM: prompts). Both models are fed the target's `start_tokens`.
    rng: one PRNG key (split per row by folding in the row index) or one key per row
      [B]; row b's output depends on its inputs and its own key only.
    gamma: draft tokens per iteration, >= 1.
    max_new_tokens: generated tokens per row at most, >= 1.
    sampling: temperature / top-k / top-p, applied identically to p and q.
    eos_id: a token that ends a row (kept in the output), or None.
    lenience: l in (0, 1], static; 1 (the default) is Algorithm 1, exact. l < 1 is
      Appendix A.5's opt-in relaxation, NOT lossless: at temperature > 0 a draft is
      accepted iff r l q(x) < p(x) and a rejection resamples norm(max(0, p - l q)),
      so that no token is emitted with probability above p(x) / l (and there is no
      lower bound: tokens the draft under-proposes can lose probability, so
      diversity can drop); at temperature 0 a draft token is accepted iff
      p(x) >= l max(p) (`lenient_greedy_step`). The acceptance rate rises to
      alpha_l = E[sum_x min(p(x) / l, q(x))] (`theory.acceptance`).

  Returns:
    `SampleOutput` with tokens int32[B, max_new_tokens], lengths int32[B],
    `SpeculativeStats` and log_probs. Both models are asked for max_new_tokens +
    gamma + 1 positions beyond their inputs.
  """
  gamma = check_positive_int("gamma", gamma)
  lenience = check_lenience(lenience)
  _check_common(target, "target", inputs, max_new_tokens, sampling, eos_id)
  _check_common(draft, "draft", inputs, max_new_tokens, sampling, eos_id)
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f"vocab_size of target ({target.vocab_size}) and draft "
                     f"({draft.vocab_size}) differ: Algorithm 1 compares p and q "
                     "token by token")
  if reads_target_features(draft):
    missing = [m for m in ("init_with_features", "extend_with_features")
               if not callable(getattr(target, m, None))]
    if missing:
      raise TypeError(f"draft reads the target's features, but target "
                      f"({type(target).__name__}) has no {' / '.join(missing)}")
    if getattr(target, "feature_size", None) != draft.feature_size:
      raise ValueError(f"feature_size of target ({getattr(target, 'feature_size', None)}) "
                       f"and draft ({draft.feature_size}) differ: the draft reads the "
                       "target's features")
  return _speculative_jit(target, draft, inputs, rng, gamma=gamma,
                          max_new_tokens=int(max_new_tokens),
                          sampling=sampling.normalized(target.vocab_size),
                          eos_id=None if eos_id is None else int(eos_id),
                          lenience=lenience)


def autoregressive_sample(target: DecodeModel, inputs: Array, rng: Array, *,
                          max_new_tokens: int,
                          sampling: SamplingConfig = SamplingConfig(),
                          eos_id: Optional[int] = None) -> SampleOutput:
  """The baseline: one target call per token, in one compiled `lax.while_loop`.

  Same arguments, outputs and per-row randomness convention as `speculative_sample`;
  at temperature 0 this is greedy decoding, the reference the speculative decode must
  equal token for token.
  """
  _check_common(target, "target", inputs, max_new_tokens, sampling, eos_id)
  return _autoregressive_jit(target, inputs, rng, max_new_tokens=int(max_new_tokens),
                             sampling=sampling.normalized(target.vocab_size),
                             eos_id=None if eos_id is None else int(eos_id))
