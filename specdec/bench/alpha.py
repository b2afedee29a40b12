"""alpha, the paper's expected acceptance rate E[beta] (Section 3.1): pooled over the
positions a speculative decode drafted (its stats), or teacher-forced along the
target's own outputs, with beta = sum_x min(p(x), q(x)) at every position."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec.distributions import SamplingConfig, probabilities
from specdec.outputs import SpeculativeStats


def pooled_alpha(stats: SpeculativeStats) -> float:
  """The paper's alpha over a whole decode: total beta over decoded positions."""
  return float(np.sum(stats.beta_sum) / max(int(np.sum(stats.beta_count)), 1))


def pooled_tokens_per_iteration(stats: SpeculativeStats) -> float:
  return float(np.sum(stats.accepted + stats.iterations) / max(int(np.sum(stats.iterations)), 1))


def _betas(target, draft, inputs, tokens, sampling):
  start = target.start_tokens(inputs)[:, None]
  chunk = jnp.concatenate([start, tokens[:, :-1]], axis=1)
  length = tokens.shape[1]
  p_logits, _ = target.extend(target.init(inputs, length), chunk)
  q_logits, _ = draft.extend(draft.init(inputs, length), chunk)
  p = probabilities(p_logits, sampling)
  q = probabilities(q_logits, sampling)
  return jnp.sum(jnp.minimum(p, q), axis=-1)


_teacher_forced_betas = jax.jit(_betas, static_argnames=("sampling",))


def teacher_forced_betas(
  target, draft, inputs: jax.Array, tokens: jax.Array, lengths: jax.Array, sampling: SamplingConfig
) -> list[np.ndarray]:
  """beta = sum_x min(p(x), q(x)) at every position of the given outputs.

  `tokens` [B, T] are outputs of the target (its baseline decode), `lengths` [B] how
  many of them each row has; p and q are both models' distributions (after
  `sampling`'s adjustments, Section 2.3) given the prefix of those outputs, all T
  positions in one `extend` call per model. Returns one float array per row, of its
  length: the per-token betas whose mean over a corpus is the paper's alpha.
  """
  betas = np.asarray(_teacher_forced_betas(target, draft, inputs, tokens, sampling=sampling))
  lengths = np.asarray(lengths)
  return [betas[b, : lengths[b]] for b in range(betas.shape[0])]


@jax.jit
def _teacher_forced_logits(model, inputs, start, tokens):
  chunk = jnp.concatenate([start[:, None], tokens[:, :-1]], axis=1)
  logits, _ = model.extend(model.init(inputs, tokens.shape[1]), chunk)
  return logits.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("sampling",))
def _betas_of_logits(p_logits, q_logits, sampling):
  return jnp.sum(
    jnp.minimum(probabilities(p_logits, sampling), probabilities(q_logits, sampling)), axis=-1
  )


def teacher_forced_alpha(
  target,
  drafts: dict[str, Any],
  inputs: jax.Array,
  tokens: jax.Array,
  lengths: jax.Array,
  sampling: SamplingConfig,
) -> dict[str, list[np.ndarray]]:
  """`teacher_forced_betas` for several drafts along the same target outputs, the
  target's pass shared: each model's logits come from one `extend` over the outputs
  (compiled once per model and shape, whatever `sampling`), then beta = sum_x min(p(x),
  q(x)) with `sampling`'s adjustments on both. Every model is fed the target's start
  tokens, as in `teacher_forced_betas`.

  Returns:
    {draft name: one float array per row, of its length}.
  """
  start = target.start_tokens(inputs)
  p_logits = _teacher_forced_logits(target, inputs, start, tokens)
  lengths = np.asarray(lengths)
  out = {}
  for name, draft in drafts.items():
    q_logits = _teacher_forced_logits(draft, inputs, start, tokens)
    betas = np.asarray(_betas_of_logits(p_logits, q_logits, sampling=sampling))
    out[name] = [betas[b, : lengths[b]] for b in range(betas.shape[0])]
  return out
