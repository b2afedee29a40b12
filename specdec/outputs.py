"""What the samplers return: tokens, lengths, log-probabilities and per-row statistics."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


@flax.struct.dataclass
class SpeculativeStats:
  """Per-row statistics of a speculative decode, counted before EOS truncation.

  Attributes:
    iterations: int32[B], iterations the row ran (= target calls).
    drafted: int32[B], draft tokens proposed (the iteration's gamma, summed).
    accepted: int32[B], draft tokens accepted (sum of n). Tokens produced per row are
      accepted + iterations (each iteration adds n + 1).
    beta_sum: float32[B], sum over the row's decoded positions of
      beta = sum_x min(p(x), q(x)) (Corollary 3.6).
    beta_count: int32[B], how many positions `beta_sum` holds.
    rejected: int32[B], iterations that ended in a rejection (n < gamma).
    nonfinite: int32[B], positions (draft steps and verified positions) whose logits
      held a NaN or +inf or no finite value (`distributions.nonfinite`). Non-zero
      means a model is broken: such positions are decoded from sanitized logits
      (uniform when nothing is finite), never as NaN.
    gamma_counts: int32[B, len(gammas)], iterations the row ran with each gamma.
    alpha_trace: float32[B, max_new_tokens], the online alpha estimate before each of
      the row's iterations (`adaptive.Estimate`), 0 past its last.
    gammas: the gammas `gamma_counts` counts (static).

  With lenience l < 1, beta is sum_x min(p(x) / l, q(x)) (Appendix A.5) at
  temperature > 0, and [p(x) >= l max p] at temperature 0: alpha_hat estimates the
  lenient acceptance rate.
  """

  iterations: Array
  drafted: Array
  accepted: Array
  beta_sum: Array
  beta_count: Array
  rejected: Array
  nonfinite: Array
  gamma_counts: Array | None = None
  alpha_trace: Array | None = None
  gammas: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())

  @classmethod
  def zeros(cls, batch: int, gammas: tuple[int, ...], max_new_tokens: int) -> SpeculativeStats:
    """The statistics of B rows before their first iteration."""
    zeros = jnp.zeros((batch,), jnp.int32)
    return cls(
      iterations=zeros,
      drafted=zeros,
      accepted=zeros,
      beta_sum=jnp.zeros((batch,), jnp.float32),
      beta_count=zeros,
      rejected=zeros,
      nonfinite=zeros,
      gamma_counts=jnp.zeros((batch, len(gammas)), jnp.int32),
      alpha_trace=jnp.zeros((batch, max_new_tokens), jnp.float32),
      gammas=tuple(gammas),
    )

  @property
  def alpha_hat(self) -> Array:
    """float32[B], the paper's estimate of alpha: the mean beta along the decode."""
    return self.beta_sum / jnp.maximum(self.beta_count, 1)

  @property
  def tokens_per_iteration(self) -> Array:
    """float32[B], measured counterpart of Equation 1."""
    return (self.accepted + self.iterations) / jnp.maximum(self.iterations, 1)

  @property
  def alpha_from_accepts(self) -> Array:
    """float32[B], accepted / (accepted + rejected): the maximum-likelihood alpha when
    each draft is accepted independently with probability alpha (Definition 3.1)."""
    return self.accepted / jnp.maximum(self.accepted + self.rejected, 1)


@flax.struct.dataclass
class AutoregressiveStats:
  """Per-row statistics of a baseline decode.

  Attributes:
    iterations: int32[B], target calls (one token each).
    nonfinite: int32[B], target positions whose logits held a NaN or +inf or no
      finite value (see `SpeculativeStats.nonfinite`).
  """

  iterations: Array
  nonfinite: Array


@flax.struct.dataclass
class SampleOutput:
  """What both samplers return.

  Attributes:
    tokens: int32[B, max_new_tokens], generated tokens; 0 (pad) after EOS and past a
      row's length.
    lengths: int32[B], generated tokens per row, EOS included.
    stats: `SpeculativeStats` or `AutoregressiveStats`.
    log_probs: float32[B, max_new_tokens], log p(token) of each output token under
      the target's sampling distribution (temperature, top-k and top-p applied: the
      p that Algorithm 1 verifies against, floored at log 1e-30), 0 past a row's
      length; all 0 at temperature 0. Summed over a row, this is T5X's
      `temperature_sample` score (rescale_log_probs=True, its default), read from the
      verification pass rather than from another forward pass.
  """

  tokens: Array
  lengths: Array
  stats: Any
  log_probs: Array | None = None

  @property
  def scores(self) -> Array:
    """float32[B]: the log-probability of each row's output (sum of `log_probs`)."""
    if self.log_probs is None:
      raise ValueError("scores: this output has no log_probs")
    return jnp.sum(self.log_probs, axis=-1)
