"""Temperature, top-k and top-p give the distributions they promise, in float32."""

from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

from specdec import distributions
from specdec.distributions import SamplingConfig, probabilities


def reference(logits, temperature, top_k=None, top_p=None):
  """A plain numpy implementation, float64."""
  z = np.asarray(logits, np.float64) / temperature
  if top_k is not None:
    kth = np.sort(z)[::-1][top_k - 1]
    z = np.where(z >= kth, z, -np.inf)
  p = np.exp(z - z.max())
  p /= p.sum()
  if top_p is not None:
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    keep = np.zeros_like(p, bool)
    keep[order[before < top_p]] = True
    p = np.where(p >= p[keep].min(), p, 0.0)
    p /= p.sum()
  return p


LOGITS = np.array([2.0, -1.0, 0.5, 3.0, 0.0, -2.0, 1.0])


@pytest.mark.parametrize(
  "temperature,top_k,top_p",
  [
    (1.0, None, None),
    (0.5, None, None),
    (2.0, None, None),
    (1.0, 3, None),
    (0.7, 1, None),
    (1.0, None, 0.5),
    (1.0, None, 0.9),
    (0.8, 4, 0.7),
    (1.0, 7, 1.0),
  ],
)
def test_matches_a_numpy_reference(temperature, top_k, top_p):
  got = probabilities(jnp.asarray(LOGITS), SamplingConfig(temperature, top_k, top_p))
  np.testing.assert_allclose(got, reference(LOGITS, temperature, top_k, top_p), atol=1e-6)


def test_temperature_zero_is_one_hot_argmax():
  got = probabilities(jnp.asarray(LOGITS), SamplingConfig(0.0, top_k=2, top_p=0.1))
  np.testing.assert_array_equal(got, np.eye(7)[3])


def test_top_p_always_keeps_the_most_probable_token():
  got = probabilities(jnp.asarray(LOGITS), SamplingConfig(1.0, top_p=1e-6))
  np.testing.assert_array_equal(got, np.eye(7)[3])


def test_top_k_keeps_ties_at_the_kth_value():
  got = probabilities(jnp.array([1.0, 1.0, 1.0, 0.0]), SamplingConfig(1.0, top_k=2))
  np.testing.assert_allclose(got, [1 / 3, 1 / 3, 1 / 3, 0.0], atol=1e-7)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_output_is_float32_whatever_the_logits_dtype(dtype):
  got = probabilities(jnp.asarray(LOGITS, dtype), SamplingConfig(1.0))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(
    got, reference(np.asarray(jnp.asarray(LOGITS, dtype), np.float64), 1.0), atol=1e-6
  )


@pytest.mark.parametrize(
  "logits,expected",
  [
    ([np.nan, 0.0, 0.0], [0.0, 0.5, 0.5]),
    ([-np.inf, -np.inf, -np.inf], [1 / 3, 1 / 3, 1 / 3]),
    ([np.nan, np.nan, np.nan], [1 / 3, 1 / 3, 1 / 3]),
    ([np.inf, 0.0, np.inf], [0.5, 0.0, 0.5]),
  ],
)
def test_non_finite_logits_never_give_nan(logits, expected):
  for cfg in (SamplingConfig(1.0), SamplingConfig(1e-8), SamplingConfig(0.5, 2, 0.9)):
    got = np.asarray(probabilities(jnp.asarray(logits, jnp.float32), cfg))
    assert np.isfinite(got).all() and abs(got.sum() - 1) < 1e-6
  np.testing.assert_allclose(
    probabilities(jnp.asarray(logits, jnp.float32), SamplingConfig(1.0)), expected, atol=1e-6
  )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
  logits=hnp.arrays(np.float32, st.integers(2, 12), elements=st.floats(-1e4, 1e4, width=32)),
  temperature=st.floats(0.0, 10.0),
  top_k=st.one_of(st.none(), st.integers(1, 2)),
  top_p=st.one_of(st.none(), st.floats(1e-3, 1.0)),
)
def test_always_a_distribution(logits, temperature, top_k, top_p):
  got = np.asarray(probabilities(jnp.asarray(logits), SamplingConfig(temperature, top_k, top_p)))
  assert np.isfinite(got).all() and (got >= 0).all()
  assert abs(got.sum() - 1.0) < 1e-5
  # Mass on a maximal logit; XLA's CPU flushes denormals, so logits within float32's
  # smallest normal of the max count as tied with it.
  top = np.flatnonzero(logits >= logits.max() - np.finfo(np.float32).tiny)
  assert got[top].sum() > 0


@pytest.mark.parametrize(
  "kwargs,name",
  [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(temperature="1"), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=float("nan")), "top_p"),
  ],
)
def test_bad_config_raises_naming_the_field(kwargs, name):
  with pytest.raises(ValueError, match=name):
    SamplingConfig(**kwargs)


def test_config_is_hashable_and_compares_by_value():
  assert hash(SamplingConfig(0.5, 3)) == hash(SamplingConfig(0.5, 3))
  assert SamplingConfig(0.5, 3) != SamplingConfig(0.5, 4)
  with pytest.raises(ValueError, match="top_k"):
    SamplingConfig(1.0, top_k=10).validate_vocab(8)


@pytest.mark.parametrize("vocab", [257, 1000, 1024, 32128])
def test_first_argmax_over_blocks_is_numpys_argmax(vocab):
  """The two-level first_argmax (vocabularies over 256) finds the first maximum: with
  ties across and within blocks, the maximum in the last (padded) block, all values
  equal, and -inf values."""
  from specdec.distributions import first_argmax

  rng = np.random.default_rng(vocab)
  rows = [
    rng.integers(-3, 4, vocab).astype(np.float32),  # many ties
    rng.standard_normal(vocab).astype(np.float32),
    np.zeros(vocab, np.float32),
    np.full(vocab, -np.inf, np.float32),
  ]
  last = rng.standard_normal(vocab).astype(np.float32)
  last[-1] = 10.0  # in the last block, which is padded unless 128 divides vocab
  rows.append(last)
  tied = np.where(np.arange(vocab) % 2 == 0, -np.inf, 1.0).astype(np.float32)
  rows.append(tied)
  values = np.stack(rows)
  np.testing.assert_array_equal(first_argmax(jnp.asarray(values)), np.argmax(values, -1))
  np.testing.assert_array_equal(
    first_argmax(jnp.asarray(values[None])), np.argmax(values, -1)[None]
  )


# ----------------------------------------------------------------------------- draws


@pytest.mark.parametrize("vocab", [7, 300])  # one level; two levels, a padded block
def test_sample_categorical_follows_the_probabilities(vocab):
  """Chi-square over 2^17 draws of one unnormalized distribution (false alarm 1e-3)."""
  rng = np.random.default_rng(vocab)
  weights = rng.dirichlet(np.ones(vocab) * 0.5).astype(np.float32) * 3.0
  weights[::5] = 0.0  # zeros inside every block
  draws = 1 << 17
  keys = jax.random.split(jax.random.key(vocab), draws)
  tokens = np.asarray(
    jax.jit(distributions.sample_categorical)(
      keys, jnp.broadcast_to(jnp.asarray(weights), (draws, vocab))
    )
  )
  assert not np.isin(tokens, np.flatnonzero(weights == 0)).any()
  expected = weights.astype(np.float64) / weights.sum() * draws
  observed = np.bincount(tokens, minlength=vocab)
  keep = expected >= 5
  pooled_obs = np.append(observed[keep], observed[~keep].sum())
  pooled_exp = np.append(expected[keep], expected[~keep].sum())
  pooled_exp *= draws / pooled_exp.sum()  # float64 rounding of the pooled sum
  assert scipy_stats.chisquare(pooled_obs, pooled_exp).pvalue > 1e-3


def test_sample_categorical_never_draws_a_zero_unless_everything_is_zero():
  probs = jnp.zeros((4, 32128)).at[0, 77].set(1e-30).at[1, 32127].set(2.0)
  probs = probs.at[2, :].set(1e-38).at[2, 5].set(0.0).at[3, 1000].set(1.0)
  tokens = distributions.sample_categorical(jax.random.split(jax.random.key(0), 4), probs)
  assert np.asarray(tokens)[[0, 1, 3]].tolist() == [77, 32127, 1000]
  assert np.asarray(tokens)[2] != 5


def test_uniform_is_exact_near_zero_where_a_float32_grid_is_not():
  """P(u < a) = a for a far below 2^-23, and u is not confined to the 2^-23 grid."""
  n = 1 << 20
  u = np.asarray(distributions.uniform(jax.random.key(0), (n,)), np.float64)
  assert ((u > 0) & (u < 1)).all()
  small = u[u < 2.0**-10]  # ~1024 draws expected
  assert scipy_stats.binomtest(small.size, n, 2.0**-10).pvalue > 1e-4
  # Exact multiples of 2^-23 among them: ~1/8192 of them for a continuous law (all of
  # them for jax.random.uniform).
  on_grid = np.mean(np.mod(small, 2.0**-23) == 0)
  assert on_grid < 0.01
  # Rescaled, the small draws are uniform on [0, 1) again (KS, false alarm 1e-4).
  assert scipy_stats.kstest(small * 2.0**10, "uniform").pvalue > 1e-4
  assert scipy_stats.kstest(u, "uniform").pvalue > 1e-4


def test_nonfinite_flags_nan_plus_inf_and_rows_without_a_finite_logit():
  x = jnp.array(
    [
      [0.0, 1.0, 2.0],
      [np.nan, 1.0, 2.0],
      [1.0, np.inf, 0.0],
      [-np.inf] * 3,
      [-np.inf, 0.0, -np.inf],
      [2.0, 1.0, np.nan],
    ]
  )
  assert np.asarray(distributions.nonfinite(x)).tolist() == [False, True, True, True, False, True]
  assert np.asarray(jax.jit(distributions.nonfinite)(x)).tolist() == [
    False,
    True,
    True,
    True,
    False,
    True,
  ]


def test_sampling_config_takes_numpy_scalars_and_normalizes_no_ops():
  cfg = SamplingConfig(np.float64(0.7), np.int64(40), np.float64(0.9))
  assert (cfg.temperature, cfg.top_k, cfg.top_p) == (0.7, 40, 0.9)
  assert type(cfg.temperature) is float and type(cfg.top_k) is int
  assert SamplingConfig(1.0, top_p=1.0) == SamplingConfig(1.0)
  assert hash(SamplingConfig(1.0, top_p=np.float32(1.0))) == hash(SamplingConfig(1.0))
  assert SamplingConfig(1.0, top_k=64).normalized(64) == SamplingConfig(1.0)
  assert SamplingConfig(1.0, top_k=8).normalized(64).top_k == 8
  for bad in (
    dict(temperature=np.float32(np.nan)),
    dict(top_k=np.float32(3.0)),
    dict(top_k=np.bool_(True)),
    dict(top_p=np.float32(1.5)),
  ):
    with pytest.raises(ValueError, match=next(iter(bad))):
      SamplingConfig(**bad)


@pytest.mark.parametrize("vocab", [7, 32128])
def test_checked_variants_equal_the_plain_functions_and_nonfinite(vocab):
  rng = np.random.default_rng(vocab)
  logits = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
  logits[1, 3] = np.nan
  logits[2, 5] = np.inf
  logits[3, :] = -np.inf
  logits[4, ::2] = -np.inf
  logits[5, :] = -3e38  # finite, but below the sanitized stand-in for -inf
  logits[5, 1] = -np.inf
  for batch in (logits[[0, 4]], logits):  # the raw path alone, and the fallback
    x = jnp.asarray(batch)
    tokens, bad = distributions.greedy_tokens_checked(x)
    np.testing.assert_array_equal(tokens, distributions.greedy_tokens(x))
    np.testing.assert_array_equal(bad, distributions.nonfinite(x))
    for cfg in (SamplingConfig(0.7), SamplingConfig(1.0, top_k=3, top_p=0.9)):
      probs, bad = distributions.probabilities_checked(x, cfg)
      np.testing.assert_array_equal(probs, probabilities(x, cfg))
      np.testing.assert_array_equal(bad, distributions.nonfinite(x))


@pytest.mark.parametrize("vocab", [7, 32128])
def test_a_single_nan_logit_is_flagged_in_long_rows_too(vocab):
  """XLA:CPU's vectorized max-reduce skips NaN over long rows (the max of 32,128 zeros
  and one NaN reads 0.0), so `nonfinite` cannot rest on the max alone."""
  x = np.zeros((3, vocab), np.float32)
  x[0, vocab // 2] = np.nan
  x[2, vocab - 1] = np.nan
  want = [True, False, True]
  for fn in (
    distributions.nonfinite,
    lambda x: distributions.greedy_tokens_checked(x)[1],
    lambda x: distributions.probabilities_checked(x, SamplingConfig(1.0))[1],
  ):
    assert np.asarray(fn(jnp.asarray(x))).tolist() == want
    assert np.asarray(jax.jit(fn)(x)).tolist() == want


@pytest.mark.parametrize("vocab", [300, 32128])
def test_a_row_needing_sanitizing_leaves_the_other_rows_tokens_alone(vocab):
  """The portable version (the one TPUs and GPUs run) picks per row between the raw
  argmax and the sanitizing pass. Row 0's largest logit is exactly -1e30 after a -inf:
  sanitized, index 0 (the -inf) ties with it and comes first, alone or beside a NaN
  row, as the CPU kernel gives."""
  check = jax.jit(distributions._greedy_tokens_checked_xla)
  row = np.full((vocab,), -np.inf, np.float32)
  row[1] = -1e30
  finite = np.arange(vocab, dtype=np.float32) % 7
  for neighbour in (np.full((vocab,), np.nan, np.float32), finite):
    alone = check(jnp.asarray(row[None]))[0]
    beside = check(jnp.asarray(np.stack([row, neighbour])))[0]
    assert int(alone[0]) == int(beside[0]) == 0
    assert int(beside[1]) == int(distributions.greedy_tokens(jnp.asarray(neighbour)))
  # A finite row beside a NaN row keeps its own raw argmax.
  tokens = check(jnp.asarray(np.stack([finite, np.full((vocab,), np.nan, np.float32)])))[0]
  assert tokens.tolist() == [6, 0]
