"""`python -m specdec.bench tables` (specdec.bench.tables) on a toy pair, and the
drafts and measurements it is made of: the paper's Tables 2-4 bookkeeping (the
numbers of a toy pair mean nothing; their arithmetic must hold)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import theory
from specdec.bench import drafts, report, tables, workloads
from specdec.bench.alpha import teacher_forced_alpha, teacher_forced_betas
from specdec.data.lm_prompts import right_pad
from specdec.distributions import SamplingConfig
from specdec.models import llama
from specdec.sample import autoregressive_sample

ROW_FIELDS = {
  "task",
  "temperature",
  "kind",
  "draft",
  "gamma",
  "alpha",
  "alpha_decode",
  "alpha_accepts",
  "iterations",
  "accepted",
  "rejected",
  "nonfinite",
  "tokens_per_iteration",
  "eq1",
  "c",
  "v",
  "t_p1",
  "t_q",
  "t_p_gamma1",
  "baseline_ms_per_token",
  "speculative_ms_per_token",
  "speedup",
  "predicted_speedup",
  "predicted_speedup_paper",
  "measured_over_predicted",
  "measured_over_predicted_paper",
  "identical_to_baseline",
  "metric_baseline",
  "metric_speculative",
}
TINY = dict(
  pair="toy_llama",
  drafts=("draft", "bigram"),
  gammas=(2,),
  temperatures=(0.0, 1.0),
  examples=2,
  alpha_examples=3,
  batch=2,
  max_new_tokens=5,
  repeats=1,
  cost_rounds=1,
  cost_repeats=1,
  cost_steps=2,
)


@pytest.fixture(scope="module")
def result():
  return tables.run(tables.Config(**TINY))


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
def test_every_row_has_every_field_and_greedy_rows_equal_the_baseline(result):
  assert {"config", "alpha", "baseline", "costs", "rows", "best"} <= set(result)
  assert [(r["temperature"], r["draft"], r["gamma"]) for r in result["rows"]] == [
    (0.0, "draft", 2),
    (1.0, "draft", 2),
  ]
  for row in result["rows"]:
    assert set(row) == ROW_FIELDS, set(row) ^ ROW_FIELDS
    assert row["kind"] == "FixedGamma" and row["nonfinite"] == 0
    assert 0 <= row["alpha"] <= 1 and 0 <= row["alpha_decode"] <= 1
    assert row["identical_to_baseline"] is (True if row["temperature"] == 0 else None)
  assert {(a["temperature"], a["draft"]) for a in result["alpha"]} == {
    (t, d) for t in (0.0, 1.0) for d in ("draft", "bigram")
  }
  for a in result["alpha"]:
    assert a["tokens"] == sum(a["beta_hist"]["counts"]) > 0
  assert result["config"]["ngram_corpus_sequences"] == tables.CORPUS_PROMPTS


@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
def test_predictions_recompute_from_theory_and_the_costs(result):
  costs = result["costs"]["draft"]
  for r in result["rows"]:
    a, g = r["alpha"], r["gamma"]
    assert r["eq1"] == pytest.approx(float(theory.expected_tokens(a, g)))
    assert r["predicted_speedup_paper"] == pytest.approx(
      float(theory.walltime_improvement(a, g, r["c"]))
    )
    assert r["predicted_speedup"] == pytest.approx(
      float(theory.walltime_improvement(a, g, r["c"], v=r["v"]))
    )
    assert r["speedup"] == pytest.approx(r["baseline_ms_per_token"] / r["speculative_ms_per_token"])
    assert r["measured_over_predicted"] == pytest.approx(r["speedup"] / r["predicted_speedup"])
    assert r["c"] == pytest.approx(r["t_q"] / r["t_p1"]) == pytest.approx(costs["c"])
    assert r["v"] == pytest.approx(costs["v"][str(g + 1)])
    assert r["alpha_accepts"] == pytest.approx(
      r["accepted"] / max(r["accepted"] + r["rejected"], 1)
    )
  assert [b["gamma"] for b in result["best"]] == [2, 2]


@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
def test_render_shows_tables_2_3_and_4(result):
  text = tables.render(result)
  for title in ("Table 2 layout", "Table 3 layout", "Table 4 layout", "Every setting"):
    assert title in text
  assert "| bigram |" in report.table3(result)


def test_row_kinds_are_the_baseline_then_each_swept_draft_and_gamma():
  kinds = tables.row_kinds(
    tables.Config(sweep=("draft", "bigram"), gammas=(1, 3), drafts=("draft", "bigram"))
  )
  assert [k.name for k in kinds] == [
    "baseline",
    "draft gamma=1",
    "draft gamma=3",
    "bigram gamma=1",
    "bigram gamma=3",
  ]
  costs = dict(c=0.1, v={2: 1.2}, t_p1=1.0, t_q=0.1, t_p={2: 1.2})
  p = tables.FixedGamma("draft", 1).predict(0.5, costs)
  assert p["predicted_speedup"] == pytest.approx(
    float(theory.walltime_improvement(0.5, 1, 0.1, v=1.2))
  )


@pytest.mark.parametrize(
  "bad, match",
  [
    (dict(gammas=(0,)), "gammas"),
    (dict(temperatures=(-1.0,)), "temperatures"),
    (dict(sweep=("unigram",)), "sweep"),
    (dict(ngram_corpus="web"), "ngram_corpus"),
    (dict(pair="nope"), "pair"),
    (dict(drafts=("draft", "trigram")), "trigram"),
    (dict(ngram_corpus="text", drafts=("draft", "bigram")), "toy pair"),
  ],
)
def test_bad_settings_are_named(bad, match):
  with pytest.raises(ValueError, match=match):
    tables.run(tables.Config(**dict(TINY, **bad)))


# ------------------------------------------------------------------------------
# Drafts and the measurements the subcommands share.
# ------------------------------------------------------------------------------
VOCAB, PAD, EOS = 97, 0, 2


def tiny_llama(seed, **overrides):
  cfg = llama.tiny_config(vocab_size=VOCAB, **dict(dict(num_layers=1), **overrides))
  return llama.Llama(cfg, jax.device_put(llama.random_params(cfg, seed=seed)), pad_id=PAD)


def test_teacher_forced_alpha_is_teacher_forced_betas_with_the_target_pass_shared():
  target, other = tiny_llama(1), tiny_llama(5)
  x = jnp.asarray(right_pad([[5, 9, 3]], PAD, length=6))
  sampling = SamplingConfig(temperature=1.0)
  out = autoregressive_sample(
    target, x, jax.random.key(0), max_new_tokens=4, sampling=sampling, eos_id=EOS
  )
  shared = teacher_forced_alpha(
    target, {"other": other, "self": target}, x, out.tokens, out.lengths, sampling
  )
  alone = teacher_forced_betas(target, other, x, out.tokens, out.lengths, sampling)
  for a, b in zip(shared["other"], alone):
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert np.all(a < 0.999)
  for a, length in zip(shared["self"], np.asarray(out.lengths)):
    assert a.shape == (length,)
    np.testing.assert_allclose(a, 1.0, atol=1e-5)


def test_target_output_corpus_is_the_start_token_then_the_greedy_output():
  target = tiny_llama(1)
  rows = [[5, 6, 3], [7, 8, 9, 3]]
  corpus = drafts.target_output_corpus(target, rows, EOS, 4, batch=2)
  out = autoregressive_sample(
    target,
    jnp.asarray(right_pad(rows, PAD)),
    jax.random.key(0),
    max_new_tokens=4,
    sampling=SamplingConfig(temperature=0.0),
    eos_id=EOS,
  )
  for seq, tokens, length in zip(corpus, np.asarray(out.tokens), np.asarray(out.lengths)):
    assert seq[0] == 3 and seq[1:] == tokens[:length].tolist()


class ByteTokenizer:
  def encode(self, text, add_special_tokens=True):
    del add_special_tokens
    return [4 + b for b in text.encode()]


def test_lm_text_corpus_leaves_out_the_held_out_texts():
  full = drafts.lm_text_corpus(ByteTokenizer(), EOS)
  held_out = "Summarize: " + drafts.data.load_examples(drafts.data.CNNDM_TASK)[0]["article"][:200]
  fewer = drafts.lm_text_corpus(ByteTokenizer(), EOS, exclude=[held_out])
  assert len(fewer) == len(full) - 1 == 250 + 3003 - 1
  assert all(seq[-1] == EOS for seq in full)


def test_ngram_drafts_and_layer_skip_drafts():
  grams = drafts.ngram_drafts([[5, 6, 5, 6]], VOCAB)
  assert list(grams) == ["unigram", "bigram"]
  assert grams["bigram"].vocab_size == VOCAB
  with pytest.raises(ValueError, match="trigram"):
    drafts.ngram_drafts([[5]], VOCAB, ["trigram"])
  target = tiny_llama(1, num_layers=4)
  skipped = drafts.layer_skip_draft(target, "skip:3,1")
  assert skipped.config.num_layers == 2
  assert skipped.params["layers_1"] is target.params["layers_2"]
  for bad in ("skip:", "skip:x", "skip:4", "skip:-1", "skip:0,1,2,3"):
    with pytest.raises(ValueError, match="layer indices"):
      drafts.layer_skip_draft(target, bad)


def test_toy_workloads_and_right_pad():
  w = workloads.load("toy_t5", 3)
  assert w.inputs.shape == (3, 8) and np.all(w.inputs[:, -1] == 1)
  assert w.target.vocab_size == w.drafts["draft"].vocab_size == 64
  np.testing.assert_array_equal(right_pad([[5, 6], [7]], 2), [[5, 6], [7, 2]])
  with pytest.raises(ValueError, match="ends with pad_id"):
    right_pad([[5, 2]], 2)
  with pytest.raises(ValueError, match="num"):
    workloads.load("toy_t5", 0)


def test_the_paper_layouts_render_a_stored_result():
  rows = [
    dict(
      task="wmt",
      temperature=0.0,
      draft="draft",
      gamma=g,
      alpha_decode=0.5,
      alpha_accepts=0.5,
      tokens_per_iteration=1.5,
      eq1=1.5,
      c=0.1,
      v=1.2,
      baseline_ms_per_token=2.0,
      speculative_ms_per_token=2.0 / s,
      speedup=s,
      predicted_speedup_paper=1.4,
      predicted_speedup=1.1,
      measured_over_predicted=s / 1.1,
      identical_to_baseline=True,
    )
    for g, s in ((1, 1.2), (2, 1.5))
  ]
  text = report.sweep(dict(rows=rows))
  assert text.count("\n") == 1 + 2 and "| - | yes |" in text  # no ops factor: "-"
  with pytest.raises(ValueError, match="rows"):
    report.markdown_table(["a", "b"], [["1"]])
  assert math.isclose(report.best_rows(dict(rows=rows))["wmt", 0.0, "draft"]["gamma"], 2)
