"""scripts/benchmark.py end to end on a tiny random pair, and the tables it renders."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from specdec import benchmarking, tables, theory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ROW_FIELDS = {
    "task", "temperature", "draft", "gamma", "alpha_decode", "alpha_accepts",
    "iterations", "accepted", "rejected", "nonfinite", "tokens_per_iteration", "eq1", "t_p1",
    "t_p_gamma1", "t_q", "c", "v", "c_hat", "baseline_ms_per_token",
    "speculative_ms_per_token", "speedup", "predicted_speedup_paper",
    "predicted_speedup", "measured_over_predicted", "measured_over_predicted_paper",
    "ops_factor", "metric_baseline", "metric_speculative", "identical_to_baseline"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench")
  cmd = [sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"),
         "--target_config=tiny", "--draft_config=tiny", "--random_weights",
         "--drafts=draft,unigram", "--examples=2", "--alpha_examples=3",
         "--alpha_batch=2", "--gammas=2", "--repeats=1", "--max_new_tokens=6",
         f"--out_dir={out}", "--progress=false"]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / "benchmark.json") as f:
    return json.load(f), out, proc.stdout


@pytest.mark.slow  # ~40 s: scripts/benchmark.py end to end in a subprocess; -m slow.
def test_benchmark_json_has_every_field(tiny_run):
  result, out, stdout = tiny_run
  assert {"config", "alpha", "baseline", "rows", "best", "compiles", "seconds"} <= set(result)
  assert len(result["rows"]) == 2 * 2 * 1  # temperatures x drafts x gammas
  for row in result["rows"]:
    assert set(row) == ROW_FIELDS, set(row) ^ ROW_FIELDS
    assert row["t_p1"] > 0 and row["t_q"] > 0 and row["t_p_gamma1"] > 0
    assert 0 <= row["alpha_decode"] <= 1 and 0 <= row["alpha_accepts"] <= 1
    assert row["nonfinite"] == 0
    assert row["metric_baseline"].keys() == row["metric_speculative"].keys() == {"bleu"}
    if row["temperature"] == 0:
      assert row["identical_to_baseline"] is True  # Greedy is exact.
      assert row["metric_speculative"] == row["metric_baseline"]
    else:
      assert row["identical_to_baseline"] is None
  for a in result["alpha"]:
    assert a["tokens"] == sum(a["beta_hist"]["counts"]) > 0
    assert len(a["beta_hist"]["edges"]) == len(a["beta_hist"]["counts"]) + 1
  assert result["config"]["drafts"]["unigram"]["c_hat"] == 0.0
  assert result["compiles"]["total"] >= 1
  for name in ("benchmark.md", "speedup_vs_gamma.png", "beta_hist.png"):
    assert (out / name).stat().st_size > 0
  assert "Table 2 layout" in stdout


@pytest.mark.slow  # ~40 s: scripts/benchmark.py end to end in a subprocess; -m slow.
def test_benchmark_predictions_recomputed_from_theory(tiny_run):
  result, _, _ = tiny_run
  for r in result["rows"]:
    a, g = r["alpha_decode"], r["gamma"]
    assert math.isclose(r["eq1"], float(theory.expected_tokens(a, g)), rel_tol=1e-9)
    assert math.isclose(r["predicted_speedup_paper"],
                        float(theory.walltime_improvement(a, g, r["c"])), rel_tol=1e-9)
    assert math.isclose(r["predicted_speedup"],
                        float(theory.walltime_improvement(a, g, r["c"], v=r["v"])),
                        rel_tol=1e-9)
    assert math.isclose(r["ops_factor"],
                        float(theory.arithmetic_ops_factor(a, g, r["c_hat"])), rel_tol=1e-9)
    assert math.isclose(r["speedup"], r["baseline_ms_per_token"]
                        / r["speculative_ms_per_token"], rel_tol=1e-9)
    assert math.isclose(r["measured_over_predicted"], r["speedup"] / r["predicted_speedup"],
                        rel_tol=1e-9)
    assert math.isclose(r["c"], r["t_q"] / r["t_p1"], rel_tol=1e-9)
    assert math.isclose(r["v"], r["t_p_gamma1"] / r["t_p1"], rel_tol=1e-9)
    trials = r["accepted"] + r["rejected"]
    assert math.isclose(r["alpha_accepts"], r["accepted"] / max(trials, 1), rel_tol=1e-9)


def test_buckets_pad_and_reject():
  assert benchmarking.bucket_lengths(128) == (16, 32, 64, 128)
  assert benchmarking.bucket_lengths(48) == (16, 32, 48)
  np.testing.assert_array_equal(benchmarking.pad_to_bucket([5, 6, 1], (4, 8)),
                                [[5, 6, 1, 0]])
  assert benchmarking.pad_to_bucket(list(range(1, 6)), (4, 8)).shape == (1, 8)
  with pytest.raises(ValueError, match="ids"):
    benchmarking.pad_to_bucket(list(range(9)), (4, 8))


def _row(task, temp, draft, gamma, speedup, alpha=0.5, **kw):
  row = dict(task=task, temperature=temp, draft=draft, gamma=gamma, alpha_decode=alpha,
             alpha_accepts=alpha, tokens_per_iteration=1.5, eq1=1.5, c=0.1, v=1.2,
             baseline_ms_per_token=2.0, speculative_ms_per_token=2.0 / speedup,
             speedup=speedup, predicted_speedup_paper=1.4, predicted_speedup=1.1,
             measured_over_predicted=speedup / 1.1, ops_factor=1.6,
             metric_baseline={"bleu": 10.0}, metric_speculative={"bleu": 10.0},
             identical_to_baseline=True if temp == 0 else None)
  row.update(kw)
  return row


FIXED = dict(
    rows=[_row("wmt", 0.0, "draft", 1, 1.2), _row("wmt", 0.0, "draft", 2, 1.5),
          _row("wmt", 0.0, "bigram", 1, 1.1), _row("wmt", 1.0, "draft", 1, 0.9),
          _row("wmt", 1.0, "bigram", 1, 1.05)],
    alpha=[dict(task="wmt", temperature=0.0, draft="draft", alpha=0.75, tokens=10),
           dict(task="wmt", temperature=0.0, draft="bigram", alpha=0.2, tokens=10),
           dict(task="wmt", temperature=1.0, draft="draft", alpha=0.625, tokens=10),
           dict(task="wmt", temperature=1.0, draft="bigram", alpha=0.125, tokens=10)])


def test_table2_from_fixed_json():
  assert tables.table2(FIXED) == (
      "| task | temp | draft (gamma / alpha / speed-up) | bigram (gamma / alpha / speed-up) |\n"
      "|---|---|---|---|\n"
      "| wmt | 0 | 2 / 0.75 / 1.50x | 1 / 0.20 / 1.10x |\n"
      "| wmt | 1 | 1 / 0.62 / 0.90x | 1 / 0.12 / 1.05x |")


def test_table3_and_table4_from_fixed_json():
  assert tables.table3(FIXED) == (
      "| draft | wmt T=0 | wmt T=1 |\n|---|---|---|\n"
      "| draft | 0.750 | 0.625 |\n| bigram | 0.200 | 0.125 |")
  lines = tables.table4(FIXED).split("\n")
  assert lines[0].startswith("| task | draft | temp | gamma | alpha | c | v | speed-up |")
  assert lines[2] == ("| wmt | draft | 0 | 2 | 0.50 | 0.100 | 1.20 | 1.50x | 1.40x | "
                      "1.10x | 1.36 |")
  assert len(lines) == 2 + 4  # one row per (task, temperature, draft)


@pytest.mark.slow  # ~25 s: the shipped pair end to end; the tiny run covers the code.
def test_benchmark_default_pair_runs(tmp_path):
  """The default path: the shipped pair and task, cut to a minimum."""
  cmd = [sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"),
         "--drafts=draft,bigram", "--examples=1", "--alpha_examples=2", "--alpha_batch=2",
         "--gammas=1", "--temperatures=0", "--repeats=1", "--max_new_tokens=4",
         f"--out_dir={tmp_path}", "--progress=false", "--plots=false"]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "benchmark.json") as f:
    result = json.load(f)
  assert result["config"]["target"]["name"] == "multi30k_ende/target"
  assert [r["identical_to_baseline"] for r in result["rows"]] == [True, True]


@pytest.mark.slow  # ~15 s of T5 shapes; run with -m slow.
def test_shapes_only_premise_and_speedups(tmp_path):
  """--shapes_only: the agreeing pair accepts everything, the random one less, and
  speed-up(alpha) is E[tokens] x t_baseline_token / t_iteration."""
  cmd = [sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"), "--shapes_only",
         "--target_config=tiny", "--draft_config=tiny", "--gammas=7",
         "--max_new_tokens=16", "--repeats=1", f"--out_dir={tmp_path}"]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "shapes.json") as f:
    result = json.load(f)
  (row,) = result["rows"]
  agreeing, random = row["runs"]["agreeing"], row["runs"]["random"]
  assert agreeing["accepted"] == agreeing["drafted"] > 0
  assert random["accepted"] < random["drafted"]
  assert random["identical"] is True
  assert result["decoder_weight_bytes"] > 0 and result["param_dtype"] == "float32"
  for p in row["table2"]:
    expected = (float(theory.expected_tokens(p["alpha"], 7)) * row["t_baseline_token"]
                / random["t_iteration"])
    assert math.isclose(p["speedup"], expected, rel_tol=1e-9)
  assert [p["paper_speedup"] for p in row["table2"]] == [3.4, 2.6]


def test_paired_decode_timing_returns_each_decoders_outputs():
  """time_decodes_paired: per decoder, its own outputs (in input order) and seconds
  per generated token; a decoder that sleeps is timed as slower, whatever the order."""
  import time as time_module

  import jax
  import jax.numpy as jnp

  from specdec import sample

  def fake(length, delay):
    def decode(x, key):
      time_module.sleep(delay)
      n = jnp.full((1,), length, jnp.int32)
      return sample.SampleOutput(tokens=x + length, lengths=n,
                                 stats=sample.AutoregressiveStats(iterations=n,
                                                                   nonfinite=0 * n))
    return decode

  inputs = [jnp.full((1, 2), i, jnp.int32) for i in range(3)]
  timed = benchmarking.time_decodes_paired(
      dict(slow=fake(4, 0.02), fast=fake(2, 0.0)), inputs, jax.random.key(0), repeats=2)
  assert list(timed) == ["slow", "fast"]
  (slow_s, slow_out), (fast_s, fast_out) = timed["slow"], timed["fast"]
  assert [int(o.tokens[0, 0]) for o in slow_out] == [4, 5, 6]
  assert [int(o.tokens[0, 0]) for o in fast_out] == [2, 3, 4]
  # 3 inputs x >= 20 ms over 12 tokens.
  assert slow_s >= 3 * 0.02 / 12 and fast_s < slow_s
  with pytest.raises(ValueError, match="repeats"):
    benchmarking.time_decodes_paired(dict(fast=fake(2, 0.0)), inputs, jax.random.key(0),
                                     repeats=0)
