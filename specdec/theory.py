"""Section 3 of Leviathan et al. (2023): what speculative decoding should buy.

Notation as in the paper: alpha is the expected acceptance rate E[beta] with
beta = sum_x min(p(x), q(x)) (Definition 3.1, Corollary 3.6); gamma the number of
draft tokens per iteration; c the ratio of one draft (Mq) step's time to one target
(Mp) step's time; c_hat the same ratio for arithmetic operations per token.

Every function accepts scalars or numpy arrays (broadcasting) and is finite at the
edges: alpha = 1 (the draft is the target) and gamma = 0 (plain decoding).

Lenience (Appendix A.5) enters through alpha only: `acceptance(p, q, lenience=l)` is
beta_l = sum_x min(p(x) / l, q(x)), and Eq. 1 / Theorem 3.8 / Theorem 3.11 take
alpha_l = E[beta_l] as they take alpha.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# One definition of a valid lenience, the sampler's (Appendix A.5).
from specdec._checks import check_lenience


def _check_gamma(gamma) -> np.ndarray:
  g = np.asarray(gamma)
  if not np.issubdtype(g.dtype, np.integer) or np.any(g < 0):
    raise ValueError(f"gamma must be a non-negative integer, got {gamma!r}")
  return g


def _check_alpha(alpha) -> np.ndarray:
  a = np.asarray(alpha, dtype=np.float64)
  if np.any(~np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
  return a


def expected_tokens(alpha, gamma):
  """E[tokens per iteration] = (1 - alpha^(gamma+1)) / (1 - alpha)  (Equation 1).

  Computed as the geometric sum sum_{i=0..gamma} alpha^i, which is the same number
  and stays exact at alpha = 1 (gamma + 1 tokens) and gamma = 0 (one token).
  """
  a = _check_alpha(alpha)
  g = _check_gamma(gamma)
  # (1 - a^(g+1)) / (1 - a) with the removable singularity at a = 1 filled in.
  near_one = np.isclose(a, 1.0, rtol=0.0, atol=1e-12)
  safe = np.where(near_one, 0.5, a)
  closed = (1.0 - safe ** (g + 1)) / (1.0 - safe)
  result = np.where(near_one, g + 1.0, closed)
  return result[()] if result.ndim == 0 else result


def walltime_improvement(alpha, gamma, c, v=1.0):
  """Expected walltime improvement factor (Theorem 3.8).

  (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + 1)): one iteration costs gamma
  draft steps plus one target call over gamma + 1 positions, which the paper takes to
  cost one target step (v = 1, enough parallel compute). `v` is the measured cost of
  that verification call in target steps, t_p(gamma+1) / t_p(1), for hardware where
  it is not 1 (the refined model the benchmarks report): E[tokens] / (gamma c + v).
  """
  c = np.asarray(c, dtype=np.float64)
  v = np.asarray(v, dtype=np.float64)
  if np.any(c < 0) or np.any(~np.isfinite(c)):
    raise ValueError(f"c must be a finite number >= 0, got {c!r}")
  if np.any(v <= 0) or np.any(~np.isfinite(v)):
    raise ValueError(f"v must be a finite number > 0, got {v!r}")
  return expected_tokens(alpha, gamma) / (np.asarray(gamma) * c + v)


def arithmetic_ops_factor(alpha, gamma, c_hat):
  """Expected factor of increase in arithmetic operations (Theorem 3.11).

  (1 - alpha) (gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)): each iteration runs
  Mp on gamma + 1 positions and Mq on gamma, for E[tokens] tokens.
  """
  c_hat = np.asarray(c_hat, dtype=np.float64)
  if np.any(c_hat < 0) or np.any(~np.isfinite(c_hat)):
    raise ValueError(f"c_hat must be a finite number >= 0, got {c_hat!r}")
  g = np.asarray(gamma)
  return (g * c_hat + g + 1.0) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha, c, max_gamma: int = 64, v=1.0) -> int:
  """The integer gamma in 1..max_gamma maximising `walltime_improvement` (Figure 3).

  Returns 0 when no gamma >= 1 beats plain decoding (improvement <= 1), e.g. when the
  draft is too slow for its acceptance rate (Corollary 3.9 needs alpha > c).
  """
  if isinstance(max_gamma, bool) or not isinstance(max_gamma, int) or max_gamma < 1:
    raise ValueError(f"max_gamma must be an int >= 1, got {max_gamma!r}")
  gammas = np.arange(1, max_gamma + 1)
  speedups = walltime_improvement(float(alpha), gammas, float(c), v=float(v))
  best = int(np.argmax(speedups))
  return int(gammas[best]) if speedups[best] > 1.0 else 0


def acceptance(p, q, axis: int = -1, *, lenience: float = 1.0):
  """beta = sum_x min(p(x), q(x)) (Corollary 3.6): the probability a draft is kept.

  Averaging beta over the positions of a decode estimates alpha (Definition 3.1).
  Works on numpy or JAX arrays of distributions along `axis`.

  With lenience l in (0, 1) (Appendix A.5, `speculative_sample(..., lenience=l)` at
  temperature > 0), a draft x ~ q is kept with probability min(1, p(x) / (l q(x))),
  so beta_l = sum_x min(p(x) / l, q(x)): at least beta, at most 1, and 1 once
  l <= min_x p(x) / q(x). l = 1 is the exact beta. Eq. 1 and Theorem 3.8 then hold
  with alpha_l = E[beta_l] in place of alpha -- their derivation only uses that each
  draft is kept with probability alpha, independently -- so the expected tokens per
  iteration are `expected_tokens(alpha_l, gamma)` and the speed-up
  `walltime_improvement(alpha_l, gamma, c)`; there is no separate lenient formula.

  Not the temperature-0 variant: there a draft's (greedy) token x is kept iff the
  target's temperature-1 p has p(x) >= l max(p) (`verify.lenient_greedy_step`),
  which is not a function of the two one-hot distributions this takes.

  Args:
    p: [..., V] target distributions.
    q: [..., V] draft distributions, the same vocabulary along `axis`.
    axis: the vocabulary axis.
    lenience: l in (0, 1], a Python or numpy scalar (ValueError otherwise).

  Returns:
    [...]: beta (beta_l) of every distribution pair.
  """
  lenience = check_lenience(lenience)
  if hasattr(p, "shape") and hasattr(q, "shape") and p.shape[axis] != q.shape[axis]:
    raise ValueError(
      f"p and q must have the same vocabulary size, got {p.shape[axis]} and {q.shape[axis]}"
    )
  xp = np if isinstance(p, np.ndarray) and isinstance(q, np.ndarray) else jnp
  # p / 1 is p itself: l = 1 is bit for bit the exact beta.
  return xp.sum(xp.minimum(p if lenience == 1.0 else p / lenience, q), axis=axis)
