"""scripts/bench_identity.py: the identity rate and the logits at a mismatch (a tiny
float32 pair; the shipped pair is what the script itself runs)."""

import importlib.util
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from t5_helpers import random_inputs, tiny_model

_SPEC = importlib.util.spec_from_file_location(
    "bench_identity", pathlib.Path(__file__).parents[1] / "scripts" / "bench_identity.py")
bench_identity = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_identity"] = bench_identity
_SPEC.loader.exec_module(bench_identity)

GAMMA, MAX_NEW_TOKENS = 2, 8


@pytest.fixture(scope="module")
def pair():
  layers = dict(num_encoder_layers=1, num_decoder_layers=1)
  return tiny_model("1.1", **layers), tiny_model("1.1", seed=5, **layers)


def test_greedy_pair_is_identical_and_chunks_round_like_single_steps(pair):
  """3 rows in batches of 2 (the last padded): every row identical, the chunk/single
  differences at float32 rounding, every generated position counted once."""
  target, draft = pair
  inputs = np.asarray(random_inputs(3, 6, target.vocab_size, seed=3, pad_from={1: 4}))
  result = bench_identity.measure(target, draft, inputs, [GAMMA], batch=2,
                                  max_new_tokens=MAX_NEW_TOKENS)
  row = result["gammas"][str(GAMMA)]
  assert (row["rows"], row["identical"], row["identity_rate"]) == (3, 3, 1.0)
  assert row["mismatches"] == []
  assert row["max_abs_chunk_minus_single"] < 1e-4
  assert 3 <= result["positions"] <= 3 * MAX_NEW_TOKENS
  assert result["min_top2_gap"] > 0.0
  assert "| float32 | 2 | 3/3 | 1.000 |" in bench_identity.format_table(dict(
      pair="tiny", draft="tiny", num_sentences=3, batch=2, backend="cpu",
      dtypes={"float32": result}))


def test_mismatch_report_reads_the_single_step_logits_at_the_first_difference(pair):
  """A speculative row that took the runner-up at position 3: the report finds j = 3,
  the baseline's token is the single-step argmax, the margin is the top-2 gap, and
  every chunk placement of position 3 keeps the baseline's argmax."""
  target, _ = pair
  inputs = np.asarray(random_inputs(1, 6, target.vocab_size, seed=3))
  base = np.zeros(MAX_NEW_TOKENS, np.int32)
  for j in range(MAX_NEW_TOKENS):  # The greedy decode, teacher-forced past any EOS.
    d = jnp.asarray(bench_identity.decoder_inputs(base[None]))
    logits = np.asarray(bench_identity.teacher_forced(target, jnp.asarray(inputs), d,
                                                      chunk=1))[0]
    base[j] = np.argmax(logits[j])
  spec = base.copy()
  j = 3
  spec[j] = np.argsort(logits[j])[-2]
  assert bench_identity.first_difference(base, spec) == j
  report = bench_identity.mismatch_report(target, inputs, base, spec, logits[j], j,
                                          GAMMA)
  assert report["single_top2"] == [base[j], spec[j]]
  assert report["single_margin_baseline_over_speculative"] == pytest.approx(
      report["single_top2_gap"])
  assert len(report["chunk_argmaxes"]) == GAMMA + 1
  assert report["chunk_argmaxes"] == [base[j]] * (GAMMA + 1)
  assert not report["chunk_argmax_is_speculative_token"]
  assert report["max_abs_chunk_minus_single"] < 1e-4


def test_generated_mask_and_top2_gap():
  tokens = np.array([[5, 1, 0, 0], [5, 6, 7, 8]])  # EOS_ID = 1 ends row 0.
  np.testing.assert_array_equal(bench_identity.generated_mask(tokens),
                                [[1, 1, 0, 0], [1, 1, 1, 1]])
  np.testing.assert_allclose(bench_identity.top2_gap(np.array([[1.0, 3.0, 2.5]])), [0.5])
  assert bench_identity.first_difference(tokens[0], tokens[0]) is None
