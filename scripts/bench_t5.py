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
"""

from __future__ import annotations

import dataclasses
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
      'input_length': _INPUT_LENGTH.value, 'prefix': _PREFIX.value,
      'decode_tokens': _DECODE_TOKENS.value, 'repeats': _REPEATS.value, 'dtypes': {}}
  for name in _DTYPES.value:
    model = _model(jnp.dtype(name), params)
    results['dtypes'][name] = _measure(model, np.random.default_rng(_SEED.value))
  print(_table(results))
  with open(_OUTPUT.value, 'w') as f:
    json.dump(results, f, indent=2)
  print(f'wrote {_OUTPUT.value}')


if __name__ == '__main__':
  app.run(main)
