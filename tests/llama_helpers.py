"""Tiny Llama models, ragged prompts and feature drafts shared by the test modules."""

import itertools

from helpers import GREEDY
import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec.distributions import probabilities
from specdec.drafts import eagle
from specdec.models import llama

PAD_ID = 0
# A vocabulary and a continuation short enough that the target's exact distribution
# over all STAT_VOCAB ** NUM_NEW continuations of STAT_PROMPT is enumerable.
STAT_VOCAB, NUM_NEW = 4, 3
STAT_PROMPT = (1, 2)


def tiny_model(seed=0, pad_id=PAD_ID, **overrides):
  cfg = llama.tiny_config(**overrides)
  return llama.Llama(cfg, llama.random_params(cfg, seed), pad_id=pad_id)


def ragged_inputs(batch, length, vocab, lengths, seed=0):
  """int32[batch, length] of ids in [1, vocab), row b right-padded after lengths[b]."""
  x = np.random.default_rng(seed).integers(1, vocab, (batch, length)).astype(np.int32)
  for b, n in enumerate(lengths):
    x[b, n:] = PAD_ID
  return jnp.asarray(x)


def assert_greedy_identity(target, draft, x, gamma, max_new_tokens=16, eos_id=3):
  """Greedy speculative decoding of `x` equals the target's greedy decode, and the
  draft was sometimes rejected (verification did real work)."""
  spec = specdec.speculative_sample(
    target,
    draft,
    x,
    jax.random.key(1),
    gamma=gamma,
    max_new_tokens=max_new_tokens,
    sampling=GREEDY,
    eos_id=eos_id,
  )
  base = specdec.autoregressive_sample(
    target, x, jax.random.key(2), max_new_tokens=max_new_tokens, sampling=GREEDY, eos_id=eos_id
  )
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)
  assert int(spec.stats.accepted.sum()) < int(spec.stats.drafted.sum())


def exact_llama_distribution(model, sampling):
  """{continuation: probability} of NUM_NEW tokens after STAT_PROMPT under `model`
  and `sampling`, by one full forward pass over every continuation."""
  seqs = np.array(list(itertools.product(range(STAT_VOCAB), repeat=NUM_NEW)), np.int32)
  prompt = np.broadcast_to(np.array(STAT_PROMPT, np.int32), (len(seqs), len(STAT_PROMPT)))
  logits = model.forward(jnp.asarray(np.concatenate([prompt, seqs], axis=1)))
  start = len(STAT_PROMPT) - 1
  probs = np.asarray(probabilities(logits[:, start : start + NUM_NEW], sampling), np.float64)
  probs /= probs.sum(axis=-1, keepdims=True)  # float32 rounding, not a model property
  picked = np.take_along_axis(probs, seqs[:, :, None], axis=-1)[..., 0]
  return {tuple(s): float(p) for s, p in zip(seqs.tolist(), picked.prod(axis=1))}


def feature_draft(target, ids=None, seed=3, scale=1.0):
  """A random feature draft for `target` whose head rows are the target's output
  rows of `ids` (all of the vocabulary by default), scaled by `scale`."""
  cfg = target.config
  ids = np.arange(cfg.vocab_size) if ids is None else np.asarray(ids)
  params = jax.tree.map(np.asarray, eagle.init_params(cfg, len(ids), jax.random.key(seed)))
  params["head"] = {"embedding": eagle.output_rows(target, ids) * scale}
  return eagle.FeatureDraft.create(
    cfg, params, target.params["token_embedder"]["embedding"], ids, pad_id=target.pad_id
  )


def target_features(target, tokens):
  """The normed last hidden states [B, L, d] of the full causal forward pass."""
  _, state = llama.Transformer(target.config).apply(
    {"params": target.params},
    jnp.asarray(tokens),
    mutable=["intermediates"],
    capture_intermediates=lambda m, method: m.name == "final_norm",
  )
  return state["intermediates"]["final_norm"]["__call__"][0]
