"""Algorithm 1 must be lossless, fast to compile, per-row and loud on bad input.

Statistical tests use fixed seeds, so they are deterministic; each states the
false-alarm rate its threshold would have under fresh randomness.
"""

import functools
import itertools
import re

from helpers import (
  CHI2_PVALUE,
  EMISSION_RTOL,
  GREEDY,
  NUM_NEW,
  ConstantLM,
  bigram_model,
  chi_square_pvalue,
  context_model,
  emission_probabilities,
  exact_sequence_distribution,
  first_in_default,
  normalize,
  running_mean_logits,
  step_cases,
  toy_tables,
)
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import specdec
from specdec import sample as sample_lib, verify as verify_lib
from specdec.distributions import SamplingConfig, probabilities

# ------------------------------------------------------------------ one step, exactly


@pytest.mark.parametrize("name", list(step_cases()))
def test_one_step_emits_exactly_p(name):
  p, q = step_cases()[name]
  emitted = emission_probabilities(p, q)
  np.testing.assert_allclose(np.asarray(emitted), np.asarray(p), atol=2e-7, rtol=EMISSION_RTOL)


def test_accept_rule_is_r_below_p_over_q_without_dividing():
  p_x = jnp.array([0.2, 0.2, 0.5, 0.0, 0.3])
  q_x = jnp.array([0.4, 0.4, 0.5, 0.0, 0.0])
  r = jnp.array([0.49, 0.51, 0.999, 0.5, 0.7])
  assert verify_lib.accepts(r, p_x, q_x).tolist() == [True, False, True, False, True]


def test_residual_falls_back_to_p_when_empty_and_is_q_free_when_q_is_zero():
  p = normalize([1, 2, 3])
  np.testing.assert_allclose(verify_lib.residual(p, p), p)
  np.testing.assert_allclose(verify_lib.residual(p, jnp.zeros(3)), p)
  np.testing.assert_allclose(
    verify_lib.residual(p, normalize([3, 2, 1])), normalize([0, 0, 2 / 6]), atol=1e-7
  )


def test_num_accepted_counts_only_the_leading_run():
  acc = jnp.array([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], bool)
  assert verify_lib.num_accepted(acc).tolist() == [2, 0, 4]


@pytest.mark.parametrize("gamma", [1, 3])
@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_speculative_step_samples_p_in_distribution(gamma):
  """Steps 3-4 themselves (not the closed form): 200k draws of the first token."""
  v, batch = 5, 200_000
  p1 = normalize([0.4, 0.3, 0.2, 0.05, 0.05])
  q1 = normalize([0.05, 0.05, 0.2, 0.3, 0.4])
  key_x, key_r, key_t = jax.random.split(jax.random.key(42), 3)
  x = jax.random.categorical(key_x, jnp.log(q1), shape=(batch, gamma)).astype(jnp.int32)
  q = jnp.broadcast_to(q1, (batch, gamma, v))
  p = jnp.broadcast_to(p1, (batch, gamma + 1, v))
  r = jax.random.uniform(key_r, (batch, gamma))
  n, t, _ = verify_lib.speculative_step(p, q, x, r, jax.random.split(key_t, batch))
  first = np.where(np.asarray(n) > 0, np.asarray(x[:, 0]), np.asarray(t))
  observed = np.bincount(first, minlength=v)
  expected = np.asarray(p1, np.float64) / np.sum(np.asarray(p1, np.float64)) * batch
  assert scipy_stats.chisquare(observed, expected).pvalue > CHI2_PVALUE


# ---------------------------------------------------- whole sequences, statistically


NUM_SEQUENCES = 100_000


SEQUENCE_CASES = {
  "temperature_1": (SamplingConfig(1.0), 3, None),
  "temperature_0.6_top_k_3": (SamplingConfig(0.6, top_k=3), 2, None),
  "top_p_0.8": (SamplingConfig(1.0, top_p=0.8), 4, None),
  "temperature_1_with_eos": (SamplingConfig(1.0), 3, 4),
}


def draw_sequences(target, draft, sampling, gamma, eos_id, seed):
  inputs = jnp.full((NUM_SEQUENCES, 1), 1, jnp.int32)
  out = specdec.speculative_sample(
    target,
    draft,
    inputs,
    jax.random.key(seed),
    gamma=gamma,
    max_new_tokens=NUM_NEW,
    sampling=sampling,
    eos_id=eos_id,
  )
  return np.asarray(out.tokens), out


@pytest.mark.parametrize("name", list(SEQUENCE_CASES))
@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_speculative_sequences_follow_the_target_distribution(name):
  sampling, gamma, eos_id = SEQUENCE_CASES[name]
  target_table, draft_table = toy_tables(seed=7)
  samples, out = draw_sequences(
    bigram_model(target_table), bigram_model(draft_table), sampling, gamma, eos_id, seed=11
  )
  dist = exact_sequence_distribution(target_table, 1, NUM_NEW, sampling, eos_id)
  assert abs(sum(dist.values()) - 1.0) < 1e-9
  # The draft is imperfect, so some drafts were rejected: the test is not vacuous.
  assert 0 < int(out.stats.accepted.sum()) < int(out.stats.drafted.sum())
  assert chi_square_pvalue(samples, dist) > CHI2_PVALUE


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_negative_control_accepting_every_draft_is_detected(monkeypatch):
  """The same test must reject a sampler that skips the acceptance test."""
  sampling, gamma, eos_id = SEQUENCE_CASES["temperature_1"]
  target_table, draft_table = toy_tables(seed=7)
  dist = exact_sequence_distribution(target_table, 1, NUM_NEW, sampling, eos_id)
  monkeypatch.setattr(
    verify_lib, "accepts", lambda r, p_x, q_x, lenience=1.0: jnp.ones_like(r, bool)
  )
  jax.clear_caches()
  try:
    samples, _ = draw_sequences(
      bigram_model(target_table), bigram_model(draft_table), sampling, gamma, eos_id, seed=11
    )
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  assert chi_square_pvalue(samples, dist) < CHI2_PVALUE


# ----------------------------------------------------------- temperature 0 is greedy Mp


@pytest.mark.parametrize("gamma,batch", first_in_default(1, [(2, 3), (7, 5), (1, 1), (4, 8)]))
def test_greedy_speculative_equals_greedy_target(gamma, batch):
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jax.random.randint(jax.random.key(2), (batch, 3), 0, vocab)
  spec = specdec.speculative_sample(
    target,
    draft,
    inputs,
    jax.random.key(3),
    gamma=gamma,
    max_new_tokens=12,
    sampling=GREEDY,
    eos_id=5,
  )
  base = specdec.autoregressive_sample(
    target, inputs, jax.random.key(4), max_new_tokens=12, sampling=GREEDY, eos_id=5
  )
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)


def test_greedy_with_the_target_as_its_own_draft_accepts_everything():
  target = context_model(jax.random.key(0), 16)
  inputs = jnp.ones((2, 2), jnp.int32)
  out = specdec.speculative_sample(
    target, target, inputs, jax.random.key(0), gamma=3, max_new_tokens=12, sampling=GREEDY
  )
  np.testing.assert_array_equal(out.stats.accepted, 3 * out.stats.iterations)
  np.testing.assert_array_equal(out.stats.iterations, [3, 3])
  np.testing.assert_allclose(out.stats.alpha_hat, 1.0)


# -------------------------------------------------------------------- rows, keys, EOS


def test_a_row_alone_equals_the_same_row_in_a_batch():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jax.random.randint(jax.random.key(2), (6, 3), 0, vocab)
  keys = jax.random.split(jax.random.key(9), 6)
  cfg = SamplingConfig(1.0)
  batch = specdec.speculative_sample(
    target, draft, inputs, keys, gamma=3, max_new_tokens=10, sampling=cfg, eos_id=5
  )
  for row in (0, 4):
    alone = specdec.speculative_sample(
      target,
      draft,
      inputs[row : row + 1],
      keys[row : row + 1],
      gamma=3,
      max_new_tokens=10,
      sampling=cfg,
      eos_id=5,
    )
    np.testing.assert_array_equal(alone.tokens[0], batch.tokens[row])
    assert int(alone.stats.accepted[0]) == int(batch.stats.accepted[row])


def test_baseline_row_alone_equals_the_same_row_in_a_batch():
  target = context_model(jax.random.key(0), 16)
  inputs = jax.random.randint(jax.random.key(2), (4, 3), 0, 16)
  keys = jax.random.split(jax.random.key(9), 4)
  batch = specdec.autoregressive_sample(target, inputs, keys, max_new_tokens=8)
  alone = specdec.autoregressive_sample(target, inputs[2:3], keys[2:3], max_new_tokens=8)
  np.testing.assert_array_equal(alone.tokens[0], batch.tokens[2])


def test_raw_uint32_keys_work_like_typed_keys():
  target = context_model(jax.random.key(0), 16)
  inputs = jnp.ones((2, 2), jnp.int32)
  a = specdec.autoregressive_sample(target, inputs, jax.random.PRNGKey(3), max_new_tokens=6)
  b = specdec.autoregressive_sample(target, inputs, jax.random.key(3), max_new_tokens=6)
  np.testing.assert_array_equal(a.tokens, b.tokens)


def test_rows_stop_at_eos_and_are_padded_after_it():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jax.random.randint(jax.random.key(5), (64, 2), 0, vocab)
  eos = 3
  out = specdec.speculative_sample(
    target,
    draft,
    inputs,
    jax.random.key(1),
    gamma=4,
    max_new_tokens=20,
    sampling=SamplingConfig(1.0),
    eos_id=eos,
  )
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  ended = lengths < 20
  assert ended.any() and (~ended).any()
  for row, length in zip(tokens, lengths):
    assert eos not in row[: length - 1]
    assert (row[length:] == 0).all()
    if length < 20:
      assert row[length - 1] == eos


@pytest.mark.slow  # the default suite keeps Equation 1's count of tokens; CI runs this after it
def test_stats_count_every_token_produced():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jax.random.randint(jax.random.key(5), (32, 2), 0, vocab)
  gamma, max_new = 5, 17
  out = specdec.speculative_sample(
    target,
    draft,
    inputs,
    jax.random.key(1),
    gamma=gamma,
    max_new_tokens=max_new,
    sampling=SamplingConfig(1.0),
  )
  produced = np.asarray(out.stats.accepted + out.stats.iterations)
  np.testing.assert_array_equal(out.stats.drafted, gamma * out.stats.iterations)
  np.testing.assert_array_equal(out.lengths, np.minimum(produced, max_new))
  # The last iteration overshoots by at most gamma tokens.
  assert (produced >= max_new).all() and (produced < max_new + gamma + 1).all()
  assert ((out.stats.alpha_hat >= 0) & (out.stats.alpha_hat <= 1)).all()


@pytest.mark.parametrize("gamma", first_in_default(1, [2, 5]))
def test_tokens_per_iteration_match_equation_1_for_constant_models(gamma):
  vocab, batch = 6, 4000
  rng = np.random.default_rng(3)
  lp, lq = rng.standard_normal(vocab) * 1.5, rng.standard_normal(vocab) * 1.5
  target = specdec.CausalLM.from_fn(
    lambda t: jnp.broadcast_to(jnp.asarray(lp, jnp.float32), t.shape + (vocab,)), vocab
  )
  draft = specdec.CausalLM.from_fn(
    lambda t: jnp.broadcast_to(jnp.asarray(lq, jnp.float32), t.shape + (vocab,)), vocab
  )
  out = specdec.speculative_sample(
    target,
    draft,
    jnp.zeros((batch, 1), jnp.int32),
    jax.random.key(0),
    gamma=gamma,
    max_new_tokens=24,
    sampling=SamplingConfig(1.0),
  )
  p = probabilities(jnp.asarray(lp), SamplingConfig(1.0))
  q = probabilities(jnp.asarray(lq), SamplingConfig(1.0))
  alpha = float(specdec.theory.acceptance(p, q))
  np.testing.assert_allclose(out.stats.alpha_hat, alpha, rtol=1e-5)
  iterations = int(out.stats.iterations.sum())
  measured = int((out.stats.accepted + out.stats.iterations).sum()) / iterations
  # n + 1 is a truncated geometric: P(n + 1 = k) = alpha^(k-1) (1 - alpha), k <= gamma,
  # and alpha^gamma at k = gamma + 1. Pass within 4 standard errors (false alarm 6e-5).
  k = np.arange(1, gamma + 2)
  pk = np.append(alpha ** (k[:-1] - 1) * (1 - alpha), alpha**gamma)
  mean, std = float(pk @ k), float(np.sqrt(pk @ k**2 - (pk @ k) ** 2))
  np.testing.assert_allclose(mean, specdec.theory.expected_tokens(alpha, gamma))
  assert abs(measured - mean) < 4 * std / np.sqrt(iterations)
  # Every iteration either rejected once or accepted all gamma drafts, the latter
  # with probability alpha^gamma: a binomial count, within 4 SE.
  full = int(out.stats.iterations.sum() - out.stats.rejected.sum())
  assert 0 <= full <= iterations
  assert int(out.stats.accepted.sum()) >= gamma * full
  p_full = alpha**gamma
  assert abs(full - iterations * p_full) < 4 * np.sqrt(iterations * p_full * (1 - p_full))
  # The accept-count estimate: each test is a Bernoulli(alpha) trial; within 4 SE.
  accepted, trials = (
    int(out.stats.accepted.sum()),
    int((out.stats.accepted + out.stats.rejected).sum()),
  )
  pooled = accepted / trials
  assert abs(pooled - alpha) < 4 * np.sqrt(alpha * (1 - alpha) / trials)
  np.testing.assert_allclose(
    np.asarray(out.stats.alpha_from_accepts),
    np.asarray(out.stats.accepted / np.maximum(out.stats.accepted + out.stats.rejected, 1)),
    rtol=1e-6,
  )


def test_nan_and_infinite_logits_never_give_nan():
  vocab = 8

  def wild(tokens):
    base = jnp.where(tokens[..., None] % 2 == 0, jnp.nan, -jnp.inf)
    col = jnp.arange(vocab)
    return jnp.where(col == 3, jnp.inf, jnp.where(col == 5, 1.0, base))

  target = specdec.CausalLM.from_fn(wild, vocab)
  draft = specdec.CausalLM.from_fn(lambda t: jnp.full(t.shape + (vocab,), -jnp.inf), vocab)
  out = specdec.speculative_sample(
    target,
    draft,
    jnp.zeros((4, 1), jnp.int32),
    jax.random.key(0),
    gamma=3,
    max_new_tokens=6,
    sampling=SamplingConfig(0.7, top_p=0.9),
  )
  assert np.isfinite(np.asarray(out.stats.alpha_hat)).all()
  assert ((np.asarray(out.tokens) >= 0) & (np.asarray(out.tokens) < vocab)).all()
  # +inf logit at 3 dominates the target: every token is 3.
  assert (np.asarray(out.tokens) == 3).all()


# ----------------------------------------------------------- compilation and tracing


def test_same_shapes_compile_once():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  other_target = context_model(jax.random.key(7), vocab)  # new weights, same shapes
  kwargs = dict(gamma=3, max_new_tokens=6, sampling=SamplingConfig(0.9), eos_id=2)
  inputs = jnp.ones((2, 3), jnp.int32)
  specdec.speculative_sample(target, draft, inputs, jax.random.key(0), **kwargs)
  before = sample_lib._speculative_jit._cache_size()
  specdec.speculative_sample(target, draft, inputs + 1, jax.random.key(1), **kwargs)
  specdec.speculative_sample(other_target, draft, inputs, jax.random.key(2), **kwargs)
  assert sample_lib._speculative_jit._cache_size() == before

  specdec.autoregressive_sample(target, inputs, jax.random.key(0), max_new_tokens=6)
  before = sample_lib._autoregressive_jit._cache_size()
  specdec.autoregressive_sample(other_target, inputs + 2, jax.random.key(5), max_new_tokens=6)
  assert sample_lib._autoregressive_jit._cache_size() == before


def test_samplers_are_traceable_inside_a_user_jit():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jax.random.randint(jax.random.key(2), (3, 3), 0, vocab)

  @jax.jit
  def decode(target, draft, inputs, key):
    spec = specdec.speculative_sample(
      target, draft, inputs, key, gamma=2, max_new_tokens=8, sampling=SamplingConfig(1.0)
    )
    base = specdec.autoregressive_sample(target, inputs, key, max_new_tokens=8)
    return spec.tokens, base.tokens

  spec_tokens, base_tokens = decode(target, draft, inputs, jax.random.key(4))
  direct = specdec.speculative_sample(
    target,
    draft,
    inputs,
    jax.random.key(4),
    gamma=2,
    max_new_tokens=8,
    sampling=SamplingConfig(1.0),
  )
  np.testing.assert_array_equal(spec_tokens, direct.tokens)
  assert base_tokens.shape == (3, 8)


def test_the_decode_is_one_while_loop_with_one_target_call_per_iteration():
  calls = {"target": 0}
  vocab = 8
  table = jnp.asarray(np.random.default_rng(0).standard_normal((vocab, vocab)), jnp.float32)

  def target_fn(tokens):
    calls["target"] += 1  # Counts traces of the target's logits function.
    return table[tokens]

  target = specdec.CausalLM.from_fn(target_fn, vocab)
  draft = bigram_model(table * 0.5)
  fn = lambda i, k: (
    specdec.speculative_sample(
      target, draft, i, k, gamma=4, max_new_tokens=9, sampling=SamplingConfig(1.0)
    ).tokens
  )
  jaxpr = jax.make_jaxpr(fn)(jnp.ones((2, 1), jnp.int32), jax.random.key(0))
  text = str(jaxpr)
  assert text.count("while[") == 1
  assert calls["target"] == 1


# ------------------------------------------------------------------------- bad input


def _good():
  vocab = 8
  table = jnp.zeros((vocab, vocab))
  return dict(
    target=bigram_model(table),
    draft=bigram_model(table),
    inputs=jnp.ones((2, 1), jnp.int32),
    rng=jax.random.key(0),
  )


BAD_ARGUMENTS = [
  (dict(gamma=0), ValueError, "gamma"),
  (dict(gamma=2.0), TypeError, "gamma"),
  (dict(gamma=True), TypeError, "gamma"),
  (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
  (dict(max_new_tokens=None), TypeError, "max_new_tokens"),
  (dict(sampling=SamplingConfig(1.0, top_k=9)), ValueError, "top_k"),
  (dict(sampling="greedy"), TypeError, "sampling"),
  (dict(draft=bigram_model(jnp.zeros((9, 9)))), ValueError, "vocab_size"),
  (dict(draft="not a model"), TypeError, "draft"),
  (dict(inputs=jnp.ones((3,), jnp.int32)), ValueError, "inputs"),
  (dict(inputs=jnp.ones((2, 1), jnp.float32)), TypeError, "inputs"),
  (dict(inputs=jnp.ones((0, 1), jnp.int32)), ValueError, "inputs"),
  (dict(inputs=jnp.ones((2, 0), jnp.int32)), ValueError, "inputs"),
  (dict(inputs=[[1]]), TypeError, "inputs"),
  (dict(eos_id=8), ValueError, "eos_id"),
  (dict(eos_id=-1), ValueError, "eos_id"),
  (dict(eos_id=1.0), TypeError, "eos_id"),
  (dict(target=bigram_model(jnp.zeros((8, 8)), max_length=8)), ValueError, "max_length"),
  (dict(rng=jnp.zeros((3,), jnp.uint32)), ValueError, "rng"),
  (dict(rng=jax.random.split(jax.random.key(0), 3)), ValueError, "rng"),
]


@pytest.mark.parametrize(
  "override,error,name", BAD_ARGUMENTS, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD_ARGUMENTS)]
)
@pytest.mark.parametrize(
  "entry",
  [specdec.speculative_sample, sample_lib.lower_speculative_sample],
  ids=["sample", "lower ahead of time"],
)
def test_bad_arguments_raise_errors_naming_them(entry, override, error, name):
  args = dict(_good(), gamma=3, max_new_tokens=4, sampling=SamplingConfig(1.0), eos_id=1)
  args.update(override)
  with pytest.raises(error, match=name):
    entry(args.pop("target"), args.pop("draft"), args.pop("inputs"), args.pop("rng"), **args)


def test_a_cache_too_short_for_inputs_new_tokens_and_gamma_is_refused():
  # Prompt 2 + max_new_tokens 4 + gamma 3 + 1 = 10 positions are needed.
  inputs = jnp.ones((1, 2), jnp.int32)
  ok = bigram_model(jnp.zeros((8, 8)), max_length=10)
  specdec.speculative_sample(ok, ok, inputs, jax.random.key(0), gamma=3, max_new_tokens=4)
  short = bigram_model(jnp.zeros((8, 8)), max_length=9)
  with pytest.raises(ValueError, match="max_length"):
    specdec.speculative_sample(short, ok, inputs, jax.random.key(0), gamma=3, max_new_tokens=4)


# ------------------------------------------- exact at the full vocabulary (V >= 32768)


# Token 0 has almost all the mass; each of the other V - 1 tokens has 3e-8, a quarter
# of the 2^-23 step of a float32 uniform. A sampler whose law is quantized to that
# step can reach about one tail token in four, each with 4x its probability: the tail
# draws then collide ~4x as often as under the true law (uniform over the tail).
FULL_VOCAB, TAIL_PROB = 32768, 3e-8


def _tail_model():
  logits = jnp.full((FULL_VOCAB,), np.log(TAIL_PROB), jnp.float32).at[0].set(0.0)
  return ConstantLM(logits=logits, vocab_size=FULL_VOCAB)


def assert_tail_follows_the_law(tokens, false_alarm):
  """The tail's draws: their number (binomial) and their collisions (Poisson).

  Given N tail draws uniform over V - 1 tokens, the number of colliding pairs is
  Poisson with mean C(N, 2) / (V - 1) to within O(N^3 / V^2) (birthday problem). The
  count is tested two-sided, the collisions for excess, each at `false_alarm`.
  """
  tokens = np.asarray(tokens).ravel()
  total = tokens.size
  tail_mass = (FULL_VOCAB - 1) * TAIL_PROB / (1 + (FULL_VOCAB - 1) * TAIL_PROB)
  tail = tokens[tokens != 0]
  count_p = scipy_stats.binomtest(tail.size, total, tail_mass).pvalue
  assert count_p > false_alarm, (tail.size, total * tail_mass)
  counts = np.bincount(tail, minlength=FULL_VOCAB)
  collisions = int(np.sum(counts * (counts - 1) // 2))
  mean = tail.size * (tail.size - 1) / 2 / (FULL_VOCAB - 1)
  excess_p = scipy_stats.poisson.sf(collisions - 1, mean)  # P(X >= collisions)
  assert excess_p > false_alarm, (
    f"{collisions} colliding pairs among {tail.size} tail draws, {mean:.1f} expected "
    f"under the target's law (P = {excess_p:.1e}): the tail is drawn from a coarser "
    "law than p"
  )
  return tail.size, collisions, mean


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_baseline_draws_tokens_far_below_2_to_the_minus_23_with_their_probability():
  """2^20 draws at V = 32768: ~1030 in the tail, ~16 collisions expected under p.

  False alarm 1e-4 per check. Under a law quantized to 2^-23 steps (one float32
  uniform inverted through the CDF) ~64 collisions are expected: P(pass) < 1e-9.
  """
  model = _tail_model()
  out = specdec.autoregressive_sample(
    model, jnp.zeros((1024, 1), jnp.int32), jax.random.key(20), max_new_tokens=1024
  )
  assert_tail_follows_the_law(out.tokens, false_alarm=1e-4)


@pytest.mark.slow  # ~100 s on 2 cores: 2^20 tokens through the whole Algorithm 1.
def test_speculative_draws_tokens_far_below_2_to_the_minus_23_with_their_probability():
  """Draft == target, so every token is a draft draw or the bonus draw from p.

  2^20 tokens: ~1030 tail draws, ~16 collisions expected under p; false alarm 1e-4
  per check. Under a 2^-23-quantized law ~64 are expected.
  """
  model = _tail_model()
  out = specdec.speculative_sample(
    model, model, jnp.zeros((256, 1), jnp.int32), jax.random.key(21), gamma=7, max_new_tokens=4096
  )
  assert int(out.stats.accepted.sum()) == int(out.stats.drafted.sum())  # all accepted
  assert_tail_follows_the_law(out.tokens, false_alarm=1e-4)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_zero_probability_tokens_are_never_drawn_at_full_vocabulary():
  # Zero-probability tokens interleaved with tiny and large ones, in every block.
  rng = np.random.default_rng(3)
  logits = np.where(
    rng.random(FULL_VOCAB) < 0.5, -np.inf, rng.standard_normal(FULL_VOCAB) * 8
  ).astype(np.float32)
  model = ConstantLM(logits=jnp.asarray(logits), vocab_size=FULL_VOCAB)
  inputs = jnp.zeros((64, 1), jnp.int32)
  base = specdec.autoregressive_sample(model, inputs, jax.random.key(0), max_new_tokens=64)
  draft = ConstantLM(
    logits=jnp.asarray(rng.standard_normal(FULL_VOCAB), jnp.float32), vocab_size=FULL_VOCAB
  )
  spec = specdec.speculative_sample(
    model, draft, inputs, jax.random.key(1), gamma=3, max_new_tokens=64
  )
  for out in (base, spec):
    assert np.isfinite(logits[np.asarray(out.tokens)]).all()


# ----------------------------------------------------------- bad input, NaN, configs


def test_token_ids_outside_the_vocabulary_raise_naming_inputs():
  vocab = 64
  model = bigram_model(jnp.zeros((vocab, vocab)))
  for bad, asarray in itertools.product(
    ([[5, 7, 100, 0]], [[5, -1, 3, 0]]), (jnp.asarray, np.asarray)
  ):
    inputs = asarray(bad, np.int32)  # device arrays and host (numpy) arrays alike
    with pytest.raises(ValueError, match=r"inputs .*ids in \[-?\d+, \d+\]"):
      specdec.speculative_sample(model, model, inputs, jax.random.key(0), gamma=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="inputs"):
      specdec.autoregressive_sample(model, inputs, jax.random.key(0), max_new_tokens=4)


def test_nonfinite_logits_are_counted_per_row():
  vocab = 8

  def broken(tokens):
    # Row 1's prompt token is 6: its logits are NaN at every position after a 6
    # and finite elsewhere; rows 0 and 2 never see a 6.
    logits = jax.nn.one_hot((tokens + 1) % 5, vocab) * 4.0
    return jnp.where((tokens == 6)[..., None], jnp.nan, logits)

  target = specdec.CausalLM.from_fn(broken, vocab)
  # Verified positions count too (drafts included): the draft never proposes a 6.
  draft = bigram_model(jnp.zeros((vocab, vocab)).at[:, 6].set(-jnp.inf))
  inputs = jnp.asarray([[1], [6], [2]], jnp.int32)
  for sampling in (SamplingConfig(1.0), GREEDY):
    base = specdec.autoregressive_sample(
      target, inputs, jax.random.key(0), max_new_tokens=5, sampling=sampling
    )
    spec = specdec.speculative_sample(
      target, draft, inputs, jax.random.key(0), gamma=2, max_new_tokens=5, sampling=sampling
    )
    assert np.asarray(base.stats.nonfinite).tolist() == [0, 1, 0]
    bad = np.asarray(spec.stats.nonfinite)
    assert bad[0] == 0 and bad[2] == 0 and bad[1] >= 1
    assert np.isfinite(np.asarray(spec.log_probs)).all()


def test_numpy_scalars_and_equivalent_configs_share_one_compiled_decode():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jnp.ones((2, 3), jnp.int32)
  configs = [
    SamplingConfig(0.75, top_k=None, top_p=None),
    SamplingConfig(np.float32(0.75), top_k=np.int64(vocab), top_p=1.0),
    SamplingConfig(0.75, top_k=vocab, top_p=np.float64(1.0)),
  ]
  assert SamplingConfig(np.float32(0.5), np.int64(4), np.float32(0.9)) == SamplingConfig(
    float(np.float32(0.5)), 4, float(np.float32(0.9))
  )
  outs = []
  specdec.speculative_sample(
    target, draft, inputs, jax.random.key(0), gamma=2, max_new_tokens=4, sampling=configs[0]
  )
  before = sample_lib._speculative_jit._cache_size()
  for cfg in configs:
    outs.append(
      specdec.speculative_sample(
        target, draft, inputs, jax.random.key(0), gamma=np.int64(2), max_new_tokens=4, sampling=cfg
      ).tokens
    )
  assert sample_lib._speculative_jit._cache_size() == before
  for tokens in outs:
    np.testing.assert_array_equal(tokens, outs[0])


@pytest.mark.slow  # after the default suite
def test_rbg_raw_keys_are_accepted():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  inputs = jnp.ones((2, 3), jnp.int32)
  typed = jax.random.key(5, impl="rbg")
  raw = jax.random.key_data(typed)
  assert raw.shape == (4,)
  a = specdec.speculative_sample(target, target, inputs, raw, gamma=2, max_new_tokens=4)
  b = specdec.speculative_sample(target, target, inputs, typed, gamma=2, max_new_tokens=4)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  per_row = jax.random.key_data(jax.random.split(typed, 2))
  specdec.autoregressive_sample(target, inputs, per_row, max_new_tokens=4)


def test_log_probs_are_the_targets_sampling_log_probabilities_of_the_output():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jax.random.randint(jax.random.key(2), (3, 2), 0, vocab)
  sampling = SamplingConfig(0.8, top_k=6)
  out = specdec.speculative_sample(
    target, draft, inputs, jax.random.key(3), gamma=3, max_new_tokens=7, sampling=sampling, eos_id=4
  )
  full = jnp.concatenate([inputs, out.tokens], axis=1)
  probs = probabilities(running_mean_logits(full, target.params), sampling)
  expected = np.log(
    np.maximum(
      np.take_along_axis(np.asarray(probs[:, 1:-1]), np.asarray(out.tokens)[..., None], -1)[..., 0],
      1e-30,
    )
  )
  valid = np.arange(7)[None] < np.asarray(out.lengths)[:, None]
  np.testing.assert_allclose(
    np.where(valid, np.asarray(out.log_probs), 0), np.where(valid, expected, 0), atol=1e-5
  )
  np.testing.assert_allclose(out.scores, np.asarray(out.log_probs).sum(-1), rtol=1e-6)
  greedy = specdec.speculative_sample(
    target, draft, inputs, jax.random.key(3), gamma=3, max_new_tokens=7, sampling=GREEDY
  )
  assert not np.asarray(greedy.log_probs).any()


def _program_loops(hlo_text):
  """The compiled program's while loops but the PRNG's: XLA:CPU alone rolls the
  threefry hash's rounds into small loops (JAX unrolls them for GPU and TPU)."""
  loops = [
    re.search(r'op_name="([^"]*)"', line)
    for line in hlo_text.splitlines()
    if re.search(r"\bwhile\(", line)
  ]
  prng = ("threefry", "_gumbel", "random_bits")
  return [
    m.group(1) if m else "?" for m in loops if not (m and any(name in m.group(1) for name in prng))
  ]


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_compiled_decode_has_no_loops_but_the_decode_loop_and_the_draft_scan():
  """No search loops (nor any other) nested in the decode: on a GPU each iteration of
  a nested loop is a kernel launch."""
  vocab = 32128  # the two-level paths
  model = ConstantLM(logits=jnp.zeros((vocab,), jnp.float32), vocab_size=vocab)
  inputs = jnp.zeros((2, 1), jnp.int32)
  for sampling in (SamplingConfig(0.9, top_k=40, top_p=0.9), GREEDY):
    spec = functools.partial(
      sample_lib._speculative_jit, gamma=3, max_new_tokens=8, sampling=sampling, eos_id=None
    )
    base = functools.partial(
      sample_lib._autoregressive_jit, max_new_tokens=8, sampling=sampling, eos_id=None
    )
    spec_jaxpr = str(jax.make_jaxpr(spec)(model, model, inputs, jax.random.key(0)))
    base_jaxpr = str(jax.make_jaxpr(base)(model, inputs, jax.random.key(0)))
    assert (spec_jaxpr.count("while["), spec_jaxpr.count("scan[")) == (1, 1), sampling
    assert (base_jaxpr.count("while["), base_jaxpr.count("scan[")) == (1, 0), sampling
    spec_hlo = jax.jit(spec).lower(model, model, inputs, jax.random.key(0)).compile().as_text()
    base_hlo = jax.jit(base).lower(model, inputs, jax.random.key(0)).compile().as_text()
    assert len(_program_loops(spec_hlo)) == 2, (sampling, _program_loops(spec_hlo))
    assert len(_program_loops(base_hlo)) == 1, (sampling, _program_loops(base_hlo))


@pytest.mark.parametrize("temperature,choice", first_in_default(1, [(0.0, "fixed"), (1.0, "rule")]))
def test_a_decode_lowered_ahead_of_time_gives_the_samplers_outputs(temperature, choice):
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jax.random.randint(jax.random.key(2), (2, 3), 0, vocab)
  key = jax.random.key(3)
  common = dict(max_new_tokens=8, sampling=SamplingConfig(temperature), eos_id=5)
  gamma = 2 if choice == "fixed" else specdec.AutoGamma(gammas=(0, 1, 3), costs=(1.0, 1.2, 1.6))
  decode = sample_lib.lower_speculative_sample(
    target, draft, inputs, key, gamma=gamma, **common
  ).compile()
  want = specdec.speculative_sample(target, draft, inputs, key, gamma=gamma, **common)
  jax.tree.map(np.testing.assert_array_equal, decode(inputs, key), want)
  decode = sample_lib.lower_autoregressive_sample(target, inputs, key, **common).compile()
  want = specdec.autoregressive_sample(target, inputs, key, **common)
  jax.tree.map(np.testing.assert_array_equal, decode(inputs, key), want)
  # Other inputs of the lowered shape run; another shape is refused, never recompiled.
  other = (inputs + 1) % vocab
  jax.tree.map(
    np.testing.assert_array_equal,
    decode(other, key),
    specdec.autoregressive_sample(target, other, key, **common),
  )
  with pytest.raises(TypeError):
    decode(jnp.concatenate([inputs, inputs]), key)


@pytest.mark.slow  # the default suite keeps test_adaptive's never-drafting rule
def test_a_rule_that_never_drafts_lowers_the_baselines_loop():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  inputs = jax.random.randint(jax.random.key(2), (1, 3), 0, vocab)
  never = specdec.AutoGamma(gammas=(0, 2), costs=(1.0, 5.0))
  assert specdec.adaptive.never_drafts(never)
  lowered = sample_lib.lower_speculative_sample(
    target, target, inputs, jax.random.key(0), gamma=never, max_new_tokens=4
  )
  assert lowered.models == (target,)  # the baseline's loop takes no draft
  out = lowered.compile()(inputs, jax.random.key(0))
  base = specdec.autoregressive_sample(target, inputs, jax.random.key(0), max_new_tokens=4)
  np.testing.assert_array_equal(out.tokens, base.tokens)
