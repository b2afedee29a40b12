"""AutoGamma: gamma per iteration by Theorem 3.8's rule, exact, in one compiled loop.

Statistical tests use fixed seeds, so they are deterministic; each chi-square test
rejects at p < 1e-3, a false-alarm rate of 0.1% under fresh randomness.
"""

import dataclasses
import json

from helpers import (
  CHI2_PVALUE,
  GREEDY,
  bigram_model,
  chi_square_pvalue,
  context_model,
  exact_sequence_distribution,
  first_in_default,
)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec import adaptive, sample as sample_lib, theory
from specdec.adaptive import AutoGamma, StepCosts
from specdec.costs import forced_rule
from specdec.distributions import SamplingConfig

VOCAB, NUM_NEW, INSTANCES = 5, 4, 20_000


def varying_tables(seed=7):
  """A bigram target and a draft that equals it after tokens 0-1 and is far from it
  after 2-4: alpha varies along the sequence with the previous token."""
  rng = np.random.default_rng(seed)
  target = (rng.standard_normal((VOCAB, VOCAB)) * 1.5).astype(np.float32)
  draft = target.copy()
  draft[2:] = (rng.standard_normal((3, VOCAB)) * 3.0).astype(np.float32)
  return target, draft


# c = 0.6: gamma 3 pays only for alpha above ~0.72, gamma 1 above 0.6.
RULE = AutoGamma(gammas=(0, 1, 3), costs=(1.0, 1.6, 2.8), prior=1.0, prior_weight=0.5, decay=0.3)


def like(rule, cls):
  """`rule`'s settings in a rule of class `cls` (an AutoGamma that picks otherwise)."""
  return cls(**{f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)})


class PeekingRule(AutoGamma):
  """Drafts only when this iteration's r_1 < 1/2 (row 0's): it reads the draws it is
  chosen before, which no rule may do."""

  def pick(self, progress):
    r = sample_lib.draws(
      progress.row_keys, progress.iterations, self.max_gamma, self.max_gamma, SamplingConfig(1.0)
    ).r
    return jnp.where(r[0, 0] < 0.5, len(self.gammas) - 1, 0).astype(jnp.int32)


def vmapped_decode(target, draft, rule, sampling, seed):
  """INSTANCES independent decodes of batch 1 (each its own gamma choices)."""
  inputs = jnp.ones((1, 1), jnp.int32)

  def one(key):
    return sample_lib._speculative_jit(
      target,
      draft,
      inputs,
      key,
      gamma=rule,
      max_new_tokens=NUM_NEW,
      sampling=sampling,
      eos_id=None,
    )

  out = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(seed), INSTANCES))
  return np.asarray(out.tokens[:, 0]), out


@pytest.mark.parametrize(
  "sampling",
  [SamplingConfig(1.0), SamplingConfig(0.8, top_k=4, top_p=0.9)],
  ids=["temperature_1", "top_k_top_p"],
)
@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_adaptive_sequences_follow_the_target_distribution(sampling):
  target_table, draft_table = varying_tables()
  samples, out = vmapped_decode(
    bigram_model(target_table), bigram_model(draft_table), RULE, sampling, seed=11
  )
  counts = np.asarray(out.stats.gamma_counts).sum(axis=(0, 1))
  assert np.count_nonzero(counts) == 3, counts  # every gamma was chosen somewhere
  dist = exact_sequence_distribution(target_table, 1, NUM_NEW, sampling, None)
  assert chi_square_pvalue(samples, dist) > CHI2_PVALUE


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_negative_control_a_choice_that_reads_this_iterations_draws_is_detected():
  """The same test must reject a rule that looks at the current iteration's uniforms:
  drafting only when r_1 < 1/2 accepts x_1 with probability min(1, 2 p / q)."""
  sampling = SamplingConfig(1.0)
  target_table, draft_table = varying_tables()
  dist = exact_sequence_distribution(target_table, 1, NUM_NEW, sampling, None)
  samples, _ = vmapped_decode(
    bigram_model(target_table),
    bigram_model(draft_table),
    like(RULE, PeekingRule),
    sampling,
    seed=11,
  )
  assert chi_square_pvalue(samples, dist) < CHI2_PVALUE


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_a_batch_shares_one_gamma_and_keeps_the_law():
  """Batch 100k: one chunk length per target call, the rows' law unchanged."""
  sampling = SamplingConfig(1.0)
  target_table, draft_table = varying_tables()
  out = specdec.speculative_sample(
    bigram_model(target_table),
    bigram_model(draft_table),
    jnp.ones((100_000, 1), jnp.int32),
    jax.random.key(5),
    gamma=RULE,
    max_new_tokens=NUM_NEW,
    sampling=sampling,
  )
  dist = exact_sequence_distribution(target_table, 1, NUM_NEW, sampling, None)
  assert chi_square_pvalue(np.asarray(out.tokens), dist) > CHI2_PVALUE
  assert int(out.stats.iterations.sum()) == int(out.stats.gamma_counts.sum())


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_last_row_objective_keeps_the_law():
  """Batches of 3 whose shared gamma follows the slowest row ("last"): each row's
  sequence still has Mp's law (row 0 of 20k independent batches)."""
  sampling = SamplingConfig(1.0)
  target_table, draft_table = varying_tables()
  rule = dataclasses.replace(RULE, objective="last")
  target, draft = bigram_model(target_table), bigram_model(draft_table)
  inputs = jnp.ones((3, 1), jnp.int32)

  def one(key):
    return sample_lib._speculative_jit(
      target,
      draft,
      inputs,
      key,
      gamma=rule,
      max_new_tokens=NUM_NEW,
      sampling=sampling,
      eos_id=None,
    )

  out = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(13), INSTANCES))
  counts = np.asarray(out.stats.gamma_counts).sum(axis=(0, 1))
  assert np.count_nonzero(counts) == 3, counts
  dist = exact_sequence_distribution(target_table, 1, NUM_NEW, sampling, None)
  assert chi_square_pvalue(np.asarray(out.tokens[:, 0]), dist) > CHI2_PVALUE


# -------------------------------------------------------------- temperature 0: greedy Mp


PATTERN = (0, 0, 0, 0, 0, 2, 0, 1, 2, 2, 0, 0)  # indices into (0, 1, 3)


class ScriptedRule(AutoGamma):
  """A past-only schedule that makes `pending` fill up and be fed (five gamma-0
  iterations in a row) and then speculates again."""

  def pick(self, progress):
    step = jnp.max(progress.iterations)
    return jnp.asarray(PATTERN, jnp.int32)[step % len(PATTERN)]


@pytest.mark.parametrize("schedule", first_in_default(1, ["rule", "scripted"]))
def test_greedy_adaptive_equals_greedy_target_on_causal_lms(schedule):
  target = context_model(jax.random.key(0), 11)
  draft = context_model(jax.random.key(1), 11)
  rule = like(RULE, ScriptedRule) if schedule == "scripted" else RULE
  inputs = jnp.asarray(np.random.default_rng(3).integers(0, 11, (4, 3)), jnp.int32)
  spec = specdec.speculative_sample(
    target,
    draft,
    inputs,
    jax.random.key(0),
    gamma=rule,
    max_new_tokens=20,
    sampling=GREEDY,
    eos_id=2,
  )
  base = specdec.autoregressive_sample(
    target, inputs, jax.random.key(1), max_new_tokens=20, sampling=GREEDY, eos_id=2
  )
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)
  assert np.count_nonzero(np.asarray(spec.stats.gamma_counts).sum(0)) >= 2


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_a_scripted_past_only_schedule_keeps_the_law():
  """Gamma-0 runs long enough to fill the draft's pending chunk, then drafts again."""
  sampling = SamplingConfig(1.0)
  target_table, draft_table = varying_tables()
  out = specdec.speculative_sample(
    bigram_model(target_table),
    bigram_model(draft_table),
    jnp.ones((100_000, 1), jnp.int32),
    jax.random.key(9),
    gamma=like(RULE, ScriptedRule),
    max_new_tokens=8,
    sampling=sampling,
  )
  tokens = np.asarray(out.tokens)
  # Tokens 6-8 come after five gamma-0 iterations and the feeds they forced.
  dist = exact_sequence_distribution(target_table, 1, 8, sampling, None)
  marginal = {}
  for seq, prob in dist.items():
    marginal[seq[5:]] = marginal.get(seq[5:], 0.0) + prob
  assert chi_square_pvalue(tokens[:, 5:], marginal) > CHI2_PVALUE


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_greedy_adaptive_equals_greedy_target_on_llama_and_t5():
  from llama_helpers import ragged_inputs, tiny_model as tiny_llama

  from t5_helpers import random_inputs, tiny_model as tiny_t5

  rule = AutoGamma.from_c(0.3, gammas=(0, 1, 2, 4), prior=0.9, decay=0.5)
  llama_target = tiny_llama(0, num_layers=2)
  llama_draft = tiny_llama(
    1,
    hidden_size=16,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
    num_layers=1,
    tie_word_embeddings=True,
  )
  t5_target, t5_draft = tiny_t5(seed=1), tiny_t5(seed=2)
  cases = [
    (llama_target, llama_draft, ragged_inputs(4, 6, llama_target.vocab_size, [6, 2, 4, 5], seed=8)),
    (t5_target, t5_draft, random_inputs(3, 7, t5_target.vocab_size, seed=4)),
  ]
  for target, draft, x in cases:
    spec = specdec.speculative_sample(
      target, draft, x, jax.random.key(1), gamma=rule, max_new_tokens=16, sampling=GREEDY, eos_id=3
    )
    base = specdec.autoregressive_sample(
      target, x, jax.random.key(2), max_new_tokens=16, sampling=GREEDY, eos_id=3
    )
    np.testing.assert_array_equal(spec.tokens, base.tokens)
    np.testing.assert_array_equal(spec.lengths, base.lengths)


# ----------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 0.7, 0.8, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("c", [0.0, 0.02, 0.1, 0.3, 0.8])
def test_the_choice_is_theorem_3_8s_argmax(alpha, c):
  rule = AutoGamma.from_c(c, v=1.0)
  index = int(adaptive.choose(rule, jnp.full((3,), alpha), jnp.ones((3,), bool)))
  speedups = [
    1.0 if g == 0 else float(theory.walltime_improvement(alpha, g, c)) for g in rule.gammas
  ]
  assert speedups[index] >= max(speedups) * (1 - 1e-5), (rule.gammas[index], speedups)


def test_gamma_0_when_the_draft_is_slow_or_wrong_and_the_largest_when_it_is_near_perfect():
  ones = jnp.ones((2,), bool)
  slow = AutoGamma.from_c(1.0)
  assert slow.gammas[int(adaptive.choose(slow, jnp.full((2,), 0.9), ones))] == 0
  cheap = AutoGamma.from_c(0.01)
  # Corollary 3.9: speculation pays iff alpha > c (with v = 1).
  assert cheap.gammas[int(adaptive.choose(cheap, jnp.full((2,), 0.005), ones))] == 0
  assert cheap.gammas[int(adaptive.choose(cheap, jnp.full((2,), 0.05), ones))] == 1
  assert cheap.gammas[int(adaptive.choose(cheap, jnp.full((2,), 0.99), ones))] == 8


def test_the_batch_choice_maximizes_tokens_per_time_summed_over_active_rows():
  rule = AutoGamma.from_c(0.1, gammas=(0, 1, 4), v=1.5)
  alpha = jnp.asarray([0.95, 0.95] + [0.0] * 8)
  # With every row active, eight rows that lose outweigh two that gain much.
  both = int(adaptive.choose(rule, alpha, jnp.ones((10,), bool)))
  only_good = int(adaptive.choose(rule, alpha, jnp.arange(10) < 2))
  assert rule.gammas[both] == 0 and rule.gammas[only_good] == 4


def test_the_last_row_objective_follows_the_slowest_row():
  rule = AutoGamma.from_c(0.1, gammas=(0, 1, 4), v=1.1, objective="last")
  ones, rest = jnp.ones((2,), bool), jnp.full((2,), 32)
  alpha = jnp.asarray([0.95, 0.3])
  throughput = dataclasses.replace(rule, objective="sum")
  # Summed tokens favour the fast row's gamma 4; the batch ends when the slow row does.
  assert throughput.gammas[int(adaptive.choose(throughput, alpha, ones, rest))] == 4
  index = int(adaptive.choose(rule, alpha, ones, rest))
  times = [
    cost * 32 / float(theory.expected_tokens(0.3, g)) for g, cost in zip(rule.gammas, rule.costs)
  ]
  assert index == int(np.argmin(times)) and rule.gammas[index] != 4, (index, times)
  # Once the slow row is done, the fast row alone sets the time.
  assert rule.gammas[int(adaptive.choose(rule, alpha, jnp.asarray([True, False]), rest))] == 4
  # A row that needs more tokens weighs more.
  assert rule.gammas[int(adaptive.choose(rule, alpha, ones, jnp.asarray([64, 2])))] == 4
  with pytest.raises(ValueError, match="remaining"):
    adaptive.choose(rule, alpha, ones)


@pytest.mark.parametrize("objective", adaptive.OBJECTIVES)
def test_tokens_past_a_rows_limit_do_not_count(objective):
  rule = AutoGamma.from_c(0.05, v=1.0, objective=objective)
  alpha, ones = jnp.full((1,), 0.99), jnp.ones((1,), bool)
  assert rule.gammas[int(adaptive.choose(rule, alpha, ones, jnp.full((1,), 100)))] == 8
  # Two tokens left: gamma 1 already yields them both; more drafting only costs.
  assert rule.gammas[int(adaptive.choose(rule, alpha, ones, jnp.full((1,), 2)))] == 1
  assert rule.gammas[int(adaptive.choose(rule, alpha, ones, jnp.full((1,), 1)))] == 0


@pytest.mark.parametrize("seed", first_in_default(2, range(12)))
def test_pruning_to_the_envelope_never_lowers_a_rows_expected_rate(seed):
  rng = np.random.default_rng(seed)
  gammas = adaptive.DEFAULT_GAMMAS
  c = rng.uniform(0.0, 0.4)
  v = np.cumsum(rng.uniform(0.0, 0.3, len(gammas))) + 1.0  # increasing in gamma
  costs = tuple(1.0 if g == 0 else g * c + float(v[i]) for i, g in enumerate(gammas))
  full = AutoGamma(gammas=gammas, costs=costs)
  kept = adaptive.useful_gammas(gammas, costs)
  pruned = AutoGamma(gammas=kept, costs=tuple(costs[gammas.index(g)] for g in kept))

  def rate(rule, alpha, index):
    return float(theory.expected_tokens(alpha, rule.gammas[index])) / rule.costs[index]

  ones = jnp.ones((1,), bool)
  for alpha in np.linspace(0.0, 1.0, 401):
    best = rate(full, alpha, int(adaptive.choose(full, jnp.full((1,), alpha), ones)))
    got = rate(pruned, alpha, int(adaptive.choose(pruned, jnp.full((1,), alpha), ones)))
    assert got >= best * (1 - 1e-5), (alpha, kept)


def test_from_costs_prunes_gammas_no_alpha_chooses_unless_asked_not_to():
  # The shipped Multi30k pair's measured iterations (draft_distilled, T=0, batch 1).
  costs = adaptive.StepCosts(
    c=0.09,
    v=((2, 1.26), (3, 1.29), (5, 1.67), (9, 2.66)),
    iteration=((0, 1.115), (1, 1.556), (2, 2.192), (3, 2.376), (4, 2.573), (6, 3.463), (8, 4.545)),
  )
  assert AutoGamma.from_costs(costs).gammas == (0, 1, 4, 6)
  assert AutoGamma.from_costs(costs, prune=False).gammas == adaptive.DEFAULT_GAMMAS
  # Corollary 3.9 with v = 1: speculation pays iff alpha > c, so at c = 1 never.
  assert AutoGamma.from_c(1.0).gammas == (0,)
  assert AutoGamma.from_c(0.0).gammas == (0, 8)  # drafting is free: the most, or none
  assert AutoGamma.from_c(0.05).gammas == adaptive.DEFAULT_GAMMAS


def test_an_unknown_objective_is_named():
  with pytest.raises(ValueError, match="objective"):
    AutoGamma.from_c(0.1, objective="fastest")


def test_the_estimate_follows_a_change_and_returns_to_the_prior_without_data():
  rule = AutoGamma.from_c(0.1, prior=0.6, prior_weight=4.0, decay=0.9)
  est = adaptive.Estimate.zeros(1)
  active, seen = jnp.ones((1,), bool), jnp.ones((1, 4), bool)
  for _ in range(20):
    est = est.update(rule, jnp.ones((1, 4)), seen, active)
  assert float(est.alpha(rule)[0]) > 0.95
  drops = 0
  while float(est.alpha(rule)[0]) > 0.5:
    est = est.update(rule, jnp.zeros((1, 4)), seen, active)
    drops += 1
  assert drops <= 8  # four positions an iteration: the estimate follows within 8
  for _ in range(60):
    est = est.update(rule, jnp.zeros((1, 0)), jnp.zeros((1, 0), bool), active)
  assert abs(float(est.alpha(rule)[0]) - 0.6) < 0.02


# -------------------------------------------------------- compiling, costs, bad input


@pytest.mark.slow  # the default suite keeps test_sample's compile-once test; CI runs this after it
def test_repeated_calls_compile_once():
  target_table, draft_table = varying_tables()
  target, draft = bigram_model(target_table), bigram_model(draft_table)
  args = dict(gamma=RULE, max_new_tokens=6, sampling=SamplingConfig(1.0))
  specdec.speculative_sample(target, draft, jnp.ones((3, 1), jnp.int32), jax.random.key(0), **args)
  before = sample_lib._speculative_jit._cache_size()
  for seed in range(3):
    specdec.speculative_sample(
      target, draft, jnp.full((3, 1), 2, jnp.int32), jax.random.key(seed), **args
    )
  same_rule = AutoGamma(
    gammas=(0, 1, 3), costs=(1.0, 1.6, 2.8), prior=1.0, prior_weight=0.5, decay=0.3
  )
  specdec.speculative_sample(
    target, draft, jnp.ones((3, 1), jnp.int32), jax.random.key(7), **dict(args, gamma=same_rule)
  )
  assert sample_lib._speculative_jit._cache_size() == before


def test_the_decode_is_one_loop_with_one_inner_loop_per_gamma_and_no_switch():
  """One outer while; in it one while per gamma, each running its gamma's iterations
  while the rule keeps choosing it, and after gamma 0's the draft's catch-up (zero or
  one pass); no lax.switch (a switch that carries the caches copies them on every
  iteration)."""
  target_table, draft_table = varying_tables()
  fn = lambda rule: (
    lambda i, k: (
      specdec.speculative_sample(
        bigram_model(target_table),
        bigram_model(draft_table),
        i,
        k,
        gamma=rule,
        max_new_tokens=5,
        sampling=SamplingConfig(1.0),
      ).tokens
    )
  )
  args = (jnp.ones((2, 1), jnp.int32), jax.random.key(0))
  with_zero = str(jax.make_jaxpr(fn(RULE))(*args))
  assert with_zero.count("while[") == 1 + len(RULE.gammas) + 1
  without = AutoGamma(gammas=(1, 3), costs=(1.6, 2.8))
  assert str(jax.make_jaxpr(fn(without))(*args)).count("while[") == 1 + 2
  assert str(jax.make_jaxpr(fn(3))(*args)).count("while[") == 1


def test_a_rule_that_never_drafts_runs_the_baseline_loop_token_for_token():
  """gamma 0 at the prior: nothing is ever observed, alpha_hat stays at the prior and
  every iteration is a plain step, so the decode is the baseline's own loop (no
  switch, no draft call; same tokens for the same key), with the stats it implies."""
  target_table, draft_table = varying_tables()
  target, draft = bigram_model(target_table), bigram_model(draft_table)
  rule = AutoGamma(gammas=(0, 1, 3), costs=(1.0, 1.9, 3.5), prior=0.5)  # 1.5 / 1.9 < 1
  assert adaptive.never_drafts(rule) and not adaptive.never_drafts(RULE)
  inputs, key = jnp.array([[1], [3], [2]], jnp.int32), jax.random.key(5)
  args = dict(max_new_tokens=9, sampling=SamplingConfig(1.0), eos_id=4)
  out = specdec.speculative_sample(target, draft, inputs, key, gamma=rule, **args)
  base = specdec.autoregressive_sample(target, inputs, key, **args)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  np.testing.assert_array_equal(out.log_probs, base.log_probs)
  stats = out.stats
  np.testing.assert_array_equal(stats.iterations, base.stats.iterations)
  np.testing.assert_array_equal(stats.gamma_counts[:, 0], stats.iterations)
  assert int(np.asarray(stats.gamma_counts)[:, 1:].sum()) == 0
  assert int(np.asarray(stats.drafted).sum()) == 0
  trace, ran = np.asarray(stats.alpha_trace), np.asarray(stats.iterations)
  for row, n in zip(trace, ran):
    np.testing.assert_allclose(row[:n], 0.5, rtol=1e-6)
    assert not row[n:].any()
  jaxpr = str(
    jax.make_jaxpr(
      lambda i, k: specdec.speculative_sample(target, draft, i, k, gamma=rule, **args).tokens
    )(inputs, key)
  )
  baseline = str(
    jax.make_jaxpr(lambda i, k: specdec.autoregressive_sample(target, i, k, **args).tokens)(
      inputs, key
    )
  )
  assert jaxpr.count("while[") == 1
  assert jaxpr.count("cond[") == baseline.count("cond[")  # no lax.switch over gammas


def test_costs_round_trip_through_json(tmp_path):
  costs = StepCosts(c=0.07, v=((2, 1.05), (5, 1.16), (9, 1.4)), batch=4, device="cpu")
  path = tmp_path / "costs.json"
  costs.save(str(path))
  assert StepCosts.load(str(path)) == costs
  assert costs.v_of(1) == 1.0 and abs(costs.v_of(3) - (1.05 + (1.16 - 1.05) / 3)) < 1e-12
  rule = AutoGamma.from_costs(costs, gammas=(0, 1, 4, 8))
  assert rule.costs == (1.0, 0.07 + 1.05, 4 * 0.07 + 1.16, 8 * 0.07 + 1.4)
  with pytest.raises(ValueError, match="v\\(10\\)"):
    costs.v_of(10)


def test_measured_iterations_are_the_rules_costs_and_round_trip(tmp_path):
  # The loop's own iteration costs decide; a gamma without one gets the model's cost
  # plus the median excess of the measured ones.
  costs = StepCosts(
    c=0.1, v=((2, 1.1), (5, 1.4), (9, 2.0)), batch=2, iteration=((0, 1.02), (1, 1.5), (4, 2.2))
  )
  path = tmp_path / "costs.json"
  costs.save(str(path))
  assert StepCosts.load(str(path)) == costs
  excess = sorted([1.02 - 1.0, 1.5 - (0.1 + 1.1), 2.2 - (0.4 + 1.4)])[1]
  rule = AutoGamma.from_costs(costs, gammas=(0, 1, 4, 8))
  assert rule.costs[:3] == (1.02, 1.5, 2.2)
  assert abs(rule.costs[3] - (0.8 + 2.0 + excess)) < 1e-12
  with pytest.raises(ValueError, match="iteration"):
    StepCosts(c=0.1, v=(), iteration=((1, -1.0),))


def test_costs_record_the_temperature_their_iterations_were_timed_at(tmp_path):
  costs = StepCosts(c=0.1, v=((2, 1.1),), iteration=((0, 1.0), (1, 1.3)), temperature=1.0)
  path = tmp_path / "costs.json"
  costs.save(str(path))
  assert StepCosts.load(str(path)).temperature == 1.0
  # A file written before temperatures were recorded holds greedy costs.
  legacy = json.loads(costs.to_json())
  del legacy["temperature"]
  assert StepCosts.from_json(json.dumps(legacy)).temperature == 0.0
  for bad in (-1.0, float("nan"), float("inf"), "1"):
    with pytest.raises(ValueError, match="temperature"):
      StepCosts(c=0.1, v=(), temperature=bad)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_forced_rule_runs_the_adaptive_loop_at_one_gamma():
  target_table, draft_table = varying_tables()
  for g in (0, 3):  # the plain-step branch and a drafting one
    rule = forced_rule((0, 1, 3), g)
    out = specdec.speculative_sample(
      bigram_model(target_table),
      bigram_model(draft_table),
      jnp.ones((2, 1), jnp.int32),
      jax.random.key(0),
      gamma=rule,
      max_new_tokens=12,
      sampling=SamplingConfig(1.0),
    )
    counts = np.asarray(out.stats.gamma_counts)
    assert counts[:, [0, 1, 3].index(g)].sum() == counts.sum() > 0, (g, counts)
  with pytest.raises(ValueError, match="gamma 2"):
    forced_rule((0, 1, 3), 2)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_calibrate_measures_c_v_and_the_loops_iterations_for_every_gamma():
  target_table, draft_table = varying_tables()
  costs = adaptive.calibrate(
    bigram_model(target_table),
    bigram_model(draft_table),
    jnp.ones((2, 1), jnp.int32),
    gammas=(0, 1, 3),
    max_length=16,
    repeats=1,
    steps=2,
    rounds=1,
  )
  assert [k for k, _ in costs.v] == [2, 4] and costs.batch == 2
  assert costs.c > 0 and all(v > 0 for _, v in costs.v)
  assert [g for g, _ in costs.iteration] == [0, 1, 3]
  assert all(x > 0 for _, x in costs.iteration)
  # Unpruned, the rule prices each gamma at its measured iteration; pruned, it keeps
  # those measured prices for the gammas on Theorem 3.8's envelope (which ones depends
  # on the timings, so only the subset is asserted).
  rule = AutoGamma.from_costs(costs, gammas=(0, 1, 3), prune=False)
  assert rule.costs == tuple(x for _, x in costs.iteration)
  pruned = AutoGamma.from_costs(costs, gammas=(0, 1, 3))
  assert set(pruned.gammas) <= {0, 1, 3}
  assert pruned.costs == tuple(dict(costs.iteration)[g] for g in pruned.gammas)


@pytest.mark.parametrize(
  "kwargs,name",
  [
    (dict(gammas=(), costs=()), "gammas"),
    (dict(gammas=(2, 1), costs=(1.0, 1.0)), "gammas"),
    (dict(gammas=(-1, 1), costs=(1.0, 1.0)), "gammas"),
    (dict(gammas=(0, 1), costs=(1.0,)), "costs"),
    (dict(gammas=(0, 1), costs=(1.0, 0.0)), "costs"),
    (dict(gammas=(0, 1), costs=(1.0, 1.2), prior=1.5), "prior"),
    (dict(gammas=(0, 1), costs=(1.0, 1.2), decay=0.0), "decay"),
    (dict(gammas=(0, 1), costs=(1.0, 1.2), prior_weight=0.0), "prior_weight"),
    (dict(gammas=(0, 1), costs=(1.0, 1.2), margin=-0.01), "margin"),
    (dict(gammas=(0, 1), costs=(1.0, 1.2), margin=float("nan")), "margin"),
  ],
)
def test_bad_rules_raise_naming_the_argument(kwargs, name):
  with pytest.raises(ValueError, match=name):
    AutoGamma(**kwargs)


def test_a_rule_whose_best_rate_loses_to_the_baseline_program_runs_the_baseline():
  """The loop's gamma-0 iteration costs more than a baseline step (1.2 here, as
  measured on the Multi30k pair), so `choose` may prefer gamma 1 (1.63 / 1.67 = 0.98
  tokens per step against 1 / 1.2) while the baseline's program makes 1: Theorem 3.8
  at the prior says drafting loses, and the decode runs the baseline (case b)."""
  costs = (1.2, 1.67, 2.42)
  losing = adaptive.AutoGamma(gammas=(0, 1, 3), costs=costs, prior=0.63)
  with jax.ensure_compile_time_eval():
    first = adaptive.choose(losing, jnp.full((1,), 0.63), jnp.ones((1,), bool))
  assert losing.gammas[int(first)] > 0
  assert adaptive.never_drafts(losing)
  # A higher prior beats 1 token per step: the rule runs.
  assert not adaptive.never_drafts(dataclasses.replace(losing, prior=0.8))
  # Without gamma 0 in the set, the user asked for speculation: the rule runs.
  assert not adaptive.never_drafts(adaptive.AutoGamma(gammas=(1, 3), costs=costs[1:], prior=0.63))


def test_a_margin_keeps_plain_steps_where_drafting_gains_less_than_it():
  """Costs (1.0, 1.5): gamma 1 makes E(alpha, 1) / 1.5 tokens per step, against 1 for
  gamma 0. At alpha 0.6 that is 1.067: chosen by the paper's rule (margin 0), not with
  a margin of 10 %; at alpha 0.8 drafting gains a third (gamma 3: 2.95 / 2.2) and both
  rules draft alike: gammas > 0 keep their order among themselves (the margin scales
  them all)."""
  ones = jnp.ones((1,), bool)
  rule = adaptive.AutoGamma(gammas=(0, 1, 3), costs=(1.0, 1.5, 2.2), prior=0.6)
  wide = dataclasses.replace(rule, margin=0.1)
  pick = lambda r, a: r.gammas[int(adaptive.choose(r, jnp.full((1,), a), ones))]
  assert pick(rule, 0.6) == 1 and pick(wide, 0.6) == 0
  assert pick(rule, 0.8) == pick(wide, 0.8) == 3
  # At the prior the margin decides whether the decode drafts at all.
  assert not adaptive.never_drafts(rule) and adaptive.never_drafts(wide)
  assert not adaptive.never_drafts(dataclasses.replace(wide, prior=0.8))


def test_the_shipped_rules_carry_the_shipped_margin():
  from specdec import pretrained

  rule = pretrained.auto_gamma("multi30k_ende", 0.0, 1, "draft_distilled")
  assert rule.margin == pretrained.SHIPPED_MARGIN > 0
  assert pretrained.auto_gamma("multi30k_ende", 0.0, 1, "draft_distilled", margin=0.0).margin == 0.0


def test_pruning_keeps_the_gamma_0_that_the_margin_chooses():
  """Gamma 0 (1.25) is dearer than gamma 1 (1.2): off the paper's envelope. With a
  margin of 5 %, gamma 1 counts 1.26, and gamma 0 wins below alpha ~0.008: `choose`
  picks it there, so pruning must keep it (and `never_drafts` can then fire)."""
  costs = adaptive.StepCosts(c=0.1, v=((2, 1.1),), iteration=((0, 1.25), (1, 1.2)))
  assert AutoGamma.from_costs(costs, (0, 1)).gammas == (1,)
  rule = AutoGamma.from_costs(costs, (0, 1), margin=0.05, prior=0.0)
  assert rule.gammas == (0, 1)
  ones = jnp.ones((1,), bool)
  assert rule.gammas[int(adaptive.choose(rule, jnp.zeros((1,)), ones))] == 0
  assert adaptive.never_drafts(rule)
  assert AutoGamma.from_c(0.1, (0, 1, 3), margin=0.0).gammas == (0, 1, 3)


@pytest.mark.parametrize("seed", range(6))
def test_pruning_with_a_margin_never_changes_a_rows_choice(seed):
  """With the margin, the pruned rule's choice has the full rule's rate (margin
  included) at every alpha, as without one."""
  rng = np.random.default_rng(seed)
  gammas = adaptive.DEFAULT_GAMMAS
  c, margin = rng.uniform(0.0, 0.4), rng.uniform(0.0, 0.3)
  v = np.cumsum(rng.uniform(0.0, 0.3, len(gammas))) + 1.0
  costs = tuple(
    rng.uniform(0.9, 1.3) if g == 0 else g * c + float(v[i]) for i, g in enumerate(gammas)
  )
  full = AutoGamma(gammas=gammas, costs=costs, margin=margin)
  pruned = AutoGamma._of(gammas, costs, True, dict(margin=margin))

  def rate(rule, alpha, index):
    factor = 1.0 + margin if rule.gammas[index] > 0 else 1.0
    return float(theory.expected_tokens(alpha, rule.gammas[index])) / (rule.costs[index] * factor)

  ones = jnp.ones((1,), bool)
  for alpha in np.linspace(0.0, 1.0, 201):
    best = rate(full, alpha, int(adaptive.choose(full, jnp.full((1,), alpha), ones)))
    got = rate(pruned, alpha, int(adaptive.choose(pruned, jnp.full((1,), alpha), ones)))
    assert got >= best * (1 - 1e-5), (alpha, pruned.gammas)


@pytest.mark.parametrize(
  "text,name",
  [
    ('{"v": {"2": 1.1}}', "'c'"),
    ('{"c": 0.1}', "'v'"),
    ('{"c": 0.1, "v": {"2": 1.1}, "iteration": {"one": 1.0}}', "iteration"),
    ('{"c": 0.1, "v": {"2": 1.1}, "iteration": {"1.5": 1.0}}', "iteration"),
    ('{"c": 0.1, "v": {"two": 1.1}}', "v"),
    ('{"c": 0.1, "v": {"1": 1.0, "2": 1.1}}', "v"),
    ('{"c": 0.1, "v": {"0": 0.5, "2": 1.1}}', "v"),
    ('{"c": 0.1, "v": [1.1]}', "v"),
    ("[0.1]", "object"),
  ],
)
def test_bad_step_costs_json_raises_naming_the_key(text, name):
  with pytest.raises(ValueError, match=name):
    StepCosts.from_json(text)


def test_a_v_key_below_2_is_refused():
  """v(1) = 1 by definition, and a key below it would unsort the interpolation."""
  for v in (((0, 0.5), (2, 1.1)), ((-1, 0.5),), ((1, 1.0),)):
    with pytest.raises(ValueError, match="v"):
      StepCosts(c=0.1, v=v)
  with pytest.raises(ValueError, match="iteration"):
    StepCosts(c=0.1, v=((2, 1.1),), iteration=((1.5, 1.0),))


@pytest.mark.parametrize("gammas", [("1",), 3, (0, "1"), (1.0, 2), (True,), (), (2, 1)])
def test_from_c_and_from_costs_name_bad_gammas_before_computing_costs(gammas):
  costs = StepCosts(c=0.1, v=((2, 1.1), (4, 1.3)))
  with pytest.raises(ValueError, match="gammas"):
    AutoGamma.from_c(0.1, gammas=gammas)
  with pytest.raises(ValueError, match="gammas"):
    AutoGamma.from_costs(costs, gammas=gammas)


def test_a_zero_gamma_rule_names_the_draft_and_gamma_when_the_draft_is_too_short():
  """A rule with gamma 0 asks a model draft for max_new_tokens + G + 3 positions (the
  4-wide window of owed tokens), 2 more than the target; the error says so."""
  big = specdec.models.CausalLM.from_fn(lambda t: jnp.zeros(t.shape + (8,)), 8)
  short = specdec.models.CausalLM.from_fn(lambda t: jnp.zeros(t.shape + (8,)), 8, max_length=10)
  rule = AutoGamma(gammas=(0, 3), costs=(1.0, 1.3), prior=0.9)
  inputs = jnp.ones((1, 2), jnp.int32)
  run = lambda target, draft, gamma: specdec.speculative_sample(
    target, draft, inputs, jax.random.key(0), gamma=gamma, max_new_tokens=4, sampling=GREEDY
  )
  with pytest.raises(ValueError, match=r"draft: .*10 positions.* G = 3.*gamma 0"):
    run(big, short, rule)
  # The target holds 2 + 4 + 3 + 1 = 10; so does the draft without gamma 0.
  assert run(short, big, rule).tokens.shape == (1, 4)
  assert run(big, short, 3).tokens.shape == (1, 4)
