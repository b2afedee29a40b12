"""specdec.bench.inputs, specdec.bench.timing and specdec.bench.report: buckets,
paired timings and the paper's layouts from a fixed result; `python -m specdec.bench
tables` itself is tested in test_bench_tables.py."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.bench import report
from specdec.bench.inputs import bucket_lengths, pad_to_bucket
from specdec.bench.timing import time_decodes_paired


def test_buckets_pad_and_reject():
  assert bucket_lengths(128) == (16, 32, 64, 128)
  assert bucket_lengths(48) == (16, 32, 48)
  np.testing.assert_array_equal(pad_to_bucket([5, 6, 1], (4, 8)), [[5, 6, 1, 0]])
  assert pad_to_bucket(list(range(1, 6)), (4, 8)).shape == (1, 8)
  with pytest.raises(ValueError, match="ids"):
    pad_to_bucket(list(range(9)), (4, 8))


def _row(task, temp, draft, gamma, speedup, alpha=0.5, **kw):
  row = dict(
    task=task,
    temperature=temp,
    draft=draft,
    gamma=gamma,
    alpha_decode=alpha,
    alpha_accepts=alpha,
    tokens_per_iteration=1.5,
    eq1=1.5,
    c=0.1,
    v=1.2,
    baseline_ms_per_token=2.0,
    speculative_ms_per_token=2.0 / speedup,
    speedup=speedup,
    predicted_speedup_paper=1.4,
    predicted_speedup=1.1,
    measured_over_predicted=speedup / 1.1,
    ops_factor=1.6,
    metric_baseline={"bleu": 10.0},
    metric_speculative={"bleu": 10.0},
    identical_to_baseline=True if temp == 0 else None,
  )
  row.update(kw)
  return row


FIXED = dict(
  rows=[
    _row("wmt", 0.0, "draft", 1, 1.2),
    _row("wmt", 0.0, "draft", 2, 1.5),
    _row("wmt", 0.0, "bigram", 1, 1.1),
    _row("wmt", 1.0, "draft", 1, 0.9),
    _row("wmt", 1.0, "bigram", 1, 1.05),
  ],
  alpha=[
    dict(task="wmt", temperature=0.0, draft="draft", alpha=0.75, tokens=10),
    dict(task="wmt", temperature=0.0, draft="bigram", alpha=0.2, tokens=10),
    dict(task="wmt", temperature=1.0, draft="draft", alpha=0.625, tokens=10),
    dict(task="wmt", temperature=1.0, draft="bigram", alpha=0.125, tokens=10),
  ],
)


def test_table2_from_fixed_json():
  assert report.table2(FIXED) == (
    "| task | temp | draft (gamma / alpha / speed-up) | bigram (gamma / alpha / speed-up) |\n"
    "|---|---|---|---|\n"
    "| wmt | 0 | 2 / 0.75 / 1.50x | 1 / 0.20 / 1.10x |\n"
    "| wmt | 1 | 1 / 0.62 / 0.90x | 1 / 0.12 / 1.05x |"
  )


def test_table3_and_table4_from_fixed_json():
  assert report.table3(FIXED) == (
    "| draft | wmt T=0 | wmt T=1 |\n|---|---|---|\n"
    "| draft | 0.750 | 0.625 |\n| bigram | 0.200 | 0.125 |"
  )
  lines = report.table4(FIXED).split("\n")
  assert lines[0].startswith("| task | draft | temp | gamma | alpha | c | v | speed-up |")
  assert lines[2] == (
    "| wmt | draft | 0 | 2 | 0.50 | 0.100 | 1.20 | 1.50x | 1.40x | 1.10x | 1.36 |"
  )
  assert len(lines) == 2 + 4  # one row per (task, temperature, draft)


def test_paired_decode_timing_returns_each_decoders_outputs():
  """time_decodes_paired: per decoder, its own outputs (in input order) and seconds
  per generated token; a decoder that sleeps is timed as slower, whatever the order."""
  import time as time_module

  import jax
  import jax.numpy as jnp

  from specdec import outputs

  def fake(length, delay):
    def decode(x, key):
      time_module.sleep(delay)
      n = jnp.full((1,), length, jnp.int32)
      return outputs.SampleOutput(
        tokens=x + length,
        lengths=n,
        stats=outputs.AutoregressiveStats(iterations=n, nonfinite=0 * n),
      )

    return decode

  inputs = [jnp.full((1, 2), i, jnp.int32) for i in range(3)]
  timed = time_decodes_paired(
    dict(slow=fake(4, 0.02), fast=fake(2, 0.0)), inputs, jax.random.key(0), repeats=2
  )
  assert list(timed) == ["slow", "fast"]
  (slow_s, slow_out), (fast_s, fast_out) = timed["slow"], timed["fast"]
  assert [int(o.tokens[0, 0]) for o in slow_out] == [4, 5, 6]
  assert [int(o.tokens[0, 0]) for o in fast_out] == [2, 3, 4]
  # 3 inputs x >= 20 ms over 12 tokens.
  assert slow_s >= 3 * 0.02 / 12 and fast_s < slow_s
  with pytest.raises(ValueError, match="repeats"):
    time_decodes_paired(dict(fast=fake(2, 0.0)), inputs, jax.random.key(0), repeats=0)
