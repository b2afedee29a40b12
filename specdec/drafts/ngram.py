"""Unigram and bigram drafts (Table 3 of Leviathan et al., 2023).

The paper's cheapest approximation models: a unigram draft proposes tokens from the
corpus' token frequencies, a bigram draft from the frequencies of the token that
followed the previous one. Their cost is a table lookup (c ~ 0), so any acceptance
rate above zero speeds decoding up (Corollary 3.9). Both are `DecodeModel`s over the
target's vocabulary, estimated from token counts of a corpus with add-k smoothing, so
q never rules out a token the target may want (it need not, for exactness; it does
for acceptance).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def _check_vocab(vocab_size: int) -> None:
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
    raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")


def _check_smoothing(smoothing: float) -> None:
  if not (isinstance(smoothing, (int, float)) and np.isfinite(smoothing) and smoothing >= 0):
    raise ValueError(f"smoothing must be a finite number >= 0, got {smoothing!r}")


def _sequences(corpus: Iterable[Sequence[int]], vocab_size: int) -> list[np.ndarray]:
  seqs = [np.asarray(s, np.int64).reshape(-1) for s in corpus]
  for i, s in enumerate(seqs):
    if s.size and (s.min() < 0 or s.max() >= vocab_size):
      raise ValueError(f"corpus sequence {i} has token ids outside [0, {vocab_size})")
  if not any(s.size for s in seqs):
    raise ValueError("corpus is empty: no tokens to count")
  return seqs


def unigram_counts(corpus: Iterable[Sequence[int]], vocab_size: int) -> np.ndarray:
  """int64[V]: how often each token occurs in the corpus."""
  seqs = _sequences(corpus, vocab_size)
  return np.bincount(np.concatenate(seqs), minlength=vocab_size)


def bigram_counts(
  corpus: Iterable[Sequence[int]], vocab_size: int, start_token: int | None = 0
) -> dict[tuple[int, int], int]:
  """{(a, b): how often token b follows token a}; sparse, as V x V may not fit.

  With `start_token` (T5's decoder start, 0), each sequence is counted as if it were
  preceded by it, so the draft also knows how sequences begin.
  """
  seqs = _sequences(corpus, vocab_size)
  if start_token is not None:
    seqs = [np.concatenate([[start_token], s]) for s in seqs]
  pairs = np.concatenate(
    [s[:-1] * vocab_size + s[1:] for s in seqs if s.size > 1] or [np.zeros((0,), np.int64)]
  )
  keys, counts = np.unique(pairs, return_counts=True)
  return {(int(k // vocab_size), int(k % vocab_size)): int(c) for k, c in zip(keys, counts)}


def _log_normalize(counts: np.ndarray, smoothing: float) -> np.ndarray:
  """log((counts + k) / sum), float32, with rows of no mass made uniform."""
  smoothed = counts.astype(np.float64) + smoothing
  total = smoothed.sum(axis=-1, keepdims=True)
  uniform = np.full_like(smoothed, 1.0 / smoothed.shape[-1])
  probs = np.where(total > 0, smoothed / np.where(total > 0, total, 1.0), uniform)
  with np.errstate(divide="ignore"):
    return np.log(probs).astype(np.float32)


@flax.struct.dataclass
class NgramState:
  """Attributes: lengths int32[B], tokens fed so far per row."""

  lengths: Array


@flax.struct.dataclass
class _Ngram:
  """Shared protocol plumbing; subclasses define `_logits(tokens)`."""

  vocab_size: int = flax.struct.field(pytree_node=False)

  def init(self, inputs: Array, max_length: int) -> NgramState:
    del max_length  # No cache: any length fits.
    return NgramState(lengths=jnp.zeros((inputs.shape[0],), jnp.int32))

  def start_tokens(self, inputs: Array) -> Array:
    """T5's decoder start token (0): drafts pair with encoder-decoder targets."""
    return jnp.zeros((inputs.shape[0],), jnp.int32)

  def extend(self, state: NgramState, tokens: Array) -> tuple[Array, NgramState]:
    return self._logits(tokens), NgramState(lengths=state.lengths + tokens.shape[1])

  def rewind(self, state: NgramState, lengths: Array) -> NgramState:
    return NgramState(lengths=jnp.minimum(state.lengths, lengths))

  def lengths(self, state: NgramState) -> Array:
    return state.lengths

  def _logits(self, tokens: Array) -> Array:
    """float32[B, T, V] draft logits after each of `tokens` int32[B, T]."""
    raise NotImplementedError


@flax.struct.dataclass
class Unigram(_Ngram):
  """q(x) = P(x) from corpus frequencies, whatever the context.

  Attributes:
    log_probs: float32[V].
  """

  log_probs: Array

  @classmethod
  def from_counts(cls, counts, smoothing: float = 1.0) -> Unigram:
    counts = np.asarray(counts)
    if counts.ndim != 1:
      raise ValueError(f"counts must be [V], got shape {counts.shape}")
    _check_smoothing(smoothing)
    return cls(
      vocab_size=int(counts.shape[0]), log_probs=jnp.asarray(_log_normalize(counts, smoothing))
    )

  @classmethod
  def from_corpus(
    cls, corpus: Iterable[Sequence[int]], vocab_size: int, smoothing: float = 1.0
  ) -> Unigram:
    """Estimates from token-id sequences (e.g. the targets of a training set)."""
    _check_vocab(vocab_size)
    return cls.from_counts(unigram_counts(corpus, vocab_size), smoothing)

  def _logits(self, tokens: Array) -> Array:
    return jnp.broadcast_to(self.log_probs, tokens.shape + (self.vocab_size,))


@flax.struct.dataclass
class Bigram(_Ngram):
  """q(x | previous token a) from corpus frequencies, stored sparsely.

  Row a keeps its `max_successors` most frequent successors b with their counts
  c_ab; every other count is taken as 0. With add-k smoothing the distribution is
  q(b | a) = (c_ab + k) / (N_a + k V), N_a the kept counts of row a; a row with no
  mass at all (k = 0, a never seen) is uniform.

  Attributes:
    successors: int32[V, K], the kept successor ids of each row (padded with
      repeats of an entry, which scatter the same value twice).
    successor_logits: float32[V, K], log q(b | a) of those successors.
    rest_logits: float32[V], log q(b | a) of every other b.
  """

  successors: Array
  successor_logits: Array
  rest_logits: Array

  @classmethod
  def from_counts(
    cls,
    counts: dict[tuple[int, int], int],
    vocab_size: int,
    smoothing: float = 1.0,
    max_successors: int = 256,
  ) -> Bigram:
    _check_vocab(vocab_size)
    _check_smoothing(smoothing)
    if (
      isinstance(max_successors, bool) or not isinstance(max_successors, int) or max_successors < 1
    ):
      raise ValueError(f"max_successors must be an int >= 1, got {max_successors!r}")
    rows: dict[int, list[tuple[int, int]]] = {}
    for (a, b), c in counts.items():
      if not (0 <= a < vocab_size and 0 <= b < vocab_size) or c < 0:
        raise ValueError(f"counts has an invalid entry ({a}, {b}): {c}")
      rows.setdefault(a, []).append((c, b))
    k = max(1, min(max_successors, max((len(r) for r in rows.values()), default=1)))
    successors = np.zeros((vocab_size, k), np.int32)
    kept = np.zeros((vocab_size, k), np.float64)
    for a, entries in rows.items():
      entries = sorted(entries, key=lambda cb: (-cb[0], cb[1]))[:k]
      entries += [entries[0]] * (k - len(entries))
      successors[a] = [b for _, b in entries]
      kept[a] = [c for c, _ in entries]
    # Padded repeats count once: take the mass of the distinct kept entries.
    distinct = np.concatenate(
      [np.ones((vocab_size, 1), bool), successors[:, 1:] != successors[:, :1]], axis=1
    )
    total = np.sum(kept * distinct, axis=1) + smoothing * vocab_size
    has_mass = total > 0
    safe = np.where(has_mass, total, 1.0)
    with np.errstate(divide="ignore"):
      succ = np.where(
        has_mass[:, None], np.log((kept + smoothing) / safe[:, None]), -np.log(vocab_size)
      )
      rest = np.where(has_mass, np.log(smoothing / safe), -np.log(vocab_size))
    return cls(
      vocab_size=vocab_size,
      successors=jnp.asarray(successors),
      successor_logits=jnp.asarray(succ, jnp.float32),
      rest_logits=jnp.asarray(rest, jnp.float32),
    )

  @classmethod
  def from_corpus(
    cls,
    corpus: Iterable[Sequence[int]],
    vocab_size: int,
    smoothing: float = 1.0,
    start_token: int | None = 0,
    max_successors: int = 256,
  ) -> Bigram:
    """Estimates from token-id sequences (e.g. the targets of a training set)."""
    _check_vocab(vocab_size)
    return cls.from_counts(
      bigram_counts(corpus, vocab_size, start_token), vocab_size, smoothing, max_successors
    )

  def _logits(self, tokens: Array) -> Array:
    background = jnp.broadcast_to(
      self.rest_logits[tokens][..., None], tokens.shape + (self.vocab_size,)
    )

    def scatter(row, ids, values):
      return row.at[ids].set(values)

    flat = jax.vmap(scatter)(
      background.reshape(-1, self.vocab_size),
      self.successors[tokens].reshape(-1, self.successors.shape[1]),
      self.successor_logits[tokens].reshape(-1, self.successors.shape[1]),
    )
    return flat.reshape(background.shape)
