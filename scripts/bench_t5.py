r"""Latency of T5's chunked decoder step and encoder, and the memory of a decode.

Speculative decoding pays off when scoring gamma+1 tokens in one target call costs
little more than scoring one (Leviathan et al. 2023, Section 3.4: the cost
coefficient and the "chunk" assumption). This measures, for a T5-base-sized model
(`t5_1_1_base` dimensions, random weights) on the local devices:

* t(k): one `T5.extend` call feeding a chunk of k = 1..max_chunk tokens to every row,
  against a cache already holding `--prefix` positions, and v(k) = t(k) / t(1);
* the encoder on `--input_length` tokens;
* the compiled memory of a greedy decode of `--decode_tokens` tokens (XLA's
  `memory_analysis`: parameters, outputs, temporaries).

in float32 and bfloat16. It prints a table and writes JSON. A measurement script, not
a test; run e.g.

  python scripts/bench_t5.py --repeats=5 --output=/tmp/bench_t5.json

`--write_compare` measures instead the cost of the decode cache's write (issue 11,
section 3): ms per draft step (one 1-token `extend` of every row, its greedy token fed
back, inside a compiled `lax.fori_loop`) against a cache of `--cache_length`
positions, with the landed write (a scatter of the new slots) and with T5X's one-hot
contraction over the whole cache, which T5 used before (kept here only for this
comparison). The two programs are timed in turn, in alternating order, and the
minimum over `--rounds` is reported:

  python scripts/bench_t5.py --write_compare --config=t5_small --dtypes=float32 \
    --batch=64 --cache_length=512 --output=out/bench_t5_write.json
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import statistics
import time
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec.models import t5

_CONFIG = flags.DEFINE_enum('config', 't5_1_1_base', sorted(t5.CONFIGS),
                            'Preset whose dimensions the random model has.')
_DTYPES = flags.DEFINE_list('dtypes', ['float32', 'bfloat16'],
                            'Parameter and activation dtypes to measure.')
_BATCH = flags.DEFINE_integer('batch', 1, 'Rows per call.')
_INPUT_LENGTH = flags.DEFINE_integer('input_length', 128, 'Encoder tokens per row.')
_PREFIX = flags.DEFINE_integer('prefix', 32,
                               'Decoder positions already cached before a chunk.')
_MAX_CHUNK = flags.DEFINE_integer('max_chunk', 8, 'Chunk lengths 1..max_chunk.')
_DECODE_TOKENS = flags.DEFINE_integer('decode_tokens', 64,
                                      'Tokens of the decode whose memory is measured.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per measurement.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the random weights and tokens.')
_OUTPUT = flags.DEFINE_string('output', 'bench_t5.json', 'Where to write the JSON.')
_WRITE_COMPARE = flags.DEFINE_bool(
    'write_compare', False, 'Time draft steps with the scatter cache write against '
    'the one-hot write instead of the chunk/encoder/memory measurements.')
_CACHE_LENGTH = flags.DEFINE_integer('cache_length', 512,
                                     '--write_compare: decoder positions of the cache.')
_LOOP_STEPS = flags.DEFINE_integer('loop_steps', 16,
                                   '--write_compare: draft steps per compiled call.')
_ROUNDS = flags.DEFINE_integer('rounds', 7,
                               '--write_compare: timed calls of each write, in turn.')


def _seconds(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
  """Median and min wall time of `fn()` over `repeats` calls, after one warm-up
  (which also compiles)."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return {'median_s': statistics.median(times), 'min_s': min(times)}


def _model(dtype: jnp.dtype, params_f32: Any) -> t5.T5:
  cfg = dataclasses.replace(t5.CONFIGS[_CONFIG.value], dtype=dtype)
  return t5.T5(cfg, jax.tree.map(lambda x: jnp.asarray(x, dtype), params_f32))


def _measure(model: t5.T5, rng: np.random.Generator) -> dict[str, Any]:
  vocab = model.vocab_size
  inputs = jnp.asarray(rng.integers(2, vocab, (_BATCH.value, _INPUT_LENGTH.value)),
                       jnp.int32)
  max_length = _PREFIX.value + _MAX_CHUNK.value
  init = jax.jit(lambda m, x: m.init(x, max_length))
  extend = jax.jit(lambda m, s, tokens: m.extend(s, tokens)[0])
  encode = jax.jit(lambda m, x: m.encode(x))

  state = init(model, inputs)
  prefix = jnp.asarray(rng.integers(2, vocab, (_BATCH.value, _PREFIX.value)), jnp.int32)
  _, state = jax.jit(lambda m, s, tokens: m.extend(s, tokens))(model, state, prefix)

  steps = {}
  for k in range(1, _MAX_CHUNK.value + 1):
    chunk = jnp.asarray(rng.integers(2, vocab, (_BATCH.value, k)), jnp.int32)
    steps[k] = _seconds(lambda: extend(model, state, chunk), _REPEATS.value)
  t1 = steps[1]['median_s']
  for k, step in steps.items():
    step['v'] = step['median_s'] / t1

  decode = jax.jit(lambda m, x: specdec.autoregressive_sample(
      m, x, jax.random.key(0), max_new_tokens=_DECODE_TOKENS.value,
      sampling=specdec.SamplingConfig(temperature=0.0)).tokens)
  analysis = decode.lower(model, inputs).compile().memory_analysis()
  memory = {name: int(getattr(analysis, f'{name}_size_in_bytes'))
            for name in ('argument', 'output', 'temp', 'alias')}
  memory['peak'] = (memory['argument'] + memory['output'] + memory['temp']
                    - memory['alias'])
  return {'encoder': _seconds(lambda: encode(model, inputs), _REPEATS.value),
          'decoder_step': {str(k): v for k, v in steps.items()},
          'decode_memory_bytes': memory}


def _one_hot_write(cache: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
  """T5's cache write before issue 11 (T5X's one-hot contraction), for comparison only:
  a dot with a cache-sized output and a select over the whole cache."""
  write = jax.nn.one_hot(positions, cache.shape[1], dtype=jnp.float32)  # [B, k, T]
  scattered = jnp.einsum('bkt,bkhd->bthd', write.astype(new.dtype), new)
  written = jnp.any(write > 0, axis=1)[:, :, None, None]
  return jnp.where(written, scattered.astype(cache.dtype), cache)


@contextlib.contextmanager
def _cache_write(fn: Callable[..., jax.Array]):
  """Traces T5 with `fn` as its cache write."""
  landed = t5.write_cache
  t5.write_cache = fn
  try:
    yield
  finally:
    t5.write_cache = landed


@functools.partial(jax.jit, static_argnums=(3, 4))
def _draft_steps(model: t5.T5, state: t5.T5State, first: jax.Array, steps: int,
                 write: Callable[..., jax.Array]) -> tuple[jax.Array, jax.Array]:
  """`steps` greedy 1-token extends with `write` as the cache write, each rewound to
  the same position (so every step costs the same); returns (the last tokens
  int32[B], the written caches' sum). `write` is static: one trace per write."""
  start = state.lengths

  def step(_, carry):
    token, state = carry
    logits, state = model.extend(state, token[:, None])
    return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), model.rewind(state, start)

  with _cache_write(write):
    token, state = jax.lax.fori_loop(0, steps, step, (first, state))
  return token, sum(jnp.sum(k.astype(jnp.float32)) for k, _ in state.caches)


def _write_compare(model: t5.T5, rng: np.random.Generator) -> dict[str, Any]:
  """ms per draft step with each cache write (see the module docstring)."""
  vocab, batch, capacity = model.vocab_size, _BATCH.value, _CACHE_LENGTH.value
  inputs = jnp.asarray(rng.integers(2, vocab, (batch, _INPUT_LENGTH.value)), jnp.int32)
  first = jnp.asarray(rng.integers(2, vocab, (batch,)), jnp.int32)
  state = jax.jit(lambda m, x: m.init(x, capacity))(model, inputs)
  # Every row writes slot T - 1 and attends to all T: the cost of a full cache (its
  # values, zeros here, do not change it).
  state = state.replace(lengths=jnp.full((batch,), capacity - 1, jnp.int32))
  compiled, outputs = {}, {}
  for name, write in (('scatter', t5.write_cache),
                      ('one_hot', _one_hot_write)):
    compiled[name] = _draft_steps.lower(model, state, first, _LOOP_STEPS.value,
                                        write).compile()
    if name == 'one_hot' and ' scatter(' in compiled[name].as_text():
      raise RuntimeError('the one-hot program still scatters: T5 was not retraced')
    outputs[name] = jax.block_until_ready(compiled[name](model, state, first))
  # The same computation: the same greedy tokens and the same cache contents.
  same_tokens = bool(np.array_equal(outputs['scatter'][0], outputs['one_hot'][0]))
  cache_sum_diff = float(abs(outputs['scatter'][1] - outputs['one_hot'][1]))
  times = {name: [] for name in compiled}
  for r in range(_ROUNDS.value):
    for name in (list(compiled) if r % 2 == 0 else list(compiled)[::-1]):
      start = time.perf_counter()
      jax.block_until_ready(compiled[name](model, state, first))
      times[name].append((time.perf_counter() - start) / _LOOP_STEPS.value)
  cfg = model.config
  cache_bytes = (2 * cfg.num_decoder_layers * batch * capacity * cfg.num_heads
                 * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize)
  result = {name: {'min_ms_per_step': 1e3 * min(t),
                   'median_ms_per_step': 1e3 * statistics.median(t),
                   'temp_bytes': int(compiled[name].memory_analysis().temp_size_in_bytes)}
            for name, t in times.items()}
  result.update(speedup=result['one_hot']['min_ms_per_step']
                / result['scatter']['min_ms_per_step'],
                same_tokens=same_tokens, cache_sum_abs_diff=cache_sum_diff,
                cache_bytes=cache_bytes)
  return result


def _write_table(results: dict[str, Any]) -> str:
  lines = [f'{results["config"]}, batch {results["batch"]} x {results["cache_length"]} '
           f'cache positions, {results["loop_steps"]} draft steps per call, min of '
           f'{results["rounds"]} rounds',
           '| dtype | write | ms/step (min) | ms/step (median) | speed-up | cache MiB |',
           '|---|---|---|---|---|---|']
  for dtype, r in results['dtypes'].items():
    for name in ('one_hot', 'scatter'):
      speedup = f'{r["speedup"]:.2f}x' if name == 'scatter' else ''
      lines.append(f'| {dtype} | {name} | {r[name]["min_ms_per_step"]:.3f} | '
                   f'{r[name]["median_ms_per_step"]:.3f} | {speedup} | '
                   f'{r["cache_bytes"] / 2**20:.0f} |')
    if not r['same_tokens']:
      lines.append(f'  WARNING {dtype}: the two writes decoded different tokens')
  return '\n'.join(lines)


def _table(results: dict[str, Any]) -> str:
  lines = []
  for dtype, r in results['dtypes'].items():
    lines.append(f'{results["config"]} {dtype}: encoder ({results["input_length"]} '
                 f'tokens) {1e3 * r["encoder"]["median_s"]:.1f} ms')
    lines.append('   k   t(k) ms   v = t(k)/t(1)')
    for k, step in r['decoder_step'].items():
      lines.append(f'  {int(k):2d}  {1e3 * step["median_s"]:8.2f}   {step["v"]:6.2f}')
    mem = r['decode_memory_bytes']
    lines.append(f'  decode of {results["decode_tokens"]} tokens: peak '
                 f'{mem["peak"] / 2**20:.0f} MiB (parameters and inputs '
                 f'{mem["argument"] / 2**20:.0f} MiB, temporaries '
                 f'{mem["temp"] / 2**20:.0f} MiB)')
  return '\n'.join(lines)


def main(argv):
  del argv
  cfg = t5.CONFIGS[_CONFIG.value]
  params = t5.random_params(cfg, seed=_SEED.value)
  results = {
      'config': _CONFIG.value, 'parameters': t5.param_count(cfg),
      'devices': [str(d) for d in jax.devices()], 'batch': _BATCH.value,
      'input_length': _INPUT_LENGTH.value, 'dtypes': {}}
  if _WRITE_COMPARE.value:
    results.update(cache_length=_CACHE_LENGTH.value, loop_steps=_LOOP_STEPS.value,
                   rounds=_ROUNDS.value)
  else:
    results.update(prefix=_PREFIX.value, decode_tokens=_DECODE_TOKENS.value,
                   repeats=_REPEATS.value)
  measure = _write_compare if _WRITE_COMPARE.value else _measure
  for name in _DTYPES.value:
    model = _model(jnp.dtype(name), params)
    results['dtypes'][name] = measure(model, np.random.default_rng(_SEED.value))
  print((_write_table if _WRITE_COMPARE.value else _table)(results))
  with open(_OUTPUT.value, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'wrote {_OUTPUT.value}')


if __name__ == '__main__':
  app.run(main)
