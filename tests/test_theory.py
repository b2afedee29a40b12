"""Section 3's formulas reproduce the paper's tables and behave at the edges."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from specdec import theory

# Table 1 (c = c_hat = 0): (alpha, gamma) -> (operations factor, speed factor).
TABLE_1 = [
  (0.6, 2, 1.53, 1.96),
  (0.7, 3, 1.58, 2.53),
  (0.8, 2, 1.23, 2.44),
  (0.8, 5, 1.63, 3.69),
  (0.9, 2, 1.11, 2.71),
  (0.9, 10, 1.60, 6.86),
]

# Table 2's (task, draft, temperature, gamma, alpha), and the expected walltime
# improvement of Table 4 for c = 0.02 / 0.04 / 0.11 (T5-small / base / large), as
# printed to one decimal; the paper's alphas are rounded, hence the 0.1 tolerance.
C = {"small": 0.02, "base": 0.04, "large": 0.11}
TABLE_4_EXPECTED = [
  ("ende", "small", 0, 7, 0.75, 3.2),
  ("ende", "base", 0, 7, 0.80, 3.3),
  ("ende", "large", 0, 7, 0.82, 2.5),
  ("ende", "small", 1, 7, 0.62, 2.3),
  ("ende", "base", 1, 5, 0.68, 2.3),
  ("ende", "large", 1, 3, 0.71, 1.9),
  ("cnndm", "small", 0, 5, 0.65, 2.4),
  ("cnndm", "base", 0, 5, 0.73, 2.6),
  ("cnndm", "large", 0, 3, 0.74, 2.0),
  ("cnndm", "small", 1, 5, 0.53, 1.9),
  ("cnndm", "base", 1, 3, 0.55, 1.8),
  ("cnndm", "large", 1, 3, 0.56, 1.5),
]


@pytest.mark.parametrize("alpha,gamma,ops,speed", TABLE_1)
def test_table_1_is_reproduced(alpha, gamma, ops, speed):
  assert round(float(theory.arithmetic_ops_factor(alpha, gamma, 0.0)), 2) == ops
  assert round(float(theory.walltime_improvement(alpha, gamma, 0.0)), 2) == speed


@pytest.mark.parametrize("task,draft,temp,gamma,alpha,expected", TABLE_4_EXPECTED)
def test_table_4_expected_column_is_reproduced(task, draft, temp, gamma, alpha, expected):
  assert abs(float(theory.walltime_improvement(alpha, gamma, C[draft])) - expected) < 0.1


def test_equation_1_matches_the_geometric_sum():
  for alpha in (0.0, 0.3, 0.75, 0.999999):
    for gamma in (0, 1, 4, 9):
      direct = sum(alpha**i for i in range(gamma + 1))
      np.testing.assert_allclose(theory.expected_tokens(alpha, gamma), direct, rtol=1e-9)


def test_edges_are_finite_and_right():
  assert theory.expected_tokens(1.0, 7) == 8.0
  assert theory.expected_tokens(0.0, 7) == 1.0
  assert theory.expected_tokens(0.5, 0) == 1.0
  assert theory.walltime_improvement(1.0, 3, 0.0) == 4.0
  assert theory.walltime_improvement(0.4, 0, 0.5) == 1.0
  assert theory.arithmetic_ops_factor(1.0, 3, 0.0) == 1.0
  assert np.isfinite(theory.expected_tokens(1.0 - 1e-15, 5))
  np.testing.assert_allclose(theory.expected_tokens(1.0 - 1e-9, 5), 6.0, rtol=1e-7)


def test_functions_broadcast_over_arrays():
  gammas = np.arange(1, 6)
  out = theory.walltime_improvement(0.8, gammas, 0.05)
  assert out.shape == (5,)
  np.testing.assert_allclose(out[2], theory.walltime_improvement(0.8, 3, 0.05))


def test_refined_model_divides_by_the_verification_cost():
  np.testing.assert_allclose(
    theory.walltime_improvement(0.8, 4, 0.1, v=2.0), theory.expected_tokens(0.8, 4) / (0.4 + 2.0)
  )


def test_optimal_gamma_maximises_the_improvement():
  for alpha, c in [(0.8, 0.05), (0.6, 0.02), (0.9, 0.01)]:
    best = theory.optimal_gamma(alpha, c, max_gamma=32)
    values = [theory.walltime_improvement(alpha, g, c) for g in range(1, 33)]
    assert best == 1 + int(np.argmax(values))
  # alpha < c: no gamma helps (Corollary 3.9's condition fails).
  assert theory.optimal_gamma(0.1, 0.5) == 0


def test_acceptance_is_sum_of_min():
  p = np.array([0.5, 0.5, 0.0])
  q = np.array([0.2, 0.3, 0.5])
  assert theory.acceptance(p, q) == pytest.approx(0.5)
  assert float(theory.acceptance(jnp.asarray(p), jnp.asarray(p))) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="vocabulary"):
    theory.acceptance(p, q[:2])


@pytest.mark.parametrize(
  "call,name",
  [
    (lambda: theory.expected_tokens(1.5, 3), "alpha"),
    (lambda: theory.expected_tokens(0.5, -1), "gamma"),
    (lambda: theory.expected_tokens(0.5, 2.5), "gamma"),
    (lambda: theory.walltime_improvement(0.5, 2, -0.1), "c"),
    (lambda: theory.walltime_improvement(0.5, 2, 0.1, v=0), "v"),
    (lambda: theory.arithmetic_ops_factor(0.5, 2, float("nan")), "c_hat"),
    (lambda: theory.optimal_gamma(0.5, 0.1, max_gamma=0), "max_gamma"),
  ],
)
def test_bad_arguments_raise_errors_naming_them(call, name):
  with pytest.raises(ValueError, match=name):
    call()


# ----------------------------------------------------------- lenience (Appendix A.5)


def _random_pairs(seed, count=6, vocab=7):
  rng = np.random.default_rng(seed)
  return [
    (rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab) * 0.3)) for _ in range(count)
  ]


def test_lenient_acceptance_is_sum_of_min_of_p_over_l_and_q():
  p = np.array([0.5, 0.3, 0.2, 0.0])
  q = np.array([0.1, 0.6, 0.0, 0.3])
  # min(p / l, q) at l = 0.5: [0.1, 0.6, 0, 0]; at l = 0.8: [0.1, 0.375, 0, 0].
  assert theory.acceptance(p, q, lenience=0.5) == pytest.approx(0.7)
  assert theory.acceptance(p, q, lenience=0.8) == pytest.approx(0.475)
  assert theory.acceptance(p, q) == pytest.approx(0.4)
  # A token the target rules out (p = 0) is never accepted, whatever l.
  assert theory.acceptance(p, q, lenience=1e-6) == pytest.approx(0.7)


def test_lenience_one_is_bit_for_bit_the_exact_acceptance():
  for p, q in _random_pairs(1):
    assert theory.acceptance(p, q, lenience=1.0) == theory.acceptance(p, q)
    assert theory.acceptance(p, q, lenience=1) == theory.acceptance(p, q)
    pj, qj = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
    assert float(theory.acceptance(pj, qj, lenience=1.0)) == float(theory.acceptance(pj, qj))


def test_lenient_acceptance_rises_to_one_as_lenience_falls():
  for p, q in _random_pairs(2):
    lenience = [1.0, 0.8, 0.5, 0.3, 0.1, 0.01]
    alphas = [float(theory.acceptance(p, q, lenience=ell)) for ell in lenience]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(alphas))
    assert alphas[-1] <= 1.0 + 1e-12
    # Once l <= min p / q over q's support, every draft is accepted.
    l_all = float(np.min(p[q > 0] / q[q > 0]))
    assert theory.acceptance(p, q, lenience=l_all) == pytest.approx(1.0)
    assert theory.acceptance(p, q, lenience=min(1.0, 1.01 * l_all)) < 1.0


def test_lenient_acceptance_works_along_an_axis_and_on_jax_arrays():
  pairs = _random_pairs(3, count=4)
  p = np.stack([a for a, _ in pairs])
  q = np.stack([b for _, b in pairs])
  rows = [theory.acceptance(a, b, lenience=0.4) for a, b in pairs]
  np.testing.assert_allclose(theory.acceptance(p, q, lenience=0.4), rows, rtol=1e-12)
  np.testing.assert_allclose(theory.acceptance(p.T, q.T, axis=0, lenience=0.4), rows, rtol=1e-12)
  np.testing.assert_allclose(
    theory.acceptance(
      jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32), lenience=np.float32(0.4)
    ),
    rows,
    rtol=1e-5,
  )


def test_expected_tokens_with_lenient_alpha_is_equation_1():
  # Eq. 1 holds for any per-draft acceptance probability: with alpha_l it is the
  # mean of the truncated geometric n + 1 whose success probability is alpha_l.
  p, q = _random_pairs(4, count=1)[0]
  for ell in (1.0, 0.5, 0.1):
    alpha_l = float(theory.acceptance(p, q, lenience=ell))
    for gamma in (1, 4, 8):
      k = np.arange(1, gamma + 2)
      pk = np.append(alpha_l ** (k[:-1] - 1) * (1 - alpha_l), alpha_l**gamma)
      np.testing.assert_allclose(theory.expected_tokens(alpha_l, gamma), pk @ k, rtol=1e-12)


@pytest.mark.parametrize(
  "lenience", [0, 0.0, -0.5, 1.5, float("nan"), float("inf"), True, np.bool_(True), "0.5", None]
)
def test_bad_lenience_raises_naming_it(lenience):
  p, q = _random_pairs(5, count=1)[0]
  with pytest.raises(ValueError, match="lenience"):
    theory.acceptance(p, q, lenience=lenience)
