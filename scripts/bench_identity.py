r"""How often greedy speculative decoding reproduces the greedy decode, and why not.

At temperature 0, speculative decoding (Leviathan et al. 2023, Section 2.3) outputs the
target's greedy decode *if* a (gamma + 1)-token verification chunk gives the same
argmax as single steps. Its logits equal single steps' only up to float rounding
(`specdec.models.t5.T5.extend`), so a near-tie of the top two logits can flip (issue
11, section 4). This decodes Multi30k test_2016 sentences with the shipped pair
(`pretrained.load_pair`, float32 and the same weights in bfloat16), greedily with the
baseline and with speculative decoding at each gamma, and reports

* the identity rate: rows identical token for token (and in length);
* at each mismatch, the first differing position j and, from a teacher-forced
  single-step pass of the target over the baseline's tokens: the gap between its top
  two logits there, the margin by which it prefers the baseline's token over the
  speculative one, and the largest |chunk - single-step| logit difference at j over
  every position j can take in a verification chunk (chunks of gamma + 1 starting at
  j - o, o = 0..gamma, the prefix fed in single steps: the sampler's own chunk history
  is one of many, so this is the rounding's scale, not its exact value), with whether
  some chunk's argmax is the speculative token;
* per dtype and gamma, over all rows and positions, the largest |chunk - single| logit
  difference (chunks of gamma + 1 from position 0) and how many positions have a top-2
  gap below it (the positions where a flip is possible).

It prints a table and writes JSON. Check run (2 sentences):

  python scripts/bench_identity.py --num_sentences=2 --output=/tmp/identity.json

Full run (all 1000 sentences; bfloat16 is emulated on a CPU, so slow there):

  python scripts/bench_identity.py --num_sentences=1000 --output=out/bench_identity.json
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec import data, pretrained
from specdec.data import EOS_ID, TRANSLATE_PREFIX
from specdec.models import t5

_PAIR = flags.DEFINE_string('pair', 'multi30k_ende', 'A shipped pair.')
_DRAFT = flags.DEFINE_string('draft', 'draft_distilled', 'Which shipped draft.')
_NUM = flags.DEFINE_integer('num_sentences', 1000, 'Test sentences (from the first).')
_GAMMAS = flags.DEFINE_list('gammas', ['4', '7'], 'Draft tokens per iteration.')
_DTYPES = flags.DEFINE_list('dtypes', ['float32', 'bfloat16'],
                            'Parameter and activation dtypes of both models.')
_BATCH = flags.DEFINE_integer('batch', 32, 'Sentences per decode call.')
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 40, 'Tokens generated at most.')
_INPUT_LEN = flags.DEFINE_integer('input_length', 48, 'Encoder length (padded).')
_PER_POSITION = flags.DEFINE_integer(
    'per_position_logits', None, "The target's `T5.per_position_logits`; default: "
    "`pretrained.load_model`'s (6 on a CPU, 0 elsewhere).")
_OUTPUT = flags.DEFINE_string('output', 'out/bench_identity.json', 'JSON output.')

GREEDY = specdec.SamplingConfig(temperature=0.0)


@functools.partial(jax.jit, static_argnames=('chunk',))
def teacher_forced(model: t5.T5, inputs: jax.Array, decoder_tokens: jax.Array, *,
                   chunk: int) -> jax.Array:
  """float32 logits [B, L, V] of `decoder_tokens` [B, L] fed in chunks of `chunk`
  (the last one padded with token 0, whose logits are dropped)."""
  batch, length = decoder_tokens.shape
  num_chunks = -(-length // chunk)
  padded = jnp.pad(decoder_tokens, ((0, 0), (0, num_chunks * chunk - length)))
  chunks = jnp.moveaxis(padded.reshape(batch, num_chunks, chunk), 1, 0)

  def step(state, tokens):
    logits, state = model.extend(state, tokens)
    return state, logits.astype(jnp.float32)

  _, logits = jax.lax.scan(step, model.init(inputs, num_chunks * chunk), chunks)
  return jnp.moveaxis(logits, 0, 1).reshape(batch, -1, logits.shape[-1])[:, :length]


@functools.partial(jax.jit, static_argnames=('chunk',))
def chunk_logits_at(model: t5.T5, inputs: jax.Array, decoder_tokens: jax.Array,
                    start: jax.Array, *, chunk: int) -> jax.Array:
  """float32 logits [chunk, V] of one row: `decoder_tokens` [1, L] up to `start` fed
  one at a time, then the chunk `decoder_tokens[0, start:start + chunk]` in one call
  (`decoder_tokens` must hold start + chunk tokens)."""

  def single(i, state):
    token = jax.lax.dynamic_slice_in_dim(decoder_tokens, i, 1, axis=1)
    return model.extend(state, token)[1]

  state = jax.lax.fori_loop(0, start, single,
                            model.init(inputs, decoder_tokens.shape[1]))
  tokens = jax.lax.dynamic_slice_in_dim(decoder_tokens, start, chunk, axis=1)
  return model.extend(state, tokens)[0][0].astype(jnp.float32)


def decoder_inputs(tokens: np.ndarray) -> np.ndarray:
  """[B, L] output tokens -> the decoder inputs that predict them: [0, y_1..y_L-1]."""
  return np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], axis=1)


def top2_gap(logits: np.ndarray) -> np.ndarray:
  """[..., V] -> top-1 minus top-2 logit [...]."""
  top = np.sort(logits, axis=-1)[..., -2:]
  return top[..., 1] - top[..., 0]


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
  """The first position where rows a and b differ (tokens are 0 past a row's length,
  so a length difference is a token difference), or None."""
  diff = np.flatnonzero(a != b)
  return int(diff[0]) if diff.size else None


def decode_batch(target: t5.T5, draft: t5.T5, inputs: jax.Array, gammas: list[int],
                 max_new_tokens: int) -> dict[str, np.ndarray]:
  """Greedy output tokens [B, max_new_tokens] of the baseline ('baseline') and of
  speculative decoding at each gamma (str(gamma))."""
  key = jax.random.key(0)
  outputs = {'baseline': specdec.autoregressive_sample(
      target, inputs, key, max_new_tokens=max_new_tokens, sampling=GREEDY,
      eos_id=EOS_ID).tokens}
  for g in gammas:
    outputs[str(g)] = specdec.speculative_sample(
        target, draft, inputs, key, gamma=g, max_new_tokens=max_new_tokens,
        sampling=GREEDY, eos_id=EOS_ID).tokens
  return {name: np.asarray(tokens) for name, tokens in outputs.items()}


def mismatch_report(target: t5.T5, inputs: np.ndarray, base: np.ndarray,
                    spec: np.ndarray, logits: np.ndarray, j: int, gamma: int
                    ) -> dict[str, Any]:
  """One row's mismatch at its first differing position j (see the module doc).

  Args:
    target: the target model.
    inputs: int32[1, S], the row's encoder input.
    base: int32[L], the baseline's tokens.
    spec: int32[L], the speculative tokens.
    logits: float32[V], the single-step logits at j.
    j: the position.
    gamma: the speculative decode's gamma.
  """
  base_token, spec_token = int(base[j]), int(spec[j])
  top = np.argsort(logits)[::-1][:2]
  tokens = np.zeros((1, len(base) + gamma + 1), np.int32)
  tokens[0, :len(base)] = decoder_inputs(base[None])[0]
  chunk_diffs, chunk_argmaxes = [], []
  for offset in range(min(gamma, j) + 1):
    chunked = np.asarray(chunk_logits_at(target, jnp.asarray(inputs),
                                         jnp.asarray(tokens), jnp.int32(j - offset),
                                         chunk=gamma + 1))[offset]
    chunk_diffs.append(float(np.max(np.abs(chunked - logits))))
    chunk_argmaxes.append(int(np.argmax(chunked)))
  return dict(position=j, baseline_token=base_token, speculative_token=spec_token,
              single_top2=[int(t) for t in top],
              single_top2_gap=float(top2_gap(logits)),
              single_margin_baseline_over_speculative=float(
                  logits[base_token] - logits[spec_token]),
              max_abs_chunk_minus_single=max(chunk_diffs),
              chunk_argmax_is_speculative_token=spec_token in chunk_argmaxes,
              chunk_argmaxes=chunk_argmaxes)


def generated_mask(tokens: np.ndarray) -> np.ndarray:
  """bool[B, L]: the positions up to and including each row's EOS (all without)."""
  after_eos = np.cumsum(tokens == EOS_ID, axis=1) - (tokens == EOS_ID)
  return after_eos == 0


def measure(target: t5.T5, draft: t5.T5, inputs: np.ndarray, gammas: list[int],
            batch: int, max_new_tokens: int) -> dict[str, Any]:
  """Decodes `inputs` [N, S] in batches of `batch` (the last padded with copies of
  row 0, then dropped) and compares; see the module doc."""
  decode_s, gaps = 0.0, []
  per_gamma = {str(g): dict(mismatches=[], diffs=[], below=0) for g in gammas}
  for lo in range(0, len(inputs), batch):
    rows = inputs[lo:lo + batch]
    x = jnp.asarray(np.concatenate([rows, np.repeat(rows[:1], batch - len(rows), 0)]))
    start = time.perf_counter()
    outputs = decode_batch(target, draft, x, gammas, max_new_tokens)
    decode_s += time.perf_counter() - start
    base = outputs['baseline'][:len(rows)]
    # Teacher-forced over the baseline's tokens; positions past a row's EOS are
    # never compared.
    d = jnp.asarray(decoder_inputs(outputs['baseline']))
    single = np.asarray(teacher_forced(target, x, d, chunk=1))[:len(rows)]
    valid = generated_mask(base)
    batch_gaps = top2_gap(single)[valid]
    gaps.append(batch_gaps)
    for g in gammas:
      chunked = np.asarray(teacher_forced(target, x, d, chunk=g + 1))[:len(rows)]
      diff = np.max(np.abs(chunked - single), axis=-1)[valid]
      stats = per_gamma[str(g)]
      stats['diffs'].append(diff)
      stats['below'] += int((batch_gaps < diff.max()).sum())
      spec = outputs[str(g)][:len(rows)]
      for i in range(len(rows)):
        j = first_difference(base[i], spec[i])
        if j is not None:
          stats['mismatches'].append(dict(
              row=lo + i, **mismatch_report(target, rows[i:i + 1], base[i], spec[i],
                                            single[i, j], j, g)))
  gaps = np.concatenate(gaps)
  result = {'target_per_position_logits': target.per_position_logits,
            'decode_seconds': decode_s, 'positions': int(gaps.size),
            'min_top2_gap': float(gaps.min()),
            'median_top2_gap': float(np.median(gaps)), 'gammas': {}}
  for g, stats in per_gamma.items():
    diffs = np.concatenate(stats['diffs'])
    result['gammas'][g] = dict(
        rows=len(inputs), identical=len(inputs) - len(stats['mismatches']),
        identity_rate=1.0 - len(stats['mismatches']) / len(inputs),
        max_abs_chunk_minus_single=float(diffs.max()),
        median_abs_chunk_minus_single=float(np.median(diffs)),
        # Per batch, positions whose top-2 gap is below that batch's largest
        # difference: where rounding of that size could flip the argmax.
        positions_with_gap_below_max_diff=stats['below'],
        mismatches=stats['mismatches'])
  return result


def format_table(results: dict[str, Any]) -> str:
  lines = [f'{results["pair"]} target + {results["draft"]}, {results["num_sentences"]} '
           f'Multi30k test_2016 sentences, greedy, batch {results["batch"]}, '
           f'{results["backend"]}',
           '| dtype | gamma | identical | rate | max abs(chunk - single) | '
           'positions with top-2 gap below it | min top-2 gap |',
           '|---|---|---|---|---|---|---|']
  for dtype, r in results['dtypes'].items():
    for g, m in r['gammas'].items():
      lines.append(f'| {dtype} | {g} | {m["identical"]}/{m["rows"]} | '
                   f'{m["identity_rate"]:.3f} | {m["max_abs_chunk_minus_single"]:.2e} | '
                   f'{m["positions_with_gap_below_max_diff"]}/{r["positions"]} | '
                   f'{r["min_top2_gap"]:.2e} |')
  details = [(dtype, g, x) for dtype, r in results['dtypes'].items()
             for g, m in r['gammas'].items() for x in m['mismatches']]
  if details:
    lines += ['', 'Mismatches (single-step logits at the first differing position j):',
              '| dtype | gamma | row | j | base tok | spec tok | top-2 gap | '
              'margin base - spec | max abs(chunk - single) at j | chunk gives spec |',
              '|---|---|---|---|---|---|---|---|---|---|']
    for dtype, g, x in details:
      lines.append(f'| {dtype} | {g} | {x["row"]} | {x["position"]} | '
                   f'{x["baseline_token"]} | {x["speculative_token"]} | '
                   f'{x["single_top2_gap"]:.2e} | '
                   f'{x["single_margin_baseline_over_speculative"]:.2e} | '
                   f'{x["max_abs_chunk_minus_single"]:.2e} | '
                   f'{x["chunk_argmax_is_speculative_token"]} |')
  return '\n'.join(lines)


def main(argv):
  del argv
  for name, value in (('num_sentences', _NUM.value), ('batch', _BATCH.value),
                      ('max_new_tokens', _MAX_NEW.value)):
    if value < 1:
      raise app.UsageError(f'--{name} must be >= 1, got {value}')
  gammas = [int(g) for g in _GAMMAS.value]
  if not gammas or min(gammas) < 1:
    raise app.UsageError(f'--gammas must be positive ints, got {_GAMMAS.value}')
  for dtype in _DTYPES.value:
    if dtype not in ('float32', 'bfloat16'):
      raise app.UsageError(f'--dtypes: float32 or bfloat16, got {dtype!r}')
  sentences = pretrained.test_sentences(_PAIR.value)[:_NUM.value]
  vocab = data.Vocabulary()
  inputs = np.stack([vocab.encode_padded(TRANSLATE_PREFIX + en, _INPUT_LEN.value)
                     for en, _ in sentences])
  batch = min(_BATCH.value, len(inputs))
  results = {'pair': _PAIR.value, 'draft': _DRAFT.value, 'num_sentences': len(inputs),
             'batch': batch, 'max_new_tokens': _MAX_NEW.value,
             'input_length': _INPUT_LEN.value, 'backend': jax.default_backend(),
             'dtypes': {}}
  for dtype in _DTYPES.value:
    target, draft, _ = pretrained.load_pair(_PAIR.value, dtype=jnp.dtype(dtype),
                                            per_position_logits=_PER_POSITION.value,
                                            draft=_DRAFT.value)
    results['dtypes'][dtype] = measure(target, draft, inputs, gammas, batch,
                                       _MAX_NEW.value)
  print(format_table(results))
  os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
  with open(_OUTPUT.value, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'wrote {_OUTPUT.value}')


if __name__ == '__main__':
  app.run(main)
