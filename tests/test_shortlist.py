"""specdec.drafts.shortlist: a draft over a shortlist of the target's vocabulary keeps
Algorithm 1 exact (q is 0 off the list), at SmolLM2's V = 49152 as at a toy size."""

import json

from helpers import EMISSION_RTOL, ConstantLM, emission_probabilities
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import specdec
from specdec import pretrained, verify as verify_lib
from specdec.distributions import SamplingConfig, probabilities
from specdec.drafts import shortlist
from specdec.io.hf import save_hf_llama
from specdec.models import llama

V = 49152  # SmolLM2's vocabulary.
GREEDY = SamplingConfig(temperature=0.0)


def _ids(n, vocab, seed=0):
  return np.random.default_rng(seed).permutation(vocab)[:n].astype(np.int32)


def test_index_map_places_each_id_and_sends_the_rest_to_other():
  ids = np.array([5, 0, 9], np.int32)
  index = shortlist.index_map(ids, 12)
  assert index.dtype == np.int32 and index.shape == (12,)
  assert index[[5, 0, 9]].tolist() == [0, 1, 2]
  assert (np.delete(index, ids) == 3).all()


@pytest.mark.parametrize(
  "ids, match",
  [
    ([], "non-empty"),
    ([[1, 2]], "non-empty"),
    ([1.0, 2.0], "int"),
    ([3, 12], r"in \[0, 12\)"),
    ([-1, 2], r"in \[0, 12\)"),
    ([2, 2], "repeat"),
  ],
)
def test_bad_shortlists_raise(ids, match):
  with pytest.raises(ValueError, match=match):
    shortlist.index_map(np.asarray(ids), 12)


def test_expand_logits_is_minus_inf_off_the_list_and_other_is_dropped():
  ids = jnp.asarray(_ids(8192, V))
  logits = jax.random.normal(jax.random.key(0), (2, 3, 8193)) * 4
  full = shortlist.expand_logits(logits, ids, V)
  assert full.shape == (2, 3, V) and full.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(full[..., ids]), np.asarray(logits[..., :-1]))
  off = np.ones(V, bool)
  off[np.asarray(ids)] = False
  assert np.isneginf(np.asarray(full[..., off])).all()
  for sampling in (
    SamplingConfig(),
    SamplingConfig(0.7, top_k=50),
    SamplingConfig(1.0, top_p=0.9),
    GREEDY,
  ):
    q = np.asarray(probabilities(full, sampling))
    assert np.isfinite(q).all() and (q[..., off] == 0).all()
    np.testing.assert_allclose(q.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
  "sampling",
  [SamplingConfig(), SamplingConfig(0.6, top_k=40), SamplingConfig(1.0, top_p=0.8)],
  ids=["t1", "t0.6_top40", "top_p0.8"],
)
def test_one_step_emits_exactly_p_at_full_vocabulary(sampling):
  """Appendix A.1 with q zero on 40000 of 49152 tokens, p with mass on all of them."""
  rng = np.random.default_rng(1)
  ids = jnp.asarray(_ids(8192, V, seed=1))
  p = probabilities(jnp.asarray(rng.standard_normal(V) * 3, jnp.float32), sampling)
  q = probabilities(
    shortlist.expand_logits(jnp.asarray(rng.standard_normal(8193) * 3, jnp.float32), ids, V),
    sampling,
  )
  assert float(jnp.sum(jnp.where(q == 0, p, 0.0))) > 0.05  # p has mass off the list
  emitted = emission_probabilities(p, q)
  np.testing.assert_allclose(np.asarray(emitted), np.asarray(p), atol=1e-7, rtol=EMISSION_RTOL)


def _shortlist_law_pvalue():
  """2^14 tokens at V = 49152 from Algorithm 1 itself; the target puts 0.4 of its mass
  off the draft's list. Chi-square over the 12 likeliest tokens, the rest of the list
  and the rest off it."""
  rng = np.random.default_rng(2)
  ids = _ids(4096, V, seed=2)
  off = np.setdiff1d(np.arange(V), ids)
  p = np.full(V, 0.0)
  p[ids] = rng.dirichlet(np.ones(len(ids)) * 0.05) * 0.6
  p[off] = rng.dirichlet(np.ones(len(off)) * 0.05) * 0.4
  target = ConstantLM(logits=jnp.asarray(np.log(np.maximum(p, 1e-30)), jnp.float32), vocab_size=V)
  inner_logits = np.concatenate(
    [rng.standard_normal(len(ids)) * 2 + np.log(p[ids] + 1e-6), [5.0]]
  )  # OTHER: large, and dropped
  draft = ConstantLM(
    logits=shortlist.expand_logits(jnp.asarray(inner_logits, jnp.float32), jnp.asarray(ids), V),
    vocab_size=V,
  )
  out = specdec.speculative_sample(
    target, draft, jnp.zeros((256, 1), jnp.int32), jax.random.key(3), gamma=3, max_new_tokens=64
  )
  tokens = np.asarray(out.tokens).ravel()
  assert int(out.stats.accepted.sum()) > 0 and int(out.stats.drafted.sum()) > 0
  law = probabilities(target.logits, SamplingConfig())
  law = np.asarray(law, np.float64) / float(np.sum(np.asarray(law, np.float64)))
  top = np.argsort(-law)[:12]
  on_list = np.zeros(V, bool)
  on_list[ids] = True
  rest = np.ones(V, bool)
  rest[top] = False
  bins = [tokens == t for t in top] + [
    rest[tokens] & on_list[tokens],
    rest[tokens] & ~on_list[tokens],
  ]
  observed = np.array([b.sum() for b in bins])
  expected = (
    np.array([law[t] for t in top] + [law[rest & on_list].sum(), law[rest & ~on_list].sum()])
    * tokens.size
  )
  assert observed.sum() == tokens.size
  return scipy_stats.chisquare(observed, expected).pvalue


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_speculative_tokens_follow_the_target_law_with_a_shortlist_draft():
  assert _shortlist_law_pvalue() > 1e-3  # false alarm 1e-3, fixed seed


@pytest.mark.slow  # ~10 s: the default suite keeps the law test itself
def test_negative_control_a_residual_without_max_p_minus_q_is_detected(monkeypatch):
  # Resampling rejections from p itself under-emits the tokens off the list.
  monkeypatch.setattr(verify_lib, "residual", lambda p, q, lenience=1.0: p)
  jax.clear_caches()  # the sampler compiled with the real residual must retrace
  try:
    pvalue = _shortlist_law_pvalue()
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  assert pvalue < 1e-3


# ------------------------------------------------------------------ with a Llama
VOCAB, N = 64, 20


def _pair(pad_id=None):
  target = llama.Llama(
    llama.tiny_config(vocab_size=VOCAB),
    llama.random_params(llama.tiny_config(vocab_size=VOCAB), 0),
    pad_id=pad_id,
  )
  cfg = llama.tiny_config(vocab_size=N + 1, hidden_size=16, num_heads=2, num_kv_heads=1)
  ids = _ids(N, VOCAB, seed=4)
  if pad_id is not None and pad_id not in ids:
    ids[0] = pad_id
  inner = llama.Llama(cfg, llama.random_params(cfg, 1))
  return target, shortlist.Shortlist.create(inner, ids, VOCAB, pad_id=pad_id), ids


def test_extend_gives_the_inner_logits_on_the_list_from_mapped_inputs():
  _, draft, ids = _pair()
  inputs = jnp.asarray([[3, 17, 40, 2, 63]], jnp.int32)
  index = shortlist.index_map(ids, VOCAB)
  state = draft.init(inputs, 8)
  logits, state = draft.extend(state, jnp.asarray([[9, 1]], jnp.int32))
  inner_state = draft.inner.init(jnp.asarray(index[np.asarray(inputs)]), 8)
  inner_logits, _ = draft.inner.extend(inner_state, jnp.asarray(index[[[9, 1]]]))
  np.testing.assert_array_equal(np.asarray(logits[..., ids]), np.asarray(inner_logits[..., :N]))
  assert np.isneginf(np.asarray(logits[..., np.setdiff1d(np.arange(VOCAB), ids)])).all()
  assert draft.vocab_size == VOCAB and draft.shortlist_size == N
  assert int(draft.lengths(state)[0]) == 6
  assert int(draft.start_tokens(inputs)[0]) == 63


@pytest.mark.parametrize("gamma", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_greedy_speculative_with_a_shortlist_draft_equals_greedy_target(gamma):
  pad = 0
  target, draft, _ = _pair(pad_id=pad)
  inputs = jnp.asarray([[5, 9, 33, 7], [12, 50, pad, pad]], jnp.int32)
  kwargs = dict(max_new_tokens=16, sampling=GREEDY)
  base = specdec.autoregressive_sample(target, inputs, jax.random.key(0), **kwargs)
  out = specdec.speculative_sample(target, draft, inputs, jax.random.key(1), gamma=gamma, **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
  assert draft.start_tokens(inputs).tolist() == target.start_tokens(inputs).tolist()


def test_shortlist_misuse_raises_naming_it():
  target, draft, ids = _pair()
  with pytest.raises(ValueError, match="needs a model over 11 ids"):
    shortlist.Shortlist.create(draft.inner, ids[:10], VOCAB)
  off = int(np.setdiff1d(np.arange(VOCAB), ids)[0])
  with pytest.raises(ValueError, match=f"pad_id {off} must be a shortlist id"):
    shortlist.Shortlist.create(draft.inner, ids, VOCAB, pad_id=off)
  with pytest.raises(ValueError, match="tokens holds token ids outside"):
    draft.extend(draft.init(jnp.asarray([[1, 2]]), 4), jnp.asarray([[VOCAB]]))
  wider = shortlist.Shortlist.create(draft.inner, ids, VOCAB + 1)
  with pytest.raises(ValueError, match="vocab_size"):
    specdec.speculative_sample(
      target, wider, jnp.asarray([[1, 2]]), jax.random.key(0), gamma=2, max_new_tokens=4
    )


def test_load_lm_draft_reads_a_shortlist_directory(tmp_path):
  _, draft, ids = _pair(pad_id=int(_ids(N, VOCAB, seed=4)[3]))
  save_hf_llama(tmp_path, draft.inner.config, draft.inner.params)
  with pytest.raises(ValueError, match=r"vocabulary \(21\) is not the target's \(64\)"):
    pretrained.load_lm_draft(tmp_path, VOCAB)
  (tmp_path / "shortlist.json").write_text(json.dumps({"ids": ids.tolist()}))
  loaded = pretrained.load_lm_draft(tmp_path, VOCAB, pad_id=draft.pad_id)
  assert isinstance(loaded, shortlist.Shortlist) and loaded.pad_id == draft.pad_id
  np.testing.assert_array_equal(np.asarray(loaded.ids), ids)
  inputs = jnp.asarray([[4, 8, 15]], jnp.int32)
  a, _ = draft.extend(draft.init(inputs, 4), jnp.asarray([[16]]))
  b, _ = loaded.extend(loaded.init(inputs, 4), jnp.asarray([[16]]))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  for text, match in (
    ('{"ids": [1, 2', "malformed"),
    ('{"idz": []}', "malformed"),
    ('{"ids": ["a"]}', "malformed"),
    (json.dumps({"ids": [VOCAB] + ids.tolist()[1:]}), r"in \[0, 64\)"),
  ):
    (tmp_path / "shortlist.json").write_text(text)
    with pytest.raises(ValueError, match=match) as e:
      pretrained.load_lm_draft(tmp_path, VOCAB)
    assert "shortlist.json" in str(e.value)


# ----------------------------------------------------------------------------- the
# greedy draft step over the list alone (`ShortlistLogits`), and T5's output shortlist.


class _Hidden:
  """A DecodeModel that hides its model's `ShortlistLogits` capability."""

  def __init__(self, model):
    self._m = model
    self.vocab_size = model.vocab_size

  def __getattr__(self, name):
    if name in ("extend_shortlist", "shortlist_ids"):
      raise AttributeError(name)
    return getattr(self._m, name)


def _t5_pair(packed: bool):
  from t5_helpers import tiny_model

  target = tiny_model(seed=1, vocab_size=VOCAB)
  full = tiny_model(seed=2, vocab_size=VOCAB, emb_dim=16, num_decoder_layers=1)
  if packed:
    target, full = target.with_packed_weights(), full.with_packed_weights()
  ids = np.sort(_ids(N, VOCAB, seed=5))
  ids[0] = 1  # EOS on the list, as in a shipped list
  ids = np.unique(ids)
  return target, full, shortlist.t5_output_shortlist(full, ids), ids


@pytest.mark.slow  # ~5 s; the default suite stays under 6 minutes
@pytest.mark.parametrize("packed", [False, True])
def test_t5_output_shortlist_gives_the_full_drafts_logits_on_the_list(packed):
  _, full, draft, ids = _t5_pair(packed)
  assert isinstance(draft, specdec.models.base.ShortlistLogits)
  assert draft.inner.config.output_vocab_size == len(ids)
  assert draft.inner.params["decoder"]["logits_dense"]["kernel"].shape[1] == len(ids)
  inputs = jnp.asarray([[3, 17, 40, 2, 1]], jnp.int32)
  chunk = jnp.asarray([[0, 9, 33]], jnp.int32)
  want, _ = full.extend(full.init(inputs, 8), chunk)
  got, state = draft.extend(draft.init(inputs, 8), chunk)
  compact, _ = draft.extend_shortlist(draft.init(inputs, 8), chunk)
  np.testing.assert_allclose(
    np.asarray(got[..., ids]), np.asarray(want[..., ids]), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_array_equal(np.asarray(compact), np.asarray(got[..., ids]))
  assert np.isneginf(np.asarray(got[..., np.setdiff1d(np.arange(VOCAB), ids)])).all()
  assert int(draft.lengths(state)[0]) == 3 and draft.vocab_size == VOCAB


def test_shortlist_extend_shortlist_is_extend_on_the_list():
  _, draft, ids = _pair()
  state = draft.init(jnp.asarray([[3, 17, 40]], jnp.int32), 8)
  chunk = jnp.asarray([[9, 1]], jnp.int32)
  full, _ = draft.extend(state, chunk)
  compact, _ = draft.extend_shortlist(state, chunk)
  assert compact.shape == (1, 2, N) and compact.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(compact), np.asarray(full[..., ids]))
  np.testing.assert_array_equal(np.asarray(draft.shortlist_ids), ids)


@pytest.mark.slow  # ~6-9 s each; the default suite stays under 6 minutes
@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_greedy_draft_steps_never_write_the_full_vocabulary(kind, monkeypatch):
  """At temperature 0 a shortlist draft's steps take their argmax over the list
  (`ShortlistLogits`); the drafted tokens are those of the V-wide logits' argmax, and
  the decode is still the target's greedy one. Fails if a greedy draft step expands
  its logits into V (the path before the capability)."""
  from specdec.drafts import base as drafts_base

  if kind == "llama":
    target, draft, _ = _pair(pad_id=0)
    inputs = jnp.asarray([[5, 9, 33, 7], [12, 50, 0, 0]], jnp.int32)
  else:
    target, _, draft, _ = _t5_pair(packed=False)
    inputs = jnp.asarray([[5, 9, 33, 7], [12, 50, 6, 0]], jnp.int32)
  # The drafted tokens, with and without the capability (V-wide logits, argmax).
  proposer, hidden = drafts_base.ModelProposer(draft), drafts_base.ModelProposer(_Hidden(draft))
  keys = jax.random.split(jax.random.key(0), 2 * 3).reshape(2, 3)
  xs = []
  for p in (proposer, hidden):
    state = p.start(inputs, 16, 3, False)
    xs.append(np.asarray(p.propose(state, keys, GREEDY, 3)[0]))
  np.testing.assert_array_equal(xs[0], xs[1])

  def no_expansion(*args, **kwargs):
    raise AssertionError("a greedy draft step wrote its logits into V")

  monkeypatch.setattr(shortlist, "expand_logits", no_expansion)
  kwargs = dict(max_new_tokens=11, sampling=GREEDY)  # shapes of this test alone
  out = specdec.speculative_sample(target, draft, inputs, jax.random.key(1), gamma=3, **kwargs)
  base = specdec.autoregressive_sample(target, inputs, jax.random.key(0), **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))


@pytest.mark.slow  # ~4 s (three tiny T5 models)
def test_t5_output_shortlist_misuse_raises_naming_it():
  from specdec.models import t5

  from t5_helpers import tiny_model

  with pytest.raises(ValueError, match="untied"):
    shortlist.t5_output_shortlist(tiny_model("1.0", vocab_size=VOCAB), [1, 2])
  with pytest.raises(ValueError, match="must not repeat"):
    shortlist.t5_output_shortlist(tiny_model(vocab_size=VOCAB), [1, 1])
  with pytest.raises(ValueError, match="output_vocab_size"):
    t5.check_config(t5.tiny_config(vocab_size=VOCAB, output_vocab_size=VOCAB + 1))
  with pytest.raises(ValueError, match="untied output layer"):
    t5.check_config(t5.tiny_config("1.0", vocab_size=VOCAB, output_vocab_size=8))
  model = tiny_model(vocab_size=VOCAB)
  with pytest.raises(ValueError, match="the shortlist has 3"):
    shortlist.OutputShortlist.create(model, [1, 2, 3]).extend_shortlist(
      model.init(jnp.asarray([[4, 1]]), 4), jnp.asarray([[0]])
    )
