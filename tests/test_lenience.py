"""Lenience (Appendix A.5 of Leviathan et al., 2023): opt-in, bounded, exact when off.

What must hold: l = 1 is bit for bit Algorithm 1; for l < 1 every emitted token has
the closed-form lenient law min(q, p / l) + (1 - beta_l) norm(max(0, p - l q)), with
beta_l = sum min(p / l, q), never above p / l, and whole decodes follow the lenient
sequence law (which depends on gamma and the draft, see
`lenient_sequence_distribution`); measured acceptance is alpha_l; at temperature 0 a
draft token is accepted exactly when the target's p(x) >= l max(p).

Statistical tests use fixed seeds, so they are deterministic; each states the
false-alarm rate its threshold would have under fresh randomness.
"""

# Algorithm 1's own test machinery: toy models, step cases, sequence enumeration and
# the chi-square goodness of fit (CHI2_PVALUE = 1e-3: a 0.1% false alarm per test).
import itertools

from helpers import (
  CHI2_PVALUE,
  bigram_model,
  chi_square_pvalue,
  context_model,
  exact_sequence_distribution,
  step_cases,
  toy_tables,
)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec import theory, verify as verify_lib
from specdec._checks import check_lenience
from specdec.distributions import SamplingConfig, probabilities

GREEDY = SamplingConfig(temperature=0.0)
LENIENCES = (0.9, 0.5, 0.3, 0.1)
# Float tolerance of the closed-form checks (the step runs in float32).
RTOL, ATOL = 1e-6, 2e-7


def _normalize(x):
  x = jnp.asarray(x, jnp.float32)
  return x / jnp.sum(x)


def _float64(probs):
  """float32 distributions -> float64, renormalized (rounding is not a model property)."""
  probs = np.asarray(probs, np.float64)
  return probs / probs.sum(axis=-1, keepdims=True)


def lenient_law(p, q, lenience):
  """min(q, p / l) + (1 - beta_l) norm(max(0, p - l q)), in float64 (Appendix A.5)."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  kept = np.minimum(q, p / lenience)
  diff = np.maximum(p - lenience * q, 0.0)
  mass = diff.sum(axis=-1, keepdims=True)
  residual = np.where(mass > 0, diff / np.where(mass > 0, mass, 1.0), p)
  return kept + (1.0 - kept.sum(axis=-1, keepdims=True)) * residual


# ------------------------------------------------------------------ l = 1 is exact


def _decode_setup():
  vocab = 16
  target = context_model(jax.random.key(0), vocab)
  draft = context_model(jax.random.key(1), vocab)
  inputs = jax.random.randint(jax.random.key(2), (8, 3), 0, vocab)
  return target, draft, inputs


def _decode(sampling, **kwargs):
  target, draft, inputs = _decode_setup()
  return specdec.speculative_sample(
    target,
    draft,
    inputs,
    jax.random.key(3),
    gamma=3,
    max_new_tokens=10,
    sampling=sampling,
    eos_id=5,
    **kwargs,
  )


def _assert_same_output(a, b):
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.lengths, b.lengths)
  np.testing.assert_array_equal(a.log_probs, b.log_probs)
  for field in ("iterations", "accepted", "rejected", "beta_sum", "beta_count"):
    np.testing.assert_array_equal(getattr(a.stats, field), getattr(b.stats, field))


@pytest.mark.parametrize(
  "sampling",
  [SamplingConfig(1.0), pytest.param(SamplingConfig(0.8, top_k=4), marks=pytest.mark.slow), GREEDY],
  ids=["temperature_1", "top_k", "greedy"],
)
def test_lenience_one_is_bit_identical_to_the_default(sampling):
  default = _decode(sampling)
  for lenience in (1.0, 1, np.float32(1.0), np.float64(1.0)):
    _assert_same_output(_decode(sampling, lenience=lenience), default)


@pytest.mark.slow  # the default suite keeps the closed-form lenient law; CI runs this after it
def test_lenience_below_one_changes_the_decode():
  """Negative control of the test above: l reaches the decode at all."""
  exact = _decode(SamplingConfig(1.0))
  lenient = _decode(SamplingConfig(1.0), lenience=0.5)
  assert not np.array_equal(exact.tokens, lenient.tokens)
  # Accepting more often can only raise the accepted fraction of the drafts.
  assert float(lenient.stats.alpha_hat.mean()) > float(exact.stats.alpha_hat.mean())


def test_pieces_at_lenience_one_are_algorithm_1_bit_for_bit():
  rng = np.random.default_rng(0)
  for p, q in step_cases().values():
    p, q = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
    r = jnp.asarray(rng.uniform(size=p.shape), jnp.float32)
    np.testing.assert_array_equal(verify_lib.accepts(r, p, q, 1.0), r * q < p)
    diff = jnp.maximum(p - q, 0.0)
    mass = jnp.sum(diff)
    expected = diff / mass if mass > verify_lib._MIN_RESIDUAL_MASS else p
    np.testing.assert_array_equal(verify_lib.residual(p, q, 1.0), expected)
    np.testing.assert_array_equal(verify_lib.beta(p, q, 1.0), jnp.sum(jnp.minimum(p, q)))


# ------------------------------------------------------- l < 1: one step, exactly


def keep_probability(p_x, q_x, lenience, iterations=64):
  """P(accepts(r, p_x, q_x, l)) for r ~ U[0, 1), elementwise, from `accepts` itself.

  `accepts` is a threshold test in r (true for r below some t, false above), so
  its acceptance probability is that t, found by bisection on `accepts` (in float32,
  as the sampler runs it) without assuming its formula.
  """
  p_x, q_x = jnp.asarray(p_x, jnp.float32), jnp.asarray(q_x, jnp.float32)
  lo, hi = np.zeros(p_x.shape), np.ones(p_x.shape)
  yes_at_one = np.asarray(verify_lib.accepts(jnp.ones_like(p_x), p_x, q_x, lenience))
  for _ in range(iterations):
    mid = (lo + hi) / 2
    ok = np.asarray(verify_lib.accepts(jnp.asarray(mid, jnp.float32), p_x, q_x, lenience))
    lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
  return np.where(yes_at_one, 1.0, lo)


def emission_probabilities(p, q, lenience):
  """P(one lenient step emits v), from the step's own pieces: x ~ q kept with
  probability `keep_probability`, otherwise a draw from `residual(p, q, l)`."""
  q64 = np.asarray(q, np.float64)
  keep = keep_probability(p, q, lenience)
  rejected_mass = np.sum(q64 * (1.0 - keep))
  residual = np.asarray(verify_lib.residual(jnp.asarray(p), jnp.asarray(q), lenience), np.float64)
  return q64 * keep + rejected_mass * residual


@pytest.mark.parametrize("lenience", LENIENCES)
@pytest.mark.parametrize("name", list(step_cases()))
def test_one_lenient_step_has_the_closed_form_law(name, lenience):
  p, q = step_cases()[name]
  emitted = emission_probabilities(p, q, lenience)
  p64 = np.asarray(p, np.float64)
  np.testing.assert_allclose(emitted, lenient_law(p, q, lenience), rtol=RTOL, atol=ATOL)
  assert abs(emitted.sum() - 1.0) < RTOL
  assert (emitted >= 0).all()
  assert (emitted <= p64 / lenience * (1 + RTOL) + ATOL).all()
  # The acceptance probability is min(1, p(x) / (l q(x))), and the stats' beta its
  # mean under q: beta_l = sum min(p / l, q) = theory.acceptance(..., lenience=l).
  q64 = np.asarray(q, np.float64)
  keep = keep_probability(p, q, lenience)
  on_q = q64 > 0
  np.testing.assert_allclose(
    keep[on_q], np.minimum(1.0, p64[on_q] / (lenience * q64[on_q])), rtol=RTOL, atol=ATOL
  )
  beta_l = float(theory.acceptance(p64, q64, lenience=lenience))
  np.testing.assert_allclose(float(verify_lib.beta(p, q, lenience)), beta_l, rtol=RTOL)
  np.testing.assert_allclose(np.sum(q64 * keep), beta_l, rtol=RTOL, atol=ATOL)


def test_lenience_is_not_lossless():
  """On random pairs the lenient law moves away from p, and by more as l falls."""
  cases = step_cases()
  for name in ("random0", "random1", "random2"):
    p, q = cases[name]
    gaps = [
      np.abs(emission_probabilities(p, q, lenience) - np.asarray(p)).sum()
      for lenience in (1.0, 0.9, 0.5, 0.1)
    ]
    assert gaps[0] < 1e-6
    assert all(b > a for a, b in itertools.pairwise(gaps)), gaps


def test_lenience_gives_no_lower_bound_a_token_can_vanish():
  """p(0) = 0.1 but the draft never proposes token 0 and l q <= p elsewhere: every
  draft is accepted (beta_l = 1), so token 0 is never emitted."""
  p = _normalize([0.1, 0.45, 0.45])
  q = _normalize([0.0, 0.5, 0.5])
  emitted = emission_probabilities(p, q, 0.9)
  np.testing.assert_allclose(emitted, [0.0, 0.5, 0.5], atol=ATOL)
  np.testing.assert_allclose(emission_probabilities(p, q, 1.0), p, atol=ATOL)


# ------------------------------------------------------ whole sequences, statistically


def lenient_sequence_distribution(
  target_table, draft_table, prompt_token, num_new, sampling, gamma, lenience, eos_id
):
  """{sequence (0 after EOS): probability} of a lenient decode with bigram models.

  The law of a lenient decode is not a per-token law: it depends on where a token
  falls in its iteration. Within an iteration, the draft at position i is x_i ~
  q(. | x_{i-1}) and is kept with probability min(1, p(x_i | .) / (l q(x_i | .))),
  given all before it were kept; the first rejection emits one token from
  norm(max(0, p - l q)) of that position and ends the iteration; after gamma kept
  drafts the iteration ends with a token from p itself (the residual with q = 0,
  exact). Each of these draws is fresh (x_i, r_i and the correction use their own
  keys), so for bigram models the emitted tokens form a Markov chain on (last token,
  k), k = drafts kept so far in this iteration:
    k < gamma: emit a and go to (a, k + 1) w.p. min(q(a | s), p(a | s) / l) (kept),
               emit b and go to (b, 0) w.p. (1 - beta_l(s)) norm(max(0, p - l q))(b);
    k = gamma: emit t ~ p(. | s) and go to (t, 0).
  Summed over k, the first token from k = 0 has `lenient_law`; at l = 1 every state
  emits p(. | s) and the chain is the target's (checked below). The decode's first
  num_new tokens, cut at EOS, are this chain's.
  """
  p = _float64(probabilities(jnp.asarray(target_table, jnp.float32), sampling))
  q = _float64(probabilities(jnp.asarray(draft_table, jnp.float32), sampling))
  kept = np.minimum(q, p / lenience)
  rejected = lenient_law(p, q, lenience) - kept
  vocab = p.shape[0]
  frontier = {((), prompt_token, 0): 1.0}
  finished = {}
  for _ in range(num_new):
    nxt = {}
    for (prefix, s, k), prob in frontier.items():
      moves = [(p[s], 0)] if k == gamma else [(kept[s], k + 1), (rejected[s], 0)]
      for probs, k_next in moves:
        for a in range(vocab):
          if probs[a] == 0:
            continue
          out = prefix + (a,)
          if eos_id is not None and a == eos_id:
            key = out + (0,) * (num_new - len(out))
            finished[key] = finished.get(key, 0.0) + prob * probs[a]
          else:
            state = (out, a, k_next)
            nxt[state] = nxt.get(state, 0.0) + prob * probs[a]
    frontier = nxt
  for (prefix, _, _), prob in frontier.items():
    finished[prefix] = finished.get(prefix, 0.0) + prob
  return finished


NUM_NEW, NUM_SEQUENCES = 4, 50_000
LENIENT_SEQUENCE_CASES = {
  # name: (sampling, gamma, lenience, eos_id)
  "gamma_1_l_0.5": (SamplingConfig(1.0), 1, 0.5, None),
  "gamma_3_l_0.3_top_k_3_with_eos": (SamplingConfig(0.6, top_k=3), 3, 0.3, 4),
}


def test_the_lenient_sequence_law_reduces_to_the_target_at_lenience_one():
  """The enumeration itself: at l = 1 it is the target's law, for any gamma."""
  target_table, draft_table = toy_tables(seed=7)
  for sampling, gamma, _, eos_id in LENIENT_SEQUENCE_CASES.values():
    exact = exact_sequence_distribution(target_table, 1, NUM_NEW, sampling, eos_id)
    lenient = lenient_sequence_distribution(
      target_table, draft_table, 1, NUM_NEW, sampling, gamma, 1.0, eos_id
    )
    for seq in set(exact) | set(lenient):
      assert abs(exact.get(seq, 0.0) - lenient.get(seq, 0.0)) < 1e-12


def _first_token_law(dist, vocab):
  law = np.zeros(vocab)
  for seq, prob in dist.items():
    law[seq[0]] += prob
  return law


def _draw(target_table, draft_table, sampling, gamma, lenience, eos_id, seed):
  inputs = jnp.full((NUM_SEQUENCES, 1), 1, jnp.int32)
  out = specdec.speculative_sample(
    bigram_model(target_table),
    bigram_model(draft_table),
    inputs,
    jax.random.key(seed),
    gamma=gamma,
    max_new_tokens=NUM_NEW,
    sampling=sampling,
    eos_id=eos_id,
    lenience=lenience,
  )
  return np.asarray(out.tokens), out


@pytest.mark.parametrize(
  "name",
  [  # gamma 1 after the suite
    pytest.param(n, marks=pytest.mark.slow) if n.startswith("gamma_1") else n
    for n in LENIENT_SEQUENCE_CASES
  ],
)
def test_lenient_sequences_follow_the_lenient_law(name):
  sampling, gamma, lenience, eos_id = LENIENT_SEQUENCE_CASES[name]
  target_table, draft_table = toy_tables(seed=7)
  dist = lenient_sequence_distribution(
    target_table, draft_table, 1, NUM_NEW, sampling, gamma, lenience, eos_id
  )
  assert abs(sum(dist.values()) - 1.0) < 1e-9
  # The first token of a decode has the per-token lenient law, within p / l.
  p = _float64(probabilities(jnp.asarray(target_table, jnp.float32), sampling))
  q = _float64(probabilities(jnp.asarray(draft_table, jnp.float32), sampling))
  first = _first_token_law(dist, p.shape[0])
  np.testing.assert_allclose(first, lenient_law(p[1], q[1], lenience), atol=1e-12)
  assert (first <= p[1] / lenience + 1e-12).all()
  samples, out = _draw(target_table, draft_table, sampling, gamma, lenience, eos_id, seed=11)
  assert 0 < int(out.stats.accepted.sum()) < int(out.stats.drafted.sum())
  assert chi_square_pvalue(samples, dist) > CHI2_PVALUE
  # Negative control on the same samples: they are not the target's (lenience is
  # not lossless, and the test above has the power to tell).
  target_dist = exact_sequence_distribution(target_table, 1, NUM_NEW, sampling, eos_id)
  assert chi_square_pvalue(samples, target_dist) < CHI2_PVALUE
  # Nor the lenient law of another gamma: the law depends on gamma, as derived.
  other_gamma = lenient_sequence_distribution(
    target_table, draft_table, 1, NUM_NEW, sampling, gamma + 1, lenience, eos_id
  )
  assert chi_square_pvalue(samples, other_gamma) < CHI2_PVALUE


# ------------------------------------------ acceptance on context-free models: alpha_l


def _constant_logits(tokens, logits):
  return jnp.broadcast_to(logits, tokens.shape + logits.shape[-1:])


def constant_model(logits):
  logits = jnp.asarray(logits, jnp.float32)
  return specdec.CausalLM.from_fn(_constant_logits, logits.shape[-1], params=logits)


@pytest.mark.slow  # the default suite keeps the closed-form lenient law; CI runs this after it
@pytest.mark.parametrize("lenience", [0.6, 0.25])
def test_measured_acceptance_matches_alpha_l_on_constant_models(lenience):
  vocab, batch, gamma = 6, 4000, 3
  rng = np.random.default_rng(4)
  lp = rng.standard_normal(vocab) * 1.5
  lq = lp + rng.standard_normal(vocab)
  out = specdec.speculative_sample(
    constant_model(lp),
    constant_model(lq),
    jnp.zeros((batch, 1), jnp.int32),
    jax.random.key(0),
    gamma=gamma,
    max_new_tokens=24,
    sampling=SamplingConfig(1.0),
    lenience=lenience,
  )
  p = probabilities(jnp.asarray(lp, jnp.float32), SamplingConfig(1.0))
  q = probabilities(jnp.asarray(lq, jnp.float32), SamplingConfig(1.0))
  alpha = float(theory.acceptance(p, q))
  alpha_l = float(theory.acceptance(p, q, lenience=lenience))
  assert alpha + 0.05 < alpha_l < 0.95  # lenience matters here, and not every draft
  # Context-free: every position's beta is beta_l, so alpha_hat is alpha_l exactly.
  np.testing.assert_allclose(out.stats.alpha_hat, alpha_l, rtol=1e-5)
  # Each draft is accepted independently with probability alpha_l: the pooled
  # accept-count estimate within 4 standard errors (false alarm 6e-5).
  accepted = int(out.stats.accepted.sum())
  trials = int((out.stats.accepted + out.stats.rejected).sum())
  assert abs(accepted / trials - alpha_l) < 4 * np.sqrt(alpha_l * (1 - alpha_l) / trials)
  # Per row too (about 24 / E[tokens] iterations each): the rows' mean estimate,
  # within 4 standard errors of the rows' spread (false alarm 6e-5).
  per_row = np.asarray(out.stats.alpha_from_accepts)
  assert abs(per_row.mean() - alpha_l) < 4 * per_row.std() / np.sqrt(batch) + 0.01
  # Tokens per iteration: Eq. 1 with alpha_l, within 4 standard errors of the
  # truncated geometric (false alarm 6e-5).
  k = np.arange(1, gamma + 2)
  pk = np.append(alpha_l ** (k[:-1] - 1) * (1 - alpha_l), alpha_l**gamma)
  mean, std = float(pk @ k), float(np.sqrt(pk @ k**2 - (pk @ k) ** 2))
  np.testing.assert_allclose(mean, theory.expected_tokens(alpha_l, gamma), rtol=1e-12)
  iterations = int(out.stats.iterations.sum())
  measured = int((out.stats.accepted + out.stats.iterations).sum()) / iterations
  assert abs(measured - mean) < 4 * std / np.sqrt(iterations)


# --------------------------------------------------------- temperature 0: p(x) >= l max p


def _crafted_greedy_logits(lenience, log_ratio, vocab=6, x=2, y=0):
  """Target logits whose token x has p(x) / max(p) = l e^log_ratio, max at y; and
  draft logits whose greedy token is x."""
  target = np.full(vocab, -3.0, np.float32)
  target[y] = 0.0
  target[x] = np.log(lenience) + log_ratio
  draft = np.zeros(vocab, np.float32)
  draft[x] = 4.0
  return target, draft


@pytest.mark.parametrize("lenience", [0.5, 0.1])
def test_greedy_accepts_exactly_when_p_x_is_within_l_of_max_p(lenience):
  gamma, max_new, x, y = 3, 8, 2, 0
  for log_ratio, accepted in ((1e-4, True), (-1e-4, False)):
    target, draft = _crafted_greedy_logits(lenience, log_ratio, x=x, y=y)
    p = np.asarray(probabilities(jnp.asarray(target), SamplingConfig(1.0)), np.float64)
    assert (p[x] >= lenience * p.max()) == accepted
    out = specdec.speculative_sample(
      constant_model(target),
      constant_model(draft),
      jnp.zeros((2, 1), jnp.int32),
      jax.random.key(0),
      gamma=gamma,
      max_new_tokens=max_new,
      sampling=GREEDY,
      lenience=lenience,
    )
    tokens = np.asarray(out.tokens)
    if accepted:
      # Every iteration keeps all gamma drafts, then the target's greedy token.
      np.testing.assert_array_equal(tokens, [[x, x, x, y] * 2] * 2)
      np.testing.assert_array_equal(out.stats.accepted, gamma * out.stats.iterations)
      np.testing.assert_allclose(out.stats.alpha_hat, 1.0)
    else:
      np.testing.assert_array_equal(tokens, np.full((2, max_new), y))
      np.testing.assert_array_equal(out.stats.accepted, 0)
      np.testing.assert_allclose(out.stats.alpha_hat, 0.0)


def test_lenient_greedy_step_is_the_p_x_over_max_p_rule_on_many_crafted_rows():
  rng = np.random.default_rng(5)
  batch, gamma, vocab = 64, 4, 9
  logits = rng.standard_normal((batch, gamma + 1, vocab)).astype(np.float32) * 2
  x = rng.integers(0, vocab, (batch, gamma)).astype(np.int32)
  for lenience in LENIENCES:
    n, t, ok = verify_lib.lenient_greedy_step(jnp.asarray(logits), jnp.asarray(x), GREEDY, lenience)
    p = _float64(probabilities(jnp.asarray(logits), SamplingConfig(1.0)))
    p_x = np.take_along_axis(p[:, :gamma], x[..., None], -1)[..., 0]
    ratio = p_x / p[:, :gamma].max(-1)
    clear = np.abs(ratio - lenience) > 1e-5  # float32 rounding aside
    np.testing.assert_array_equal(np.asarray(ok, bool)[clear], (ratio >= lenience)[clear])
    expected_n = np.cumprod(np.asarray(ok, bool), axis=1).sum(axis=1)
    np.testing.assert_array_equal(n, expected_n)
    greedy = np.argmax(logits, axis=-1)
    np.testing.assert_array_equal(t, greedy[np.arange(batch), expected_n])
    assert 0 < expected_n.sum() < batch * gamma


def test_greedy_top_k_never_accepts_a_token_outside_the_targets_top_k():
  # The draft's token 3 is the target's 4th most likely, p(3) / max(p) = e^-0.3,
  # which l = 0.1 accepts without top-k; with top_k = 3, p(3) = 0 and it cannot be.
  vocab, gamma = 6, 3
  target = np.array([0.0, -0.1, -0.2, -0.3, -5.0, -5.0], np.float32)
  draft = np.zeros(vocab, np.float32)
  draft[3] = 4.0
  # The shapes and settings of the test above at l = 0.1: one compiled decode.
  inputs = jnp.zeros((2, 1), jnp.int32)
  for top_k, expect_accepted in ((None, True), (3, False)):
    out = specdec.speculative_sample(
      constant_model(target),
      constant_model(draft),
      inputs,
      jax.random.key(0),
      gamma=gamma,
      max_new_tokens=8,
      sampling=SamplingConfig(0.0, top_k=top_k),
      lenience=0.1,
    )
    assert (int(out.stats.accepted[0]) > 0) == expect_accepted
    assert (3 in np.asarray(out.tokens[0]).tolist()) == expect_accepted


def _lenient_greedy_reference(target_table, draft_table, prompt, gamma, lenience, max_new):
  """The temperature-0 variant iteration by iteration, in float64 numpy."""
  p = _float64(probabilities(jnp.asarray(target_table), SamplingConfig(1.0)))
  out, last, off_greedy = [], prompt, 0
  while len(out) < max_new:
    xs, s = [], last
    for _ in range(gamma):
      s = int(np.argmax(draft_table[s]))
      xs.append(s)
    n, s = 0, last
    while n < gamma and p[s, xs[n]] >= lenience * p[s].max():
      off_greedy += int(xs[n] != np.argmax(target_table[s]))
      s = xs[n]
      n += 1
    t = int(np.argmax(target_table[s]))
    out += xs[:n] + [t]
    last = t
  return out[:max_new], off_greedy


def test_greedy_lenient_decode_equals_the_rule_applied_by_hand():
  vocab, gamma, lenience, max_new = 8, 3, 0.4, 12
  rng = np.random.default_rng(4)
  target_table = (rng.standard_normal((vocab, vocab)) * 1.5).astype(np.float32)
  draft_table = (target_table + rng.standard_normal((vocab, vocab))).astype(np.float32)
  prompts = np.arange(vocab)
  out = specdec.speculative_sample(
    bigram_model(target_table),
    bigram_model(draft_table),
    jnp.asarray(prompts[:, None], jnp.int32),
    jax.random.key(0),
    gamma=gamma,
    max_new_tokens=max_new,
    sampling=GREEDY,
    lenience=lenience,
  )
  off_greedy = 0
  for row, prompt in enumerate(prompts):
    tokens, off = _lenient_greedy_reference(
      target_table, draft_table, int(prompt), gamma, lenience, max_new
    )
    np.testing.assert_array_equal(np.asarray(out.tokens[row]), tokens)
    off_greedy += off
  # Not vacuous: some accepted drafts are not the target's greedy token (which
  # exact greedy decoding would emit there), and some drafts were rejected.
  assert off_greedy > 0
  assert 0 < int(out.stats.accepted.sum()) < int(out.stats.drafted.sum())


# ------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
  "lenience",
  [0, 0.0, -0.2, 1.0000001, 2, float("nan"), float("inf"), True, np.bool_(False), "0.5", None],
)
def test_bad_lenience_raises_naming_it(lenience):
  target, draft, inputs = _decode_setup()
  with pytest.raises(ValueError, match="lenience"):
    specdec.speculative_sample(
      target, draft, inputs, jax.random.key(0), gamma=2, max_new_tokens=4, lenience=lenience
    )
  with pytest.raises(ValueError, match="lenience"):
    check_lenience(lenience)


def test_numpy_scalar_lenience_is_accepted_and_equals_the_python_float():
  reference = _decode(SamplingConfig(1.0), lenience=0.5)
  for lenience in (np.float32(0.5), np.float64(0.5)):
    assert check_lenience(lenience) == 0.5
    _assert_same_output(_decode(SamplingConfig(1.0), lenience=lenience), reference)
