"""`python -m specdec.bench sampler`: the sampler's own cost per iteration.

The models are near-zero-cost lookup tables (logits = table[last token], no cache,
no matmul), so what is timed is Algorithm 1's machinery (Leviathan, Kalman & Matias
2023): the loop, the draft scan, the probabilities (temperature / top-k / top-p over
V), acceptance, the residual and the bookkeeping. Timings are medians over repeats of
an already compiled decode (batch 1); compile time is reported separately.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec.bench import cli, report
from specdec.costs import median_seconds


@dataclasses.dataclass(frozen=True)
class Config:
  vocab: tuple[int, ...] = cli.field((256, 32128), "Vocabulary sizes.")
  gammas: tuple[int, ...] = cli.field((1, 3, 5, 7), "Draft lengths.")
  max_new_tokens: int = cli.field(128, "Tokens per decode.")
  repeats: int = cli.field(5, "Timed decodes per setting (median).")
  top_p: float | None = cli.field(None, "Optional nucleus sampling (sorts V).")
  temperatures: tuple[float, ...] = cli.field(
    (0.0, 1.0), "Temperatures (0: the greedy path, on tokens only)."
  )


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


def measure_sampler(vocab, gammas, max_new_tokens, repeats, sampling):
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((min(vocab, 256), vocab)).astype(np.float32) * 2
  target = TableLM(jnp.asarray(logits), vocab)
  draft = TableLM(jnp.asarray(logits + rng.standard_normal(logits.shape).astype(np.float32)), vocab)
  inputs = jnp.ones((1, 1), jnp.int32)
  key = jax.random.key(0)
  rows = []

  def baseline():
    return specdec.autoregressive_sample(
      target, inputs, key, max_new_tokens=max_new_tokens, sampling=sampling
    ).tokens

  start = time.perf_counter()
  jax.block_until_ready(baseline())
  compile_s = time.perf_counter() - start
  wall = median_seconds(baseline, repeats, warmup=0)
  rows.append(
    dict(
      vocab=vocab,
      method="autoregressive",
      gamma=0,
      compile_s=compile_s,
      decode_s=wall,
      iterations=max_new_tokens,
      us_per_iteration=wall / max_new_tokens * 1e6,
      us_per_token=wall / max_new_tokens * 1e6,
    )
  )
  for gamma in gammas:

    def spec(gamma=gamma):
      return specdec.speculative_sample(
        target, draft, inputs, key, gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling
      )

    start = time.perf_counter()
    out = jax.block_until_ready(spec())
    compile_s = time.perf_counter() - start
    wall = median_seconds(lambda: spec().tokens, repeats, warmup=0)
    iterations = int(out.stats.iterations[0])
    rows.append(
      dict(
        vocab=vocab,
        method="speculative",
        gamma=gamma,
        compile_s=compile_s,
        decode_s=wall,
        iterations=iterations,
        us_per_iteration=wall / iterations * 1e6,
        us_per_token=wall / max_new_tokens * 1e6,
        alpha=float(out.stats.alpha_hat[0]),
      )
    )
  return rows


def run(config: Config) -> dict:
  cli.check_positive(config, "vocab", "gammas", "max_new_tokens", "repeats")
  rows = []
  for temperature in config.temperatures:
    sampling = specdec.SamplingConfig(temperature=temperature, top_p=config.top_p)
    for vocab in config.vocab:
      rows += [
        dict(r, temperature=temperature)
        for r in measure_sampler(
          vocab, list(config.gammas), config.max_new_tokens, config.repeats, sampling
        )
      ]
  return dict(
    config=dataclasses.asdict(config),
    platform=platform.platform(),
    backend=jax.devices()[0].platform,
    cpu_count=os.cpu_count(),
    jax=jax.__version__,
    rows=rows,
  )


def render(result: dict) -> str:
  c = result["config"]
  head = (
    f"Sampler overhead, batch 1, {c['max_new_tokens']} new tokens, lookup-table "
    f"models, top_p {c['top_p']}, {result['backend']} ({result['cpu_count']} "
    "cores)\n\n"
  )
  return head + report.markdown_table(
    [
      "V",
      "temp",
      "method",
      "gamma",
      "compile s",
      "decode ms",
      "iterations",
      "us/iteration",
      "us/token",
    ],
    [
      [
        r["vocab"],
        report.temp_key(r["temperature"]),
        r["method"],
        r["gamma"],
        f"{r['compile_s']:.2f}",
        f"{r['decode_s'] * 1e3:.2f}",
        r["iterations"],
        f"{r['us_per_iteration']:.0f}",
        f"{r['us_per_token']:.0f}",
      ]
      for r in result["rows"]
    ],
  )
