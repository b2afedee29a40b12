"""specdec.drafts.lookup: a draft mixed with a context n-gram proposal keeps Algorithm 1
exact (the proposal depends on the whole history, so every rewind must be right), at
SmolLM2's V = 49152 as at a toy size; the proposal is the documented one."""

from helpers import (
  CHI2_PVALUE,
  EMISSION_RTOL,
  GREEDY,
  NUM_NEW,
  bigram_model,
  chi_square_pvalue,
  context_model,
  emission_probabilities,
  exact_sequence_distribution,
  toy_tables,
)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec import sample as sample_lib, verify as verify_lib
from specdec.distributions import SamplingConfig, probabilities
from specdec.drafts import lookup, shortlist
from specdec.models import llama

V = 49152  # SmolLM2's vocabulary.


def reference_proposal(context, min_ngram, max_ngram):
  """The module doc's rule in plain Python: (token, found)."""
  for n in range(max_ngram, min_ngram - 1, -1):
    if len(context) < n + 1:
      continue
    suffix = context[-n:]
    for s in range(len(context) - n - 1, -1, -1):
      if context[s : s + n] == suffix:
        return context[s + n], True
  return 0, False


@pytest.mark.parametrize("min_ngram, max_ngram, vocab", [(1, 1, 3), (2, 4, 4), (3, 3, 2)])
def test_proposals_match_the_plain_rule_on_random_histories(min_ngram, max_ngram, vocab):
  rng = np.random.default_rng(min_ngram * 10 + max_ngram)
  history = rng.integers(0, vocab, (6, 24)).astype(np.int32)
  ends = rng.integers(0, 25, (6, 5)).astype(np.int32)
  tokens, found = lookup.lookup_proposals(
    jnp.asarray(history), jnp.asarray(ends), min_ngram, max_ngram
  )
  hits = 0
  for b in range(6):
    for j in range(5):
      want = reference_proposal(history[b, : ends[b, j]].tolist(), min_ngram, max_ngram)
      assert (int(tokens[b, j]), bool(found[b, j])) == want, (b, j)
      hits += want[1]
  assert 0 < hits < 30  # both outcomes occur: the comparison is not vacuous


def test_mixture_is_weight_on_the_proposal_plus_the_rest_on_q():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.standard_normal((2, V)) * 3, jnp.float32)
  logits = logits.at[1, :40000].set(-jnp.inf)  # a shortlist draft's -inf
  tokens = jnp.asarray([7, 3], jnp.int32)  # row 1 proposes a token q gives 0
  mixed = lookup.mix_logits(logits, tokens, jnp.asarray([True, True]), 0.8)
  q = np.asarray(probabilities(logits, SamplingConfig()), np.float64)
  got = np.asarray(probabilities(mixed, SamplingConfig()), np.float64)
  want = 0.2 * q
  want[[0, 1], [7, 3]] += 0.8
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert np.isfinite(np.asarray(mixed[0])).all()
  assert np.asarray(jnp.argmax(mixed, -1)).tolist() == [7, 3]  # greedy takes it
  unchanged = lookup.mix_logits(logits, tokens, jnp.asarray([False, False]), 0.8)
  np.testing.assert_array_equal(np.asarray(unchanged), np.asarray(logits))
  one_hot = probabilities(
    lookup.mix_logits(logits, tokens, jnp.asarray([True, True]), 1.0), SamplingConfig()
  )
  want = np.zeros((2, V), np.float32)
  want[[0, 1], [7, 3]] = 1.0
  np.testing.assert_array_equal(np.asarray(one_hot), want)


@pytest.mark.parametrize(
  "sampling",
  [SamplingConfig(), SamplingConfig(0.6, top_k=40), SamplingConfig(1.0, top_p=0.8)],
  ids=["t1", "t0.6_top40", "top_p0.8"],
)
def test_one_step_emits_exactly_p_at_full_vocabulary(sampling):
  rng = np.random.default_rng(1)
  p = probabilities(jnp.asarray(rng.standard_normal(V) * 3, jnp.float32), sampling)
  mixed = lookup.mix_logits(
    jnp.asarray(rng.standard_normal(V) * 3, jnp.float32), jnp.asarray(123), jnp.asarray(True), 0.7
  )
  q = probabilities(mixed, sampling)
  emitted = emission_probabilities(p, q)
  np.testing.assert_allclose(np.asarray(emitted), np.asarray(p), atol=1e-7, rtol=EMISSION_RTOL)


# --------------------------------------------------------- whole sequences, statistically
SEQUENCES = 100_000
PROMPT = [2, 0, 3, 1]  # the target's law depends on the last token only (1)


@pytest.mark.parametrize(
  "sampling, gamma, min_ngram, max_ngram, weight",
  [
    (SamplingConfig(1.0), 3, 1, 2, 0.7),
    (SamplingConfig(0.6, top_k=3), 2, 1, 1, 1.0),
    (SamplingConfig(1.0, top_p=0.8), 4, 1, 3, 0.5),
  ],
  ids=["t1", "t0.6_top3_onehot", "top_p0.8"],
)
@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_speculative_sequences_follow_the_target_distribution(
  sampling, gamma, min_ngram, max_ngram, weight
):
  target_table, draft_table = toy_tables(seed=7)
  draft = lookup.ContextLookup.create(bigram_model(draft_table), weight, min_ngram, max_ngram)
  inputs = jnp.tile(jnp.asarray([PROMPT], jnp.int32), (SEQUENCES, 1))
  out = specdec.speculative_sample(
    bigram_model(target_table),
    draft,
    inputs,
    jax.random.key(11),
    gamma=gamma,
    max_new_tokens=NUM_NEW,
    sampling=sampling,
  )
  dist = exact_sequence_distribution(target_table, PROMPT[-1], NUM_NEW, sampling, None)
  assert 0 < int(out.stats.accepted.sum()) < int(out.stats.drafted.sum())
  assert chi_square_pvalue(np.asarray(out.tokens), dist) > CHI2_PVALUE  # 0.1% alarm


@pytest.mark.slow  # ~10 s: the law test above stays in the default suite
def test_negative_control_accepting_every_draft_is_detected(monkeypatch):
  """The law test must reject a sampler that skips the acceptance test with this
  draft (its proposals follow the history, not the target)."""
  target_table, draft_table = toy_tables(seed=7)
  draft = lookup.ContextLookup.create(bigram_model(draft_table), 0.7, 1, 2)
  inputs = jnp.tile(jnp.asarray([PROMPT], jnp.int32), (SEQUENCES, 1))
  sampling = SamplingConfig(1.0)
  dist = exact_sequence_distribution(target_table, PROMPT[-1], NUM_NEW, sampling, None)
  monkeypatch.setattr(
    verify_lib, "accepts", lambda r, p_x, q_x, lenience=1.0: jnp.ones_like(r, bool)
  )
  jax.clear_caches()
  try:
    out = specdec.speculative_sample(
      bigram_model(target_table),
      draft,
      inputs,
      jax.random.key(11),
      gamma=3,
      max_new_tokens=NUM_NEW,
      sampling=sampling,
    )
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  assert chi_square_pvalue(np.asarray(out.tokens), dist) < CHI2_PVALUE


# ------------------------------------------------------------------ with a Llama
VOCAB, N = 64, 20


def _pair(pad_id=0):
  cfg = llama.tiny_config(vocab_size=VOCAB)
  target = llama.Llama(cfg, llama.random_params(cfg, 0), pad_id=pad_id)
  inner_cfg = llama.tiny_config(vocab_size=N + 1, hidden_size=16, num_heads=2, num_kv_heads=1)
  ids = np.random.default_rng(4).permutation(VOCAB)[:N].astype(np.int32)
  if pad_id not in ids:
    ids[0] = pad_id
  inner = llama.Llama(inner_cfg, llama.random_params(inner_cfg, 1))
  draft = shortlist.Shortlist.create(inner, ids, VOCAB, pad_id=pad_id)
  return target, lookup.ContextLookup.create(draft, 0.8, 1, 3)


@pytest.mark.parametrize("gamma", [1] + [pytest.param(g, marks=pytest.mark.slow) for g in (3, 6)])
def test_greedy_speculative_with_a_lookup_draft_equals_greedy_target(gamma):
  target, draft = _pair()
  inputs = jnp.asarray([[5, 9, 33, 7, 5, 9], [12, 50, 12, 0, 0, 0]], jnp.int32)
  kwargs = dict(max_new_tokens=24, sampling=GREEDY)
  base = specdec.autoregressive_sample(target, inputs, jax.random.key(0), **kwargs)
  out = specdec.speculative_sample(target, draft, inputs, jax.random.key(1), gamma=gamma, **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
  assert int(out.stats.accepted.sum()) > 0


def test_extend_proposes_from_prompt_and_fed_tokens_and_rewind_forgets_them():
  _, draft = _pair()
  # Jitted, as the samplers call them (one compile each, not one per operation).
  init = jax.jit(lambda model, x: model.init(x, 8))
  extend, rewind = jax.jit(lambda m, s, t: m.extend(s, t)), jax.jit(lambda m, s, n: m.rewind(s, n))
  inputs = jnp.asarray([[4, 8, 15, 16, 23, 4, 8, 0]], jnp.int32)  # padded: 7 tokens
  state = init(draft, inputs)
  assert int(draft.lengths(state)[0]) == 6  # the prompt minus its last token
  logits, state = extend(draft, state, jnp.asarray([[8, 15]]))
  # After [..., 4, 8] the last occurrence of "4 8" was followed by 15; after
  # [..., 4, 8, 15] the 3-gram "4 8 15" recurs and was followed by 16.
  assert np.asarray(jnp.argmax(logits[0], -1)).tolist() == [15, 16]
  state = rewind(draft, state, jnp.asarray([7]))
  logits, _ = extend(draft, state, jnp.asarray([[42]]))
  inner = draft.inner
  inner_state = rewind(
    inner, extend(inner, init(inner, inputs), jnp.asarray([[8, 15]]))[1], jnp.asarray([7])
  )
  inner_logits, _ = extend(inner, inner_state, jnp.asarray([[42]]))
  # "8 42" never occurred, nor does "42": the inner draft's logits, unchanged.
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(inner_logits))


def test_same_shapes_compile_once_and_misuse_raises():
  target = context_model(jax.random.key(0), 16)
  draft = lookup.ContextLookup.create(context_model(jax.random.key(1), 16))
  kwargs = dict(gamma=3, max_new_tokens=6, sampling=SamplingConfig(0.9), eos_id=2)
  inputs = jnp.ones((2, 3), jnp.int32)
  specdec.speculative_sample(target, draft, inputs, jax.random.key(0), **kwargs)
  before = sample_lib._speculative_jit._cache_size()
  specdec.speculative_sample(target, draft, inputs + 1, jax.random.key(1), **kwargs)
  assert sample_lib._speculative_jit._cache_size() == before
  for args, match in [
    ((0.0,), "weight"),
    ((1.5,), "weight"),
    ((0.5, 0), "min_ngram"),
    ((0.5, 3, 2), "must not exceed"),
    ((0.5, 1, 17), "max_ngram"),
  ]:
    with pytest.raises(ValueError, match=match):
      lookup.ContextLookup.create(draft.inner, *args)
  with pytest.raises(ValueError, match="tokens"):
    draft.extend(draft.init(inputs, 4), jnp.asarray([[16], [1]]))


def test_pretrained_lookup_names_and_settings():
  from specdec import pretrained

  assert pretrained.split_lookup("draft+lookup") == ("draft", True)
  assert pretrained.split_lookup("draft") == ("draft", False)
  card = pretrained.pair_info("smollm2_135m_instruct")["context_lookup"]
  settings = pretrained.lookup_settings("smollm2_135m_instruct")
  assert settings == {k: card[k] for k in ("weight", "min_ngram", "max_ngram")}
  assert set(card["best_gamma"]) == {"0", "1"}
  _, inner = _pair()
  wrapped = pretrained.with_context_lookup("smollm2_135m_instruct", inner.inner)
  assert (wrapped.weight, wrapped.min_ngram, wrapped.max_ngram) == (
    settings["weight"],
    settings["min_ngram"],
    settings["max_ngram"],
  )
  with pytest.raises(ValueError, match=r"\+lookup"):
    pretrained.lm_draft_path("smollm2_135m_instruct", "nope")
