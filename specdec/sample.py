"""Speculative sampling (Algorithm 1 of Leviathan et al., 2023) and its baseline.

`speculative_sample(target, draft, ...)` decodes with a target Mp and a draft Mq so
that every output sequence has exactly Mp's distribution (Appendix A.1), taking
1 to gamma + 1 tokens per iteration. One iteration, per row b, independently:

  1. Draft: the proposer drafts x_1..x_gamma, x_i ~ q_i (`specdec.drafts.Proposer`).
  2. Verify: ONE call of Mp over the gamma + 1 positions [last, x_1..x_gamma] gives
     p_1..p_{gamma+1}.
  3. Accept: r_i ~ U(0, 1); n = the number of leading i with r_i < p_i(x_i)/q_i(x_i).
  4. Correct: t ~ norm(max(0, p_{n+1} - q_{n+1})) if n < gamma, else t ~ p_{gamma+1};
     commit x_1..x_n, t (steps 3 and 4: `specdec.verify`).

In the loop below, one function per step: `draws` (the iteration's r_i and keys),
`_draft` (1), `_verify` (2), `verify.verify` (3 and 4), `_commit`, and `_count` (the
statistics).

Every random draw is exact to float32 precision for every token, however rare
(`distributions.sample_categorical`, `distributions.uniform`), so the output law is
Mp's at any vocabulary size, not Mp's rounded to a 2^-23 grid.

gamma is an int, or an `AutoGamma` rule that picks it before each iteration from a
static set by Theorem 3.8, from what the decode has seen (`specdec.adaptive`; each
iteration keeps Algorithm 1's guarantee because the choice depends on the past only:
`AutoGamma.pick` reads an `adaptive.Progress`). The iteration for each gamma of the set
is its own inner loop, so every chunk has a static length and a gamma-0 iteration
makes no draft call at all.

Lenience (Appendix A.5, opt-in, off by default): with l < 1, step 3 accepts iff
r_i l q_i(x_i) < p_i(x_i) and step 4 samples norm(max(0, p - l q)); no token then has
probability above p(x) / l, but the output is no longer Mp's (see `speculative_sample`).

The whole decode is one `lax.while_loop` inside one `jax.jit`; the draft steps are a
`lax.scan` inside it. Rows advance independently (each has its own n, position and
random key) and stop on EOS or `max_new_tokens`; a finished row stops changing.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from specdec import adaptive, drafts, verify
from specdec._checks import check_common, check_lenience, check_positive_int
from specdec.adaptive import AutoGamma
from specdec.distributions import (
  SamplingConfig,
  greedy_tokens_checked,
  probabilities_checked,
  sample_categorical,
  uniform,
)
from specdec.drafts.base import where_active
from specdec.keys import iteration_keys as _iteration_keys, row_keys as _row_keys
from specdec.models.base import DecodeModel, write_rows
from specdec.outputs import AutoregressiveStats, SampleOutput, SpeculativeStats

Array = jax.Array


# ------------------------------------------------------------------------ the decode loop


@flax.struct.dataclass
class _SpeculativeState:
  """The `lax.while_loop` carry of `speculative_sample` (G: the largest gamma).

  Attributes:
    target_state: Mp's state; holds every committed token but `last`.
    proposer_state: the proposer's state (`specdec.drafts`).
    last: int32[B], the newest committed token (fed first at the next verification).
    tokens: int32[B, max_new_tokens + G + 1], committed tokens; each iteration writes
      G + 1 slots at the row's position, of which n + 1 are real.
    log_probs: float32[B, max_new_tokens + G + 1], log p of each committed token.
    num_generated: int32[B], committed tokens per row (EOS included, capped at EOS).
    done: bool[B], the row has hit EOS or max_new_tokens.
    row_keys: [B] PRNG keys.
    estimate: `adaptive.Estimate`, the online alpha estimate.
    stats: `SpeculativeStats`.
  """

  target_state: Any
  proposer_state: Any
  last: Array
  tokens: Array
  log_probs: Array
  num_generated: Array
  done: Array
  row_keys: Array
  estimate: adaptive.Estimate
  stats: SpeculativeStats


class Draws(NamedTuple):
  """One iteration's randomness, per row (`draws`).

  Attributes:
    draft_keys: [B, gamma] PRNG keys of the draft steps.
    r: float32[B, G], the uniforms r_i of the acceptance test (G: the largest gamma;
      the iteration reads the first gamma); None at temperature 0 or gamma 0.
    t_keys: [B] PRNG keys of the corrected token t.
  """

  draft_keys: Array
  r: Array | None
  t_keys: Array


def draws(
  row_keys: Array, iterations: Array, gamma: int, max_gamma: int, sampling: SamplingConfig
) -> Draws:
  """The draws of each row's next iteration: its key folded with its iteration count,
  then with 0 (draft), 1 (r) and 2 (t). Fresh each iteration, and a function of the
  row's own key only, so a row's output does not depend on its batch."""
  base = jax.vmap(jax.random.fold_in)(row_keys, iterations)
  draft_keys, r_keys, t_keys = (
    jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(base) for i in range(3)
  )
  r = (
    None if sampling.greedy or gamma == 0 else jax.vmap(lambda k: uniform(k, (max_gamma,)))(r_keys)
  )
  return Draws(jax.vmap(lambda k: jax.random.split(k, gamma))(draft_keys), r, t_keys)


class _TargetCall(NamedTuple):
  """Step 2's call of Mp on [last, x_1..x_gamma].

  Attributes:
    logits: [B, gamma + 1, V], Mp's logits at those positions.
    features: [B, gamma + 1, d], Mp's features there, or None unless the proposer
      reads them.
    target_state: Mp's state holding all gamma + 1 tokens (the loop rewinds it).
    start: int32[B], Mp's length before the call.
  """

  logits: Array
  features: Array | None
  target_state: Any
  start: Array


def _target_init(target, inputs, capacity, with_features: bool):
  if with_features:
    return target.init_with_features(inputs, capacity)
  return target.init(inputs, capacity), None


def _draft(
  proposer: drafts.Proposer, s: _SpeculativeState, keys: Array, sampling: SamplingConfig, gamma: int
) -> drafts.Proposal:
  """Step 1: x_1..x_gamma, x_i ~ q_i, from the proposer."""
  return drafts.Proposal(*proposer.propose(s.proposer_state, keys, sampling, gamma))


def _verify(target, s: _SpeculativeState, x: Array, with_features: bool) -> _TargetCall:
  """Step 2: ONE call of Mp over the gamma + 1 positions [last, x_1..x_gamma], which
  gives p_1..p_{gamma+1}."""
  start = target.lengths(s.target_state)
  chunk = jnp.concatenate([s.last[:, None], x], axis=1)
  if with_features:
    logits, features, target_state = target.extend_with_features(s.target_state, chunk)
    return _TargetCall(logits, features, target_state, start)
  logits, target_state = target.extend(s.target_state, chunk)
  return _TargetCall(logits, None, target_state, start)


def _first_eos(chunk: Array, valid: Array, eos_id: int | None) -> Array:
  """Index of the first valid EOS in each row of chunk [B, k], or k. int32[B]."""
  k = chunk.shape[1]
  if eos_id is None:
    return jnp.full(chunk.shape[:1], k, jnp.int32)
  is_eos = (chunk == eos_id) & valid
  return jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), k).astype(jnp.int32)


def _commit(
  s: _SpeculativeState,
  proposer: drafts.Proposer,
  target,
  proposal,
  call: _TargetCall,
  verdict: verify.Verdict,
  gamma: int,
  max_new_tokens: int,
  eos_id: int | None,
) -> _SpeculativeState:
  """Commits x_1..x_n, t in each active row (up to its first EOS); a finished row
  stops changing. The chunk's slots past n hold t too and are never read."""
  n, t = verdict.n, verdict.t
  active = ~s.done
  chunk = jnp.where(
    jnp.arange(gamma + 1)[None] < n[:, None],
    jnp.concatenate([proposal.x, t[:, None]], axis=1),
    t[:, None],
  )
  chunk_log_probs = (
    jnp.zeros(chunk.shape, jnp.float32)
    if verdict.p is None
    else verify.log_probs(verify.take(verdict.p, chunk))
  )
  eos_at = _first_eos(chunk, jnp.arange(gamma + 1)[None] <= n[:, None], eos_id)
  hit_eos = eos_at <= n
  num_generated = s.num_generated + jnp.where(hit_eos, eos_at, n) + 1
  keep = functools.partial(where_active, active)
  return dataclasses.replace(
    s,
    target_state=target.rewind(
      call.target_state, jnp.where(active, call.start + n + 1, call.start)
    ),
    proposer_state=proposer.commit(proposal.state, chunk, n, gamma, call.features, active),
    last=keep(t, s.last),
    tokens=keep(write_rows(s.tokens, chunk, s.num_generated), s.tokens),
    log_probs=keep(write_rows(s.log_probs, chunk_log_probs, s.num_generated), s.log_probs),
    num_generated=keep(num_generated, s.num_generated),
    done=s.done | hit_eos | (num_generated >= max_new_tokens),
  )


def _observed(n: Array, gamma: int, active: Array) -> Array:
  """bool[B, gamma]: the drafted positions whose beta the iteration observed, those
  the target's token was compared at (1..min(n + 1, gamma)), in active rows."""
  return (jnp.arange(gamma)[None] < jnp.minimum(n + 1, gamma)[:, None]) & active[:, None]


def _count(
  stats: SpeculativeStats,
  alpha_hat: Array,
  index: int,
  gamma: int,
  active: Array,
  verdict: verify.Verdict,
  draft_bad: Array,
  max_new_tokens: int,
) -> SpeculativeStats:
  """Adds one iteration at rule.gammas[index] = gamma to each active row's stats;
  `alpha_hat` [B] is the estimate the choice was made from."""
  # `SpeculativeStats.zeros`, which starts every speculative loop's stats, sets both.
  assert stats.gamma_counts is not None and stats.alpha_trace is not None
  n = verdict.n
  observed = _observed(n, gamma, active)
  slot = jnp.minimum(stats.iterations, max_new_tokens - 1)
  return dataclasses.replace(
    stats,
    iterations=stats.iterations + active,
    drafted=stats.drafted + gamma * active,
    accepted=stats.accepted + n * active,
    beta_sum=stats.beta_sum + jnp.sum(jnp.where(observed, verdict.beta, 0.0), axis=1),
    beta_count=stats.beta_count + jnp.sum(observed, axis=1, dtype=jnp.int32),
    rejected=stats.rejected + ((n < gamma) & active).astype(jnp.int32),
    nonfinite=stats.nonfinite
    + (draft_bad + jnp.sum(verdict.bad, axis=1, dtype=jnp.int32)) * active,
    gamma_counts=stats.gamma_counts.at[:, index].add(active.astype(jnp.int32)),
    alpha_trace=where_active(
      active, write_rows(stats.alpha_trace, alpha_hat[:, None], slot), stats.alpha_trace
    ),
  )


def _finalize(tokens: Array, log_probs: Array, num_generated: Array, max_new_tokens: int):
  """Truncate to max_new_tokens and zero everything past each row's length."""
  lengths = jnp.minimum(num_generated, max_new_tokens)
  valid = jnp.arange(max_new_tokens) < lengths[:, None]
  tokens = jnp.where(valid, tokens[:, :max_new_tokens], 0)
  log_probs = jnp.where(valid, log_probs[:, :max_new_tokens], 0.0)
  return tokens, log_probs, lengths


def _rule(gamma: int | AutoGamma) -> AutoGamma:
  """A fixed gamma as a rule with one choice."""
  return gamma if isinstance(gamma, AutoGamma) else AutoGamma(gammas=(gamma,), costs=(1.0,))


@functools.partial(
  jax.jit, static_argnames=("gamma", "max_new_tokens", "sampling", "eos_id", "lenience")
)
def _speculative_jit(
  target, draft, inputs, rng, *, gamma, max_new_tokens, sampling, eos_id, lenience=1.0
):
  rule = _rule(gamma)
  big = rule.max_gamma
  proposer = drafts.as_proposer(draft)
  features = proposer.reads_target_features
  batch = inputs.shape[0]
  capacity = max_new_tokens + big + 1
  target_state, prompt_features = _target_init(target, inputs, capacity, features)
  state = _SpeculativeState(
    target_state=target_state,
    proposer_state=proposer.start(inputs, capacity, big, rule.gammas[0] == 0, prompt_features),
    last=target.start_tokens(inputs),
    tokens=jnp.zeros((batch, capacity), jnp.int32),
    log_probs=jnp.zeros((batch, capacity), jnp.float32),
    num_generated=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    row_keys=_row_keys(rng, batch),
    estimate=adaptive.Estimate.zeros(batch),
    stats=SpeculativeStats.zeros(batch, rule.gammas, max_new_tokens),
  )

  def iteration(index: int, s: _SpeculativeState) -> _SpeculativeState:
    """One iteration of Algorithm 1 with gamma = rule.gammas[index] (static)."""
    gamma = rule.gammas[index]
    active = ~s.done
    d = draws(s.row_keys, s.stats.iterations, gamma, big, sampling)
    proposal = _draft(proposer, s, d.draft_keys, sampling, gamma)  # 1.
    call = _verify(target, s, proposal.x, features)  # 2.
    verdict = verify.verify(
      call.logits,
      proposal.x,
      proposal.q,
      d.r,  # 3, 4.
      d.t_keys,
      sampling,
      lenience,
    )
    committed = _commit(s, proposer, target, proposal, call, verdict, gamma, max_new_tokens, eos_id)
    return dataclasses.replace(
      committed,
      estimate=s.estimate.update(rule, verdict.beta, _observed(verdict.n, gamma, active), active),
      stats=_count(
        s.stats, s.estimate.alpha(rule), index, gamma, active, verdict, proposal.bad, max_new_tokens
      ),
    )

  def choice(s: _SpeculativeState) -> Array:
    """The index of the next iteration's gamma, from the past only (`adaptive`)."""
    return rule.pick(
      adaptive.Progress(
        alpha_hat=s.estimate.alpha(rule),
        active=~s.done,
        remaining=max_new_tokens - s.num_generated,
        iterations=s.stats.iterations,
        row_keys=s.row_keys,
      )
    )

  def cond_fn(s: _SpeculativeState):
    return jnp.any(~s.done)

  def body_fn(s: _SpeculativeState) -> _SpeculativeState:
    """One pass over the gammas: for each in turn, its iterations for as long as the
    rule keeps choosing it (zero when it does not). The same iterations, in the same
    order, as a `lax.switch` on each choice, but every loop updates the caches in
    place: a switch whose branches carry them copied every cache once per iteration
    on XLA:CPU (about 2 % of an iteration at batch 2, measured), and a decode the rule
    keeps from drafting costs what the baseline's loop costs."""
    if len(rule.gammas) == 1:
      return iteration(0, s)

    def chosen(i):
      return lambda s: jnp.any(~s.done) & (choice(s) == i)

    for i in range(len(rule.gammas)):
      s = jax.lax.while_loop(chosen(i), functools.partial(iteration, i), s)
      if rule.gammas[i] == 0 and isinstance(proposer, drafts.CatchesUp):
        # Tokens owed by iterations without drafts, fed before the next draft step:
        # a loop of zero or one pass, updated in place.
        s = jax.lax.while_loop(
          lambda s: jnp.any(proposer.owes(s.proposer_state)),
          lambda s: dataclasses.replace(s, proposer_state=proposer.catch_up(s.proposer_state)),
          s,
        )
    return s

  s = jax.lax.while_loop(cond_fn, body_fn, state)
  tokens, log_probs, lengths = _finalize(s.tokens, s.log_probs, s.num_generated, max_new_tokens)
  return SampleOutput(tokens=tokens, lengths=lengths, stats=s.stats, log_probs=log_probs)


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


def _autoregressive_loop(
  target, inputs, rng, max_new_tokens, sampling, eos_id
) -> _AutoregressiveState:
  """The baseline's `lax.while_loop`: one target call per token."""
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
    nonfinite=zeros,
  )

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
      log_p = verify.log_probs(verify.take(p[:, None], t[:, None])[:, 0])
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
      nonfinite=s.nonfinite + (bad & active).astype(jnp.int32),
    )

  return jax.lax.while_loop(cond_fn, body_fn, state)


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "sampling", "eos_id"))
def _autoregressive_jit(target, inputs, rng, *, max_new_tokens, sampling, eos_id):
  s = _autoregressive_loop(target, inputs, rng, max_new_tokens, sampling, eos_id)
  tokens, log_probs, lengths = _finalize(s.tokens, s.log_probs, s.num_generated, max_new_tokens)
  return SampleOutput(
    tokens=tokens,
    lengths=lengths,
    stats=AutoregressiveStats(iterations=s.iterations, nonfinite=s.nonfinite),
    log_probs=log_probs,
  )


@functools.partial(jax.jit, static_argnames=("rule", "max_new_tokens", "sampling", "eos_id"))
def _plain_jit(target, inputs, rng, *, rule, max_new_tokens, sampling, eos_id):
  """A decode whose rule never drafts (`adaptive.never_drafts`): the baseline's loop,
  with the statistics the speculative loop would have kept (every iteration at gamma
  0, alpha_hat at the prior)."""
  s = _autoregressive_loop(target, inputs, rng, max_new_tokens, sampling, eos_id)
  tokens, log_probs, lengths = _finalize(s.tokens, s.log_probs, s.num_generated, max_new_tokens)
  ran = jnp.arange(max_new_tokens)[None] < s.iterations[:, None]
  prior = adaptive.Estimate.zeros(inputs.shape[0]).alpha(rule)[:, None]
  stats = SpeculativeStats.zeros(inputs.shape[0], rule.gammas, max_new_tokens)
  assert stats.gamma_counts is not None  # `zeros` sets it
  stats = dataclasses.replace(
    stats,
    iterations=s.iterations,
    nonfinite=s.nonfinite,
    gamma_counts=stats.gamma_counts.at[:, rule.gammas.index(0)].set(s.iterations),
    alpha_trace=jnp.where(ran, prior, 0.0),
  )
  return SampleOutput(tokens=tokens, lengths=lengths, stats=stats, log_probs=log_probs)


# ------------------------------------------------------------------- public entry points


@dataclasses.dataclass(frozen=True)
class _Program:
  """A checked decode: its jitted function, the models it takes first and its static
  arguments."""

  jitted: Any
  models: tuple[Any, ...]
  static: dict[str, Any]

  def run(self, inputs: Array, rng: Array) -> SampleOutput:
    return self.jitted(*self.models, inputs, rng, **self.static)

  def lower(self, inputs: Array, rng: Array) -> LoweredDecode:
    traced = self.jitted.trace(*self.models, inputs, rng, **self.static)
    return LoweredDecode(traced.lower(), self.models)


@dataclasses.dataclass(frozen=True)
class LoweredDecode:
  """A decode traced and lowered ahead of time for one shape of inputs and keys
  (`lower_speculative_sample`, `lower_autoregressive_sample`; JAX's `jit(...).lower`).

  Tracing and lowering hold Python's lock; `compile` hands the program to XLA, which
  does not, so that several decodes can compile at once in threads.

  Attributes:
    lowered: the `jax.stages.Lowered` program.
    models: the models it takes before (inputs, rng).
  """

  lowered: Any
  models: tuple[Any, ...]

  def compile(self) -> Callable[[Array, Array], SampleOutput]:
    """decode(inputs, rng) -> `SampleOutput`, compiled now (or read from JAX's
    persistent cache): the same program and outputs as the sampler called with
    these models and settings. It takes inputs and keys of the lowered shapes only
    (others raise TypeError) and never compiles again."""
    compiled = self.lowered.compile()
    models = self.models

    def decode(inputs: Array, rng: Array) -> SampleOutput:
      return compiled(*models, inputs, rng)

    return decode


def _static(target: DecodeModel, max_new_tokens: int, sampling: SamplingConfig, eos_id):
  """The static arguments every decode loop compiles for, in canonical form."""
  return dict(
    max_new_tokens=int(max_new_tokens),
    sampling=sampling.normalized(target.vocab_size),
    eos_id=None if eos_id is None else int(eos_id),
  )


def _speculative_program(
  target: DecodeModel,
  draft: Any,
  inputs: Array,
  gamma: int | AutoGamma,
  max_new_tokens: int,
  sampling: SamplingConfig,
  eos_id: int | None,
  lenience: float,
) -> _Program:
  """`speculative_sample`'s arguments checked, and the loop that runs them."""
  if not isinstance(gamma, AutoGamma):
    gamma = check_positive_int("gamma", gamma)
  lenience = check_lenience(lenience)
  check_common(target, "target", inputs, max_new_tokens, sampling, eos_id)
  proposer = drafts.as_proposer(draft)
  if proposer.vocab_size != target.vocab_size:
    raise ValueError(
      f"vocab_size of target ({target.vocab_size}) and draft "
      f"({proposer.vocab_size}) differ: Algorithm 1 compares p and q "
      "token by token"
    )
  if isinstance(draft, DecodeModel):  # Same vocabulary size: its ids are checked.
    check_common(draft, "draft", inputs, max_new_tokens, sampling, eos_id, check_ids=False)
  drafts.check_target(proposer, target)
  static = _static(target, max_new_tokens, sampling, eos_id)
  if isinstance(gamma, AutoGamma) and adaptive.never_drafts(gamma):
    return _Program(_plain_jit, (target,), dict(static, rule=gamma))
  return _Program(_speculative_jit, (target, draft), dict(static, gamma=gamma, lenience=lenience))


def _autoregressive_program(
  target: DecodeModel,
  inputs: Array,
  max_new_tokens: int,
  sampling: SamplingConfig,
  eos_id: int | None,
) -> _Program:
  check_common(target, "target", inputs, max_new_tokens, sampling, eos_id)
  static = _static(target, max_new_tokens, sampling, eos_id)
  return _Program(_autoregressive_jit, (target,), static)


def reads_target_features(draft: Any) -> bool:
  """Whether `draft`'s proposer declares that it reads the target's features."""
  return drafts.as_proposer(draft).reads_target_features


def speculative_sample(
  target: DecodeModel,
  draft: Any,
  inputs: Array,
  rng: Array,
  *,
  gamma: int | AutoGamma,
  max_new_tokens: int,
  sampling: SamplingConfig = SamplingConfig(),
  eos_id: int | None = None,
  lenience: float = 1.0,
) -> SampleOutput:
  """Samples from the target Mp with speculative decoding (Algorithm 1).

  Exactly Mp's output distribution (Appendix A.1) under `sampling` applied to both
  models (Section 2.3); at temperature 0, token for token Mp's greedy decode. Pure and
  traceable: call it directly (it jit-compiles once per static configuration) or
  inside your own `jax.jit` / `pjit`.

  Args:
    target: Mp, a `DecodeModel`.
    draft: Mq: a `DecodeModel` with the same vocabulary, a feature draft, or any
      `specdec.drafts.Proposer`.
    inputs: int[B, S], whatever both models' `init` takes (T5: encoder tokens; a
      causal LM: prompts). Both models are fed the target's `start_tokens`.
    rng: one PRNG key (split per row by folding in the row index) or one key per row
      [B]; with a fixed gamma, row b's output depends on its inputs, its own key and
      its logits only (which the batch can change by float rounding; an AutoGamma
      rule's gamma is the batch's: docs/theory.md, "Per row").
    gamma: draft tokens per iteration, an int >= 1; or an `AutoGamma` rule choosing it
      before each iteration (`specdec.adaptive`; exact too: the choice depends on the
      past only). A rule that picks gamma 0 before anything is seen never drafts
      (`adaptive.never_drafts`): that decode runs the baseline's loop, token for token
      `autoregressive_sample`'s for the same `rng`, with no draft call.
    max_new_tokens: generated tokens per row at most, >= 1.
    sampling: temperature / top-k / top-p, applied identically to p and q.
    eos_id: a token that ends a row (kept in the output), or None.
    lenience: l in (0, 1], static; 1 (the default) is Algorithm 1, exact. l < 1 is
      Appendix A.5's opt-in relaxation, NOT lossless: at temperature > 0 a draft is
      accepted iff r l q(x) < p(x) and a rejection resamples norm(max(0, p - l q)),
      so that no token is emitted with probability above p(x) / l (and there is no
      lower bound: tokens the draft under-proposes can lose probability, so
      diversity can drop); at temperature 0 a draft token is accepted iff
      p(x) >= l max(p) (`verify.lenient_greedy_step`). The acceptance rate rises to
      alpha_l = E[sum_x min(p(x) / l, q(x))] (`theory.acceptance`).

  Returns:
    `SampleOutput` with tokens int32[B, max_new_tokens], lengths int32[B],
    `SpeculativeStats` and log_probs. Both models are asked for max_new_tokens +
    G + 1 positions beyond their inputs (G: the largest gamma); a draft model 2 more
    under an `AutoGamma` rule that includes gamma 0 (`drafts.ModelProposer.start`).

  Raises:
    ValueError: naming the draft and gamma where the draft cannot hold those
      positions (raised while the decode is traced).
  """
  return _speculative_program(
    target, draft, inputs, gamma, max_new_tokens, sampling, eos_id, lenience
  ).run(inputs, rng)


def autoregressive_sample(
  target: DecodeModel,
  inputs: Array,
  rng: Array,
  *,
  max_new_tokens: int,
  sampling: SamplingConfig = SamplingConfig(),
  eos_id: int | None = None,
) -> SampleOutput:
  """The baseline: one target call per token, in one compiled `lax.while_loop`.

  Same arguments, outputs and per-row randomness convention as `speculative_sample`;
  at temperature 0 this is greedy decoding, the reference the speculative decode must
  equal token for token.
  """
  return _autoregressive_program(target, inputs, max_new_tokens, sampling, eos_id).run(inputs, rng)


def lower_speculative_sample(
  target: DecodeModel,
  draft: Any,
  inputs: Array,
  rng: Array,
  *,
  gamma: int | AutoGamma,
  max_new_tokens: int,
  sampling: SamplingConfig = SamplingConfig(),
  eos_id: int | None = None,
  lenience: float = 1.0,
) -> LoweredDecode:
  """`speculative_sample` with these arguments, traced and lowered ahead of time for
  the shapes of `inputs` and `rng` (their values are not used): `.compile()` gives
  the decode as a function of (inputs, rng). The same checks and errors as
  `speculative_sample`. For a compile time apart from the decode (benchmarks), or
  several programs compiled at once."""
  return _speculative_program(
    target, draft, inputs, gamma, max_new_tokens, sampling, eos_id, lenience
  ).lower(inputs, rng)


def lower_autoregressive_sample(
  target: DecodeModel,
  inputs: Array,
  rng: Array,
  *,
  max_new_tokens: int,
  sampling: SamplingConfig = SamplingConfig(),
  eos_id: int | None = None,
) -> LoweredDecode:
  """`autoregressive_sample` traced and lowered ahead of time, as
  `lower_speculative_sample`."""
  return _autoregressive_program(target, inputs, max_new_tokens, sampling, eos_id).lower(
    inputs, rng
  )


def speculative_loop(
  target: DecodeModel,
  draft: Any,
  inputs: Array,
  rng: Array,
  *,
  gamma: int | AutoGamma,
  max_new_tokens: int,
  sampling: SamplingConfig = SamplingConfig(),
  eos_id: int | None = None,
) -> SampleOutput:
  """`speculative_sample`'s compiled loop (Algorithm 1), also for a rule that never
  drafts, which `speculative_sample` hands to the baseline's loop instead: here every
  iteration of such a rule runs the speculative loop at gamma 0. That is what a gamma-0
  iteration costs inside a decode that drafts (`specdec.costs.iteration_costs`). Same
  arguments and output as `speculative_sample`, which checks them; this does not.
  """
  return _speculative_jit(
    target,
    draft,
    inputs,
    rng,
    gamma=gamma,
    max_new_tokens=int(max_new_tokens),
    sampling=sampling.normalized(target.vocab_size),
    eos_id=None if eos_id is None else int(eos_id),
  )
