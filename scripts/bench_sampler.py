"""The sampler's own cost: per-iteration overhead of the compiled loop.

    python scripts/bench_sampler.py [--vocab=256,32128] [--gammas=1,3,5,7]

The models are near-zero-cost lookup tables (logits = table[last token], no cache,
no matmul), so what is timed is Algorithm 1's machinery: the loop, the draft scan,
the probabilities (temperature / top-k / top-p over V), acceptance, the residual and
the bookkeeping. Prints a table and writes JSON. Timings are medians over repeats of
an already compiled decode (batch 1); compile time is reported separately.
"""

from __future__ import annotations

import json
import os
import platform
import time

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

import specdec
from specdec.benchmarking import median_seconds

_VOCAB = flags.DEFINE_list("vocab", ["256", "32128"], "Vocabulary sizes.")
_GAMMAS = flags.DEFINE_list("gammas", ["1", "3", "5", "7"], "Draft lengths.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per decode.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed decodes per setting.")
_TOP_P = flags.DEFINE_float("top_p", None, "Optional nucleus sampling (sorts V).")
_TEMPS = flags.DEFINE_list("temperatures", ["0", "1"],
                           "Temperatures (0: the greedy path, on tokens only).")
_JSON = flags.DEFINE_string("json_out", "out/bench_sampler.json", "JSON output.")


@flax.struct.dataclass
class TableLM:
  """A DecodeModel whose logits are a row lookup on the last token: nearly free.

  Attributes:
    table: float32[R, V]; token t reads row t % R (R small, so V = 32128 fits).
  """

  table: jax.Array
  vocab_size: int = flax.struct.field(pytree_node=False)

  def init(self, inputs, max_length):
    return jnp.full((inputs.shape[0],), inputs.shape[1] - 1, jnp.int32)

  def start_tokens(self, inputs):
    return inputs[:, -1].astype(jnp.int32)

  def extend(self, state, tokens):
    return self.table[tokens % self.table.shape[0]], state + tokens.shape[1]

  def rewind(self, state, lengths):
    return jnp.minimum(state, lengths)

  def lengths(self, state):
    return state


def measure(vocab, gammas, max_new_tokens, repeats, sampling):
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((min(vocab, 256), vocab)).astype(np.float32) * 2
  target = TableLM(jnp.asarray(logits), vocab)
  draft = TableLM(jnp.asarray(logits + rng.standard_normal(logits.shape).astype(
      np.float32)), vocab)
  inputs = jnp.ones((1, 1), jnp.int32)
  key = jax.random.key(0)
  rows = []

  def baseline():
    return specdec.autoregressive_sample(target, inputs, key, max_new_tokens=max_new_tokens,
                                         sampling=sampling).tokens
  start = time.perf_counter()
  jax.block_until_ready(baseline())
  compile_s = time.perf_counter() - start
  wall = median_seconds(baseline, repeats, warmup=0)
  rows.append(dict(vocab=vocab, method="autoregressive", gamma=0, compile_s=compile_s,
                   decode_s=wall, iterations=max_new_tokens,
                   us_per_iteration=wall / max_new_tokens * 1e6,
                   us_per_token=wall / max_new_tokens * 1e6))
  for gamma in gammas:
    def spec(gamma=gamma):
      return specdec.speculative_sample(target, draft, inputs, key, gamma=gamma,
                                        max_new_tokens=max_new_tokens, sampling=sampling)
    start = time.perf_counter()
    out = jax.block_until_ready(spec())
    compile_s = time.perf_counter() - start
    wall = median_seconds(lambda: spec().tokens, repeats, warmup=0)
    iterations = int(out.stats.iterations[0])
    rows.append(dict(vocab=vocab, method="speculative", gamma=gamma, compile_s=compile_s,
                     decode_s=wall, iterations=iterations,
                     us_per_iteration=wall / iterations * 1e6,
                     us_per_token=wall / max_new_tokens * 1e6,
                     alpha=float(out.stats.alpha_hat[0])))
  return rows


def format_table(rows):
  header = "| V | temp | method | gamma | compile s | decode ms | iterations | us/iteration | us/token |"
  lines = [header, "|" + "---|" * 9]
  for r in rows:
    lines.append(f"| {r['vocab']} | {r['temperature']:g} | {r['method']} | {r['gamma']} | {r['compile_s']:.2f} | "
                 f"{r['decode_s'] * 1e3:.2f} | {r['iterations']} | "
                 f"{r['us_per_iteration']:.0f} | {r['us_per_token']:.0f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  rows = []
  for temperature in map(float, _TEMPS.value):
    sampling = specdec.SamplingConfig(temperature=temperature, top_p=_TOP_P.value)
    for vocab in map(int, _VOCAB.value):
      rows += [dict(r, temperature=temperature) for r in measure(
          vocab, [int(g) for g in _GAMMAS.value], _MAX_NEW.value, _REPEATS.value,
          sampling)]
  print(f"Sampler overhead, batch 1, {_MAX_NEW.value} new tokens, lookup-table models, "
        f"top_p {_TOP_P.value}, {jax.devices()[0].platform} ({os.cpu_count()} cores)\n")
  print(format_table(rows))
  if _JSON.value:
    os.makedirs(os.path.dirname(_JSON.value) or ".", exist_ok=True)
    with open(_JSON.value, "w") as f:
      json.dump(dict(platform=platform.platform(), backend=jax.devices()[0].platform,
                     jax=jax.__version__, top_p=_TOP_P.value, rows=rows), f, indent=2)


if __name__ == "__main__":
  app.run(main)
