"""Unigram and bigram drafts: right counts, proper distributions, exact decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.drafts import ngram

CORPUS = [[3, 4, 3, 5], [4, 3, 1], [3, 4]]
VOCAB = 6


def test_counts_match_a_hand_computed_corpus():
  np.testing.assert_array_equal(ngram.unigram_counts(CORPUS, VOCAB), [0, 1, 0, 4, 3, 1])
  # With the start token 0 before every sequence:
  assert ngram.bigram_counts(CORPUS, VOCAB) == {
    (0, 3): 2,
    (0, 4): 1,
    (3, 4): 2,
    (4, 3): 2,
    (3, 5): 1,
    (3, 1): 1,
  }
  assert ngram.bigram_counts(CORPUS, VOCAB, start_token=None) == {
    (3, 4): 2,
    (4, 3): 2,
    (3, 5): 1,
    (3, 1): 1,
  }


def _probs(model, tokens):
  logits, _ = model.extend(
    model.init(jnp.zeros((1, 1), jnp.int32), 4), jnp.asarray([tokens], jnp.int32)
  )
  return np.exp(np.asarray(logits[0], np.float64))


def test_unigram_probabilities_are_smoothed_frequencies():
  model = ngram.Unigram.from_corpus(CORPUS, VOCAB, smoothing=1.0)
  np.testing.assert_allclose(_probs(model, [2, 5])[0], np.array([1, 2, 1, 5, 4, 2]) / 15, rtol=1e-6)
  np.testing.assert_allclose(_probs(model, [2, 5])[1], _probs(model, [2, 5])[0])


@pytest.mark.parametrize("smoothing,max_successors", [(1.0, 256), (0.5, 2), (0.0, 256)])
def test_bigram_probabilities_sum_to_one_and_match_counts(smoothing, max_successors):
  model = ngram.Bigram.from_corpus(
    CORPUS, VOCAB, smoothing=smoothing, max_successors=max_successors
  )
  probs = _probs(model, list(range(VOCAB)))
  np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-6)
  counts = np.zeros((VOCAB, VOCAB))
  for (a, b), c in ngram.bigram_counts(CORPUS, VOCAB).items():
    counts[a, b] = c
  if max_successors == 2:  # Row 3 keeps its 2 most frequent successors: 4 (2) and 1 (1).
    counts[3, 5] = 0
  expected = counts + smoothing
  totals = expected.sum(axis=1, keepdims=True)
  expected = np.where(totals > 0, expected / np.where(totals > 0, totals, 1), 1 / VOCAB)
  np.testing.assert_allclose(probs, expected, atol=1e-6)


def test_a_full_size_vocabulary_bigram_stays_small():
  corpus = [list(np.random.default_rng(0).integers(0, 32128, 50))]
  model = ngram.Bigram.from_corpus(corpus, 32128)
  assert model.successors.shape == (32128, 1)
  np.testing.assert_allclose(_probs(model, [corpus[0][0]]).sum(), 1.0, rtol=1e-5)


@pytest.mark.parametrize("draft_cls", [ngram.Unigram, ngram.Bigram])
def test_speculative_decoding_with_ngram_drafts_is_greedy_exact(draft_cls):
  vocab = 12
  table = jax.random.normal(jax.random.key(0), (vocab, vocab)) * 2

  target = specdec.CausalLM.from_fn(lambda t, w: w[t], vocab, params=table)
  greedy_path = [0]
  for _ in range(30):
    greedy_path.append(int(jnp.argmax(table[greedy_path[-1]])))
  draft = draft_cls.from_corpus([greedy_path[1:]], vocab)
  inputs = jnp.zeros((3, 1), jnp.int32)
  cfg = specdec.SamplingConfig(temperature=0.0)
  spec = specdec.speculative_sample(
    target, draft, inputs, jax.random.key(1), gamma=4, max_new_tokens=16, sampling=cfg
  )
  base = specdec.autoregressive_sample(
    target, inputs, jax.random.key(1), max_new_tokens=16, sampling=cfg
  )
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  assert int(spec.stats.accepted.sum()) > 0


@pytest.mark.parametrize(
  "call,name",
  [
    (lambda: ngram.Unigram.from_corpus(CORPUS, 0), "vocab_size"),
    (lambda: ngram.Unigram.from_corpus([[7]], 6), "corpus"),
    (lambda: ngram.Unigram.from_corpus([[]], 6), "corpus"),
    (lambda: ngram.Bigram.from_corpus(CORPUS, 6, smoothing=-1), "smoothing"),
    (lambda: ngram.Bigram.from_corpus(CORPUS, 6, max_successors=0), "max_successors"),
  ],
)
def test_bad_arguments_raise_errors_naming_them(call, name):
  with pytest.raises(ValueError, match=name):
    call()
