"""scripts/research/distill_eagle.py's pieces on a tiny target: the features it extracts are
the target's, training lowers its loss, and the draft it saves decodes exactly."""

import jax
import jax.numpy as jnp
from llama_helpers import target_features, tiny_model
import numpy as np
import pytest

import specdec
from specdec.distributions import SamplingConfig
from specdec.drafts import eagle

import distill_eagle

pytestmark = pytest.mark.research


def _sequences(n, seed=0):
  rng = np.random.default_rng(seed)
  return [
    (
      rng.integers(1, 64, rng.integers(2, 6)).astype(np.int32),
      rng.integers(1, 64, rng.integers(3, 9)).astype(np.int32),
    )
    for _ in range(n)
  ]


def test_extracted_features_are_the_targets_hidden_states(tmp_path):
  target = tiny_model(0, tie_word_embeddings=True)
  seqs = _sequences(5)
  path = str(tmp_path / "f.npz")
  distill_eagle.extract(target, 0, seqs, path)
  loaded = distill_eagle.load_features(path)
  for (prompt, response), (tokens, feats, prompt_length) in zip(seqs, loaded):
    np.testing.assert_array_equal(tokens, np.concatenate([prompt, response]))
    assert prompt_length == len(prompt)
    expected = target_features(target, tokens[None])[0]
    np.testing.assert_allclose(feats.astype(np.float32), expected, rtol=2e-3, atol=2e-3)


def test_training_lowers_the_loss_and_saves_a_draft_that_decodes_exactly(tmp_path):
  target = tiny_model(0, tie_word_embeddings=True)
  path = str(tmp_path / "f.npz")
  distill_eagle.extract(target, 0, _sequences(8), path)
  data = distill_eagle.load_features(path)
  settings = distill_eagle.EagleSettings(epochs=12, batch=4, length=16, warmup_steps=2)
  ids = np.arange(0, 64, 2, dtype=np.int32)
  record = distill_eagle.train(target, ids, data, data[:4], str(tmp_path), settings)
  history = record["history"]
  assert len(history) == 13 and all(0 <= h["accuracy"] <= 1 for h in history)
  assert history[-1]["loss"] < history[1]["loss"]
  draft = eagle.load(str(tmp_path / "draft"), target)
  np.testing.assert_array_equal(draft.ids, ids)
  x = jnp.asarray(data[0][0][None, :4])
  greedy = SamplingConfig(temperature=0.0)
  spec = specdec.speculative_sample(
    target, draft, x, jax.random.key(0), gamma=3, max_new_tokens=12, sampling=greedy
  )
  base = specdec.autoregressive_sample(
    target, x, jax.random.key(0), max_new_tokens=12, sampling=greedy
  )
  np.testing.assert_array_equal(spec.tokens, base.tokens)


def test_load_features_reads_each_array_once(tmp_path, monkeypatch):
  """An NpzFile reads (and decompresses) an array on every key access: per-sequence
  access to the features array made a 0.8 GB file cost 0.8 GB per sequence."""
  target = tiny_model(0, tie_word_embeddings=True)
  path = str(tmp_path / "f.npz")
  distill_eagle.extract(target, 0, _sequences(6), path)
  reads = []
  real_load = np.load

  class Counting:
    def __init__(self, z):
      self.z = z

    def __getitem__(self, key):
      reads.append(key)
      return self.z[key]

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.z.close()

  monkeypatch.setattr(distill_eagle.np, "load", lambda p: Counting(real_load(p)))
  data = distill_eagle.load_features(path)
  assert len(data) == 6
  assert sorted(reads) == ["features", "lengths", "prompt_lengths", "tokens"]


def test_settings_and_training_refuse_bad_values_by_flag_name(tmp_path):
  with pytest.raises(ValueError, match="eagle_length"):
    distill_eagle.EagleSettings(length=0)
  target = tiny_model(0, tie_word_embeddings=True)
  path = str(tmp_path / "f.npz")
  distill_eagle.extract(target, 0, _sequences(3), path)
  data = distill_eagle.load_features(path)
  with pytest.raises(ValueError, match="eagle_batch"):
    distill_eagle.train(
      target,
      np.arange(8, dtype=np.int32),
      data,
      data,
      str(tmp_path),
      distill_eagle.EagleSettings(batch=4),
    )
