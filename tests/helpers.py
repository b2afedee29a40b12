"""Toy models and the statistics of Algorithm 1's tests, shared by the test modules."""

import itertools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import specdec
from specdec import verify as verify_lib
from specdec.distributions import SamplingConfig, probabilities

GREEDY = SamplingConfig(temperature=0.0)
# The toy tables' vocabulary and the new tokens of their enumerable sequences.
VOCAB, NUM_NEW = 5, 4
# Chi-square tests reject at p < 1e-3: a false-alarm rate of 0.1% per test.
CHI2_PVALUE = 1e-3
# The default suite stays under 6 minutes; .ci/run runs the slow marker after it.
SLOW = pytest.mark.slow


def first_in_default(n, cases):
  """`cases` for `parametrize` (a tuple per case for several names): the first `n` in
  the default suite, the rest marked slow (.ci/run runs them after it). The default
  suite keeps one of each kind of case within its 6 minutes; CI runs them all."""
  cases = list(cases)
  slow = [pytest.param(*c if isinstance(c, tuple) else (c,), marks=SLOW) for c in cases[n:]]
  return cases[:n] + slow


def _lookup(tokens, table):
  return table[tokens]


def bigram_model(table, max_length=None):
  """A CausalLM whose next-token logits depend on the last token only."""
  table = jnp.asarray(table, jnp.float32)
  return specdec.CausalLM.from_fn(_lookup, table.shape[-1], max_length=max_length, params=table)


def running_mean_logits(tokens, p):
  """`context_model`'s logits [B, T, V] of tokens [B, T] under parameters `p`."""
  e = p["emb"][tokens]
  mean = jnp.cumsum(e, axis=1) / jnp.arange(1, tokens.shape[1] + 1)[None, :, None]
  return 3.0 * jnp.tanh(mean) @ p["w"] + p["bigram"][tokens]


def context_model(key, vocab, dim=8):
  """A CausalLM whose logits depend on the whole prefix (causal running mean)."""
  k1, k2, k3 = jax.random.split(key, 3)
  params = dict(
    emb=jax.random.normal(k1, (vocab, dim)),
    w=jax.random.normal(k2, (dim, vocab)),
    bigram=jax.random.normal(k3, (vocab, vocab)),
  )
  return specdec.CausalLM.from_fn(running_mean_logits, vocab, params=params)


# emission_probabilities adds two float32 sums over the vocabulary (the rejected mass
# here and the residual's normaliser in the library), whose order XLA:CPU picks by its
# thread count: the emitted mass of a large probability can then differ from p by a
# few float32 ulps (2 ulps of 0.535 seen at V = 49152 on one core), whatever the law.
EMISSION_RTOL = 4 * float(np.finfo(np.float32).eps)


def emission_probabilities(p, q):
  """P(the step emits v) in closed form, from the step's own pieces.

  A draft x ~ q is kept with probability P(r q(x) < p(x)) for r ~ U[0, 1), i.e.
  min(1, p(x)/q(x)); otherwise the step emits from `residual(p, q)`.
  """
  keep = jnp.where(q > 0, jnp.clip(p / jnp.where(q > 0, q, 1.0), 0.0, 1.0), 0.0)
  rejected_mass = jnp.sum(q * (1.0 - keep))
  return q * keep + rejected_mass * verify_lib.residual(p, q)


def exact_sequence_distribution(table, prompt_token, num_new, sampling, eos_id):
  """{sequence (padded with 0 after EOS): probability} under the target alone."""
  probs = np.asarray(probabilities(jnp.asarray(table, jnp.float32), sampling), np.float64)
  probs /= probs.sum(axis=-1, keepdims=True)  # float32 rounding, not a model property
  dist = {}
  vocab = table.shape[0]
  for seq in itertools.product(range(vocab), repeat=num_new):
    prob, prev, out = 1.0, prompt_token, []
    for tok in seq:
      prob *= probs[prev, tok]
      out.append(tok)
      prev = tok
      if eos_id is not None and tok == eos_id:
        break
    key = tuple(out + [0] * (num_new - len(out)))
    if len(out) == num_new or all(s == 0 for s in seq[len(out) :]):
      dist[key] = dist.get(key, 0.0) + prob
  return dist


def chi_square_pvalue(samples, dist):
  """Chi-square goodness of fit, pooling outcomes expected fewer than 5 times."""
  total = samples.shape[0]
  counts = {}
  for row in map(tuple, samples.tolist()):
    counts[row] = counts.get(row, 0) + 1
  unknown = sum(c for k, c in counts.items() if k not in dist)
  assert unknown == 0, f"{unknown} samples outside the target's support"
  observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
  for seq, prob in dist.items():
    if prob * total >= 5:
      observed.append(counts.get(seq, 0))
      expected.append(prob * total)
    else:
      pooled_obs += counts.get(seq, 0)
      pooled_exp += prob * total
  if pooled_exp > 0:
    observed.append(pooled_obs)
    expected.append(pooled_exp)
  expected = np.asarray(expected) * (total / np.sum(expected))
  return scipy_stats.chisquare(observed, expected).pvalue


def toy_tables(seed):
  rng = np.random.default_rng(seed)
  target = rng.standard_normal((VOCAB, VOCAB)) * 1.5
  draft = target + rng.standard_normal((VOCAB, VOCAB)) * 1.5
  return target.astype(np.float32), draft.astype(np.float32)


@flax.struct.dataclass
class ConstantLM:
  """A context-free DecodeModel: the same logits at every position, at no cost."""

  logits: jax.Array
  vocab_size: int = flax.struct.field(pytree_node=False)

  def init(self, inputs, max_length):
    return jnp.zeros((inputs.shape[0],), jnp.int32)

  def start_tokens(self, inputs):
    return inputs[:, -1].astype(jnp.int32)

  def extend(self, state, tokens):
    logits = jnp.broadcast_to(self.logits, tokens.shape + (self.vocab_size,))
    return logits, state + tokens.shape[1]

  def rewind(self, state, lengths):
    return jnp.minimum(state, lengths)

  def lengths(self, state):
    return state


def normalize(x):
  x = jnp.asarray(x, jnp.float32)
  return x / jnp.sum(x)


def step_cases():
  rng = np.random.default_rng(0)
  v = 7
  cases = {}
  for i in range(5):
    cases[f"random{i}"] = (
      normalize(rng.dirichlet(np.ones(v))),
      normalize(rng.dirichlet(np.ones(v) * 0.3)),
    )
  p = normalize(rng.dirichlet(np.ones(v)))
  cases["p_equals_q"] = (p, p)
  cases["disjoint_supports"] = (normalize([1, 2, 3, 0, 0, 0, 0]), normalize([0, 0, 0, 1, 1, 1, 1]))
  cases["q_zero_where_p_has_mass"] = (
    normalize([1, 1, 1, 1, 1, 1, 1]),
    normalize([0, 5, 0, 1, 0, 2, 0]),
  )
  cases["one_hot_same"] = (jax.nn.one_hot(3, v), jax.nn.one_hot(3, v))
  cases["one_hot_different"] = (jax.nn.one_hot(3, v), jax.nn.one_hot(5, v))
  cases["near_uniform"] = (
    normalize(1 + 1e-6 * rng.standard_normal(v)),
    normalize(1 + 1e-6 * rng.standard_normal(v)),
  )
  logits_p = jnp.asarray(rng.standard_normal(v) * 3, jnp.bfloat16)
  logits_q = jnp.asarray(rng.standard_normal(v) * 3, jnp.bfloat16)
  cases["bf16_logits"] = (
    probabilities(logits_p, SamplingConfig()),
    probabilities(logits_q, SamplingConfig()),
  )
  cases["bf16_top_k"] = (
    probabilities(logits_p, SamplingConfig(0.5, top_k=3)),
    probabilities(logits_q, SamplingConfig(0.5, top_k=3)),
  )
  return cases
