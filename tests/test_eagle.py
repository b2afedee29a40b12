"""specdec.drafts.eagle: a draft that reads the target's features, and Algorithm 1
driving it (the loop feeds it the target's features of every committed position).

Statistical tests use fixed seeds, so they are deterministic; each states the
false-alarm rate its threshold would have under fresh randomness.
"""

from helpers import CHI2_PVALUE, GREEDY, chi_square_pvalue
import jax
import jax.numpy as jnp
from llama_helpers import (
  NUM_NEW,
  STAT_PROMPT,
  assert_greedy_identity,
  exact_llama_distribution,
  feature_draft,
  ragged_inputs,
  target_features,
  tiny_model,
)
import numpy as np
import pytest

import specdec
from specdec.costs import step_costs
from specdec.distributions import SamplingConfig
from specdec.drafts import eagle

# --------------------------------------------------------------------- the models


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_targets_features_are_the_hidden_states_its_logits_come_from():
  target = tiny_model(0, pad_id=None)
  x = np.random.default_rng(0).integers(1, 64, (2, 9)).astype(np.int32)
  full = target_features(target, x)
  state, prompt_features = target.init_with_features(jnp.asarray(x[:, :5]), 8)
  np.testing.assert_allclose(prompt_features, full[:, :4], rtol=1e-5, atol=1e-5)
  plain = target.init(jnp.asarray(x[:, :5]), 8)
  logits, features, state = target.extend_with_features(state, jnp.asarray(x[:, 4:]))
  expected_logits, _ = target.extend(plain, jnp.asarray(x[:, 4:]))
  np.testing.assert_array_equal(logits, expected_logits)
  np.testing.assert_allclose(features, full[:, 4:], rtol=1e-5, atol=1e-5)
  assert target.feature_size == target.config.hidden_size == features.shape[-1]


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_chunked_extends_give_the_full_pass_over_the_same_features():
  target = tiny_model(0, pad_id=None)
  draft = feature_draft(target, ids=np.arange(0, 64, 2))
  rng = np.random.default_rng(1)
  tokens = rng.integers(1, 64, (2, 10)).astype(np.int32)
  feats = rng.normal(size=(2, 10, 32)).astype(np.float32)
  previous = np.concatenate([np.zeros_like(feats[:, :1]), feats[:, :-1]], axis=1)
  module = eagle.FeatureLayer(target.config, 32)
  embedded = jnp.take(draft.embedding, tokens, axis=0)
  full_logits, full_g = module.apply({"params": draft.params}, embedded, previous)
  state = draft.init(jnp.asarray(tokens[:, :4]), 8, jnp.asarray(feats[:, :3]))
  got_logits, got_g = [], []
  for lo, hi in [(3, 4), (4, 7), (7, 10)]:
    logits, g, state = draft.extend(
      state, jnp.asarray(tokens[:, lo:hi]), jnp.asarray(previous[:, lo:hi])
    )
    got_logits.append(logits)
    got_g.append(g)
  logits, g = jnp.concatenate(got_logits, 1), jnp.concatenate(got_g, 1)
  np.testing.assert_allclose(g, full_g[:, 3:], rtol=1e-5, atol=1e-5)
  # The head covers the even ids only: -inf elsewhere, the full pass's logits there.
  assert np.all(np.isneginf(np.asarray(logits)[..., 1::2]))
  np.testing.assert_allclose(
    np.asarray(logits)[..., 0::2], full_logits[:, 3:], rtol=1e-5, atol=1e-5
  )
  assert int(state.lengths[0]) == 10


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_packed_feature_draft_gives_the_unpacked_logits():
  target = tiny_model(0, pad_id=None)
  draft = feature_draft(target)
  packed = draft.with_packed_weights()
  if packed.packed is None:
    pytest.skip("specdec.backends.cpu is not enabled here")
  x = jnp.asarray(np.random.default_rng(2).integers(1, 64, (1, 6)), jnp.int32)
  feats = jnp.asarray(np.random.default_rng(3).normal(size=(1, 5, 32)), jnp.float32)

  def step(model):
    return model.extend(model.init(x, 4, feats), x[:, -1:], feats[:, -1:])

  (logits, g, _), (expected_logits, expected_g, _) = step(packed), step(draft)
  np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(g, expected_g, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- Algorithm 1 on it


@pytest.mark.parametrize("gamma", [1] + [pytest.param(g, marks=pytest.mark.slow) for g in (3, 6)])
def test_greedy_speculative_with_a_feature_draft_equals_greedy_target(gamma):
  target = tiny_model(0)
  draft = feature_draft(target, ids=np.arange(48))
  x = ragged_inputs(4, 6, target.vocab_size, [6, 1, 4, 5], seed=8)
  assert_greedy_identity(target, draft, x, gamma)


def simulated_accepts(target, draft, prompt, truth, gamma, new):
  """Greedy Algorithm 1 replayed outside the loop, from full forward passes, until
  `new` tokens are committed: each iteration drafts from the target's features of
  every committed position and the draft's own features after, and accepts the
  leading drafts that equal the target's greedy tokens `truth` (which must run at
  least gamma + 1 tokens past `new`). Returns the accepted count of each iteration."""
  seq = np.concatenate([prompt, truth])
  true = np.asarray(target_features(target, seq[None]))[0]
  module = eagle.FeatureLayer(target.config, int(draft.ids.shape[0]))
  ids = np.asarray(draft.ids)
  width = len(seq) + gamma  # every pass is padded to one length: one compilation

  @jax.jit
  def full_pass(tokens, feats, at):
    # Causal: the padding after position `at` changes nothing at or before it.
    embedded = jnp.take(draft.embedding, tokens[None], axis=0)
    logits, g = module.apply({"params": draft.params}, embedded, feats[None])
    return jnp.argmax(logits[0, at]), g[0, at]

  last, accepts = len(prompt) - 1, []  # `last`: index of the newest committed token
  while last - (len(prompt) - 1) < new:
    tokens, feats = list(seq[: last + 1]), [np.zeros_like(true[0])] + list(true[:last])
    drafted = []
    for _ in range(gamma):
      n = len(tokens)
      padded = np.zeros((width,), np.int32)
      padded[:n] = tokens
      padded_feats = np.zeros((width, true.shape[1]), np.float32)
      padded_feats[:n] = np.stack(feats)
      best, g = full_pass(jnp.asarray(padded), jnp.asarray(padded_feats), n - 1)
      drafted.append(int(ids[int(best)]))
      tokens.append(drafted[-1])
      feats.append(np.asarray(g))
    n = 0
    while n < gamma and drafted[n] == seq[last + 1 + n]:
      n += 1
    accepts.append(n)
    last += n + 1
  return accepts


def lean_on_features(draft, weight=4.0):
  """`draft` with fc mapping the feature half onto itself (times `weight`), so that
  what it drafts depends on the features it is fed."""
  fc = np.asarray(draft.params["fc"]["kernel"]).copy()
  width = fc.shape[1]
  fc[width:] = np.eye(width) * weight
  fc[:width] *= 0.1
  return draft.replace(params=dict(draft.params, fc={"kernel": fc}))


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_loop_feeds_the_draft_the_targets_features_of_every_committed_position():
  """Iterations and accepted tokens equal a replay that drafts from the true
  features; a loop that kept stale features (the draft's own for accepted tokens,
  or none) would accept differently. The draft's head is the target's output layer,
  so that it is often right and the counts depend on what it is fed."""
  target = tiny_model(0, pad_id=None)
  draft = lean_on_features(feature_draft(target, seed=4))
  gamma, new = 3, 24
  prompt = np.random.default_rng(5).integers(1, 64, 7).astype(np.int32)
  spec = specdec.speculative_sample(
    target,
    draft,
    jnp.asarray(prompt[None]),
    jax.random.key(0),
    gamma=gamma,
    max_new_tokens=new,
    sampling=GREEDY,
  )
  truth = specdec.autoregressive_sample(
    target,
    jnp.asarray(prompt[None]),
    jax.random.key(0),
    max_new_tokens=new + gamma + 1,
    sampling=GREEDY,
  )
  truth = np.asarray(truth.tokens[0])
  np.testing.assert_array_equal(spec.tokens[0], truth[:new])
  accepts = simulated_accepts(target, draft, prompt, truth, gamma, new)
  assert int(spec.stats.iterations[0]) == len(accepts)
  assert int(spec.stats.accepted[0]) == sum(accepts)
  assert 0 < sum(accepts) < gamma * len(accepts)


STAT_SAMPLES = 40_000


@pytest.mark.parametrize(
  "sampling,gamma", [(SamplingConfig(1.0), 2), (SamplingConfig(0.8, top_k=3), 3)]
)
@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_speculative_sequences_with_a_feature_draft_follow_the_target_law(sampling, gamma):
  """Chi-square over all 4^3 continuations; p < 1e-3 rejects (false alarm 0.1%).
  The draft's head covers 3 of the 4 tokens, so the residual supplies the fourth."""
  dims = dict(
    vocab_size=4,
    hidden_size=16,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
    num_layers=1,
    pad_id=None,
  )
  target = tiny_model(11, **dims)
  head = target.params["logits_dense"]["kernel"] * 2.0
  target = target.replace(params=dict(target.params, logits_dense={"kernel": head}))
  draft = feature_draft(target, ids=[0, 2, 3], seed=12, scale=3.0)
  inputs = jnp.broadcast_to(jnp.array(STAT_PROMPT, jnp.int32), (STAT_SAMPLES, len(STAT_PROMPT)))
  out = specdec.speculative_sample(
    target, draft, inputs, jax.random.key(6), gamma=gamma, max_new_tokens=NUM_NEW, sampling=sampling
  )
  assert 0 < int(out.stats.accepted.sum()) < int(out.stats.drafted.sum())
  dist = exact_llama_distribution(target, sampling)
  assert chi_square_pvalue(np.asarray(out.tokens), dist) > CHI2_PVALUE


# --------------------------------------------------------------------------- misuse


def test_misuse_raises_naming_it():
  target = tiny_model(0)
  draft = feature_draft(target)
  x = ragged_inputs(1, 4, 64, [4])
  plain = tiny_model(
    1, hidden_size=16, num_heads=2, num_kv_heads=1, intermediate_size=32, num_layers=1
  )
  with pytest.raises(ValueError, match="feature_size"):
    specdec.speculative_sample(plain, draft, x, jax.random.key(0), gamma=2, max_new_tokens=4)
  cfg = target.config
  with pytest.raises(ValueError, match="embedding"):
    eagle.FeatureDraft.create(cfg, draft.params, np.zeros((64, 16), np.float32), np.arange(64))
  with pytest.raises(ValueError, match="head"):
    eagle.FeatureDraft.create(cfg, draft.params, draft.embedding, np.arange(10))
  with pytest.raises(ValueError, match="features"):
    draft.init(x, 4, jnp.zeros((1, 2, 32)))
  with pytest.raises(ValueError, match="max_length"):
    draft.init(x, 1000, jnp.zeros((1, 3, 32)))


def test_save_and_load_round_trip_in_bfloat16_and_refuse_malformed_files(tmp_path):
  target = tiny_model(0, tie_word_embeddings=True)
  draft = feature_draft(target, ids=np.arange(40))
  eagle.save(str(tmp_path), draft.params, np.arange(40))
  loaded = eagle.load(str(tmp_path), target)
  for path, value in jax.tree_util.tree_leaves_with_path(
    {k: v for k, v in draft.params.items() if k != "head"}
  ):
    got = loaded.params
    for key in path:
      got = got[key.key]
    np.testing.assert_array_equal(
      got, np.asarray(jnp.asarray(value, jnp.bfloat16).astype(jnp.float32))
    )
  # The head is the target's tied output rows, read from the target, not the file.
  np.testing.assert_array_equal(
    loaded.params["head"]["embedding"],
    np.asarray(target.params["token_embedder"]["embedding"])[:40],
  )
  with pytest.raises(ValueError, match="wrong shapes"):
    eagle.load(
      str(tmp_path),
      tiny_model(0, hidden_size=16, num_heads=2, num_kv_heads=1, tie_word_embeddings=True),
    )
  (tmp_path / eagle.WEIGHTS_FILE).write_bytes(b"not safetensors")
  with pytest.raises(ValueError, match="malformed"):
    eagle.load(str(tmp_path), target)
  with pytest.raises(ValueError, match="has no"):
    eagle.load(str(tmp_path / "missing"), target)


@pytest.mark.slow  # Times compiled calls; runs after the default suite.
def test_step_costs_time_a_feature_draft():
  target = tiny_model(0, pad_id=None)
  draft = feature_draft(target)
  x = jnp.asarray(np.random.default_rng(0).integers(1, 64, (1, 5)), jnp.int32)
  costs = step_costs(target, draft, x, 3, 16, repeats=1, steps=2, rounds=1)
  assert costs["t_q"] > 0 and costs["c"] == costs["t_q"] / costs["t_p1"]
