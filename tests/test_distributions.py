"""Temperature, top-k and top-p give the distributions they promise, in float32."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

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


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, None, None), (0.5, None, None), (2.0, None, None), (1.0, 3, None),
    (0.7, 1, None), (1.0, None, 0.5), (1.0, None, 0.9), (0.8, 4, 0.7), (1.0, 7, 1.0),
])
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
  np.testing.assert_allclose(got, reference(np.asarray(jnp.asarray(LOGITS, dtype),
                                                       np.float64), 1.0), atol=1e-6)


@pytest.mark.parametrize("logits,expected", [
    ([np.nan, 0.0, 0.0], [0.0, 0.5, 0.5]),
    ([-np.inf, -np.inf, -np.inf], [1 / 3, 1 / 3, 1 / 3]),
    ([np.nan, np.nan, np.nan], [1 / 3, 1 / 3, 1 / 3]),
    ([np.inf, 0.0, np.inf], [0.5, 0.0, 0.5]),
])
def test_non_finite_logits_never_give_nan(logits, expected):
  for cfg in (SamplingConfig(1.0), SamplingConfig(1e-8), SamplingConfig(0.5, 2, 0.9)):
    got = np.asarray(probabilities(jnp.asarray(logits, jnp.float32), cfg))
    assert np.isfinite(got).all() and abs(got.sum() - 1) < 1e-6
  np.testing.assert_allclose(probabilities(jnp.asarray(logits, jnp.float32),
                                           SamplingConfig(1.0)), expected, atol=1e-6)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(logits=hnp.arrays(np.float32, st.integers(2, 12),
                         elements=st.floats(-1e4, 1e4, width=32)),
       temperature=st.floats(0.0, 10.0), top_k=st.one_of(st.none(), st.integers(1, 2)),
       top_p=st.one_of(st.none(), st.floats(1e-3, 1.0)))
def test_always_a_distribution(logits, temperature, top_k, top_p):
  got = np.asarray(probabilities(jnp.asarray(logits), SamplingConfig(temperature, top_k,
                                                                     top_p)))
  assert np.isfinite(got).all() and (got >= 0).all()
  assert abs(got.sum() - 1.0) < 1e-5
  # Mass on a maximal logit; XLA's CPU flushes denormals, so logits within float32's
  # smallest normal of the max count as tied with it.
  top = np.flatnonzero(logits >= logits.max() - np.finfo(np.float32).tiny)
  assert got[top].sum() > 0


@pytest.mark.parametrize("kwargs,name", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature="1"), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
])
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
  rows = [rng.integers(-3, 4, vocab).astype(np.float32),   # many ties
          rng.standard_normal(vocab).astype(np.float32),
          np.zeros(vocab, np.float32),
          np.full(vocab, -np.inf, np.float32)]
  last = rng.standard_normal(vocab).astype(np.float32)
  last[-1] = 10.0  # in the last block, which is padded unless 128 divides vocab
  rows.append(last)
  tied = np.where(np.arange(vocab) % 2 == 0, -np.inf, 1.0).astype(np.float32)
  rows.append(tied)
  values = np.stack(rows)
  np.testing.assert_array_equal(first_argmax(jnp.asarray(values)), np.argmax(values, -1))
  np.testing.assert_array_equal(first_argmax(jnp.asarray(values[None])),
                                np.argmax(values, -1)[None])
