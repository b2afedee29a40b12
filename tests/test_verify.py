"""specdec.verify: steps 3 and 4 of Algorithm 1, accept then correct, one row at a time
and as a batch, with the named results the decode loop reads."""

from helpers import GREEDY, first_in_default, normalize
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import verify
from specdec.distributions import SamplingConfig, probabilities


def random_distributions(rng, shape, concentration=0.5):
  """float32 distributions over the last axis of `shape`."""
  return jnp.asarray(rng.dirichlet(np.full(shape[-1], concentration), shape[:-1]), jnp.float32)


def test_a_draft_is_accepted_exactly_when_r_is_below_p_over_q():
  rng = np.random.default_rng(0)
  p_x = rng.uniform(0.0, 1.0, 1000).astype(np.float32)
  q_x = rng.uniform(1e-3, 1.0, 1000).astype(np.float32)
  r = rng.uniform(0.0, 1.0, 1000).astype(np.float32)
  want = r.astype(np.float64) < p_x.astype(np.float64) / q_x.astype(np.float64)
  got = np.asarray(verify.accepts(jnp.asarray(r), jnp.asarray(p_x), jnp.asarray(q_x)))
  # r q(x) < p(x) in float32 against r < p / q in float64: they may differ only where
  # r is within rounding of p / q.
  close = np.isclose(r, p_x / q_x, rtol=1e-6, atol=0)
  assert (got == want)[~close].all()
  assert 0 < got.sum() < got.size  # both outcomes occur


def test_a_draft_the_draft_gives_no_mass_is_accepted_iff_the_target_gives_it_mass():
  r = jnp.asarray([0.0, 0.5, 0.999])
  assert verify.accepts(r, jnp.full(3, 0.1), jnp.zeros(3)).tolist() == [True] * 3
  assert verify.accepts(r, jnp.zeros(3), jnp.zeros(3)).tolist() == [False] * 3


def test_n_is_the_length_of_the_leading_run_of_acceptances():
  accepted = jnp.asarray(
    [
      [True, True, False, True],
      [False, True, True, True],
      [True, True, True, True],
      [False, False, False, False],
    ]
  )
  assert verify.num_accepted(accepted).tolist() == [2, 0, 4, 0]


def test_the_residual_is_the_normalized_positive_part_of_p_minus_q():
  rng = np.random.default_rng(1)
  p = random_distributions(rng, (6, 9))
  q = random_distributions(rng, (6, 9))
  want = np.maximum(np.asarray(p, np.float64) - np.asarray(q, np.float64), 0.0)
  want /= want.sum(axis=-1, keepdims=True)
  got = np.asarray(verify.residual(p, q))
  np.testing.assert_allclose(got, want, atol=1e-6)
  np.testing.assert_allclose(got.sum(axis=-1), 1.0, atol=1e-6)
  assert (got[np.asarray(q) >= np.asarray(p)] == 0).all()


def test_the_lenient_residual_is_the_normalized_positive_part_of_p_minus_l_q():
  rng = np.random.default_rng(2)
  p = random_distributions(rng, (4, 7))
  q = random_distributions(rng, (4, 7))
  want = np.maximum(np.asarray(p, np.float64) - 0.5 * np.asarray(q, np.float64), 0.0)
  want /= want.sum(axis=-1, keepdims=True)
  np.testing.assert_allclose(verify.residual(p, q, lenience=0.5), want, atol=1e-6)


def test_an_empty_residual_falls_back_to_p():
  p = normalize([1, 2, 3, 0])
  np.testing.assert_array_equal(verify.residual(p, p), p)


def test_beta_is_the_overlap_of_p_and_q():
  p, q = normalize([1, 1, 2]), normalize([2, 1, 1])
  assert float(verify.beta(p, q)) == pytest.approx(0.25 + 0.25 + 0.25)
  assert float(verify.beta(p, p)) == pytest.approx(1.0)


def one_hot_case(seed, batch=5, gamma=3, vocab=6):
  """Random draft tokens and target argmaxes that agree about half the time."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, vocab, (batch, gamma + 1)).astype(np.int32)
  x = np.where(
    rng.uniform(size=(batch, gamma)) < 0.6, y[:, :gamma], (y[:, :gamma] + 1) % vocab
  ).astype(np.int32)
  return jnp.asarray(y), jnp.asarray(x), vocab


@pytest.mark.parametrize("seed", first_in_default(1, range(3)))
def test_the_greedy_step_is_the_sampled_step_on_one_hot_distributions(seed):
  y, x, vocab = one_hot_case(seed)
  gamma = x.shape[1]
  p = jax.nn.one_hot(y, vocab)
  q = jax.nn.one_hot(x, vocab)
  r = jax.random.uniform(jax.random.key(seed), x.shape, maxval=0.999)
  keys = jax.random.split(jax.random.key(seed + 10), x.shape[0])
  greedy = verify.greedy_step(y, x)
  sampled = verify.speculative_step(p, q, x, r, keys)
  np.testing.assert_array_equal(greedy.n, sampled.n)
  np.testing.assert_array_equal(greedy.t, sampled.t)
  np.testing.assert_array_equal(greedy.beta, sampled.beta)
  # n is the first mismatch, and t the target's own token there.
  mismatch = np.asarray(x) != np.asarray(y[:, :gamma])
  first = np.where(mismatch.any(axis=1), mismatch.argmax(axis=1), gamma)
  np.testing.assert_array_equal(greedy.n, first)
  np.testing.assert_array_equal(greedy.t, np.asarray(y)[np.arange(len(first)), first])
  assert 0 < int(greedy.n.sum()) < x.size  # some accepted, some rejected


def test_a_draft_equal_to_the_target_is_always_accepted_and_t_comes_from_p_after_it():
  rng = np.random.default_rng(3)
  gamma, vocab = 4, 8
  p = random_distributions(rng, (3, gamma + 1, vocab))
  x = jnp.asarray(rng.integers(0, vocab, (3, gamma)), jnp.int32)
  r = jnp.full((3, gamma), 0.999, jnp.float32)
  keys = jax.random.split(jax.random.key(0), 3)
  step = verify.speculative_step(p, p[:, :gamma], x, r, keys)
  assert step.n.tolist() == [gamma] * 3
  np.testing.assert_allclose(step.beta, 1.0, atol=1e-6)
  # t is drawn from p_{gamma+1}: a token it gives mass.
  assert (np.asarray(verify.take(p[:, gamma:], step.t[:, None])) > 0).all()


def test_verify_names_its_results_in_every_form():
  rng = np.random.default_rng(4)
  batch, gamma, vocab = 2, 3, 5
  logits = jnp.asarray(rng.standard_normal((batch, gamma + 1, vocab)), jnp.float32)
  logits = logits.at[1, 2, 0].set(jnp.nan)
  x = jnp.asarray(rng.integers(0, vocab, (batch, gamma)), jnp.int32)
  keys = jax.random.split(jax.random.key(1), batch)
  greedy = verify.verify(logits, x, None, None, keys, GREEDY)
  assert isinstance(greedy, verify.Verdict) and greedy.p is None
  lenient = verify.verify(logits, x, None, None, keys, GREEDY, lenience=0.5)
  assert isinstance(lenient, verify.Verdict) and lenient.p is None
  sampling = SamplingConfig(1.0)
  q = probabilities(jnp.asarray(rng.standard_normal((batch, gamma, vocab)), jnp.float32), sampling)
  r = jax.random.uniform(jax.random.key(2), (batch, gamma + 2))  # [B, G], G > gamma
  sampled = verify.verify(logits, x, q, r, keys, sampling)
  assert isinstance(sampled, verify.Verdict)
  assert sampled.p.shape == (batch, gamma + 1, vocab)
  for verdict in (greedy, lenient, sampled):
    assert verdict.n.shape == verdict.t.shape == (batch,)
    assert verdict.beta.shape == (batch, gamma)
    assert verdict.bad.shape == (batch, gamma + 1)
    assert np.asarray(verdict.bad).tolist() == [[0] * 4, [0, 0, 1, 0]]
    assert ((np.asarray(verdict.n) >= 0) & (np.asarray(verdict.n) <= gamma)).all()
  # The sampled form is `speculative_step` on the first gamma uniforms.
  step = verify.speculative_step(sampled.p, q, x, r[:, :gamma], keys)
  assert isinstance(step, verify.Step)
  np.testing.assert_array_equal(step.n, sampled.n)
  np.testing.assert_array_equal(step.t, sampled.t)


def test_verify_at_gamma_0_accepts_nothing_and_samples_t_from_p_1():
  logits = jnp.asarray([[[0.0, 30.0, 0.0]]], jnp.float32)  # p_1 is all but one-hot
  x = jnp.zeros((1, 0), jnp.int32)
  q = jnp.zeros((1, 0, 3), jnp.float32)
  keys = jax.random.split(jax.random.key(0), 1)
  for sampling, r in ((GREEDY, None), (SamplingConfig(1.0), jnp.zeros((1, 2)))):
    verdict = verify.verify(logits, x, q, r, keys, sampling)
    assert verdict.n.tolist() == [0] and verdict.t.tolist() == [1]
    assert verdict.beta.shape == (1, 0)
