"""scripts/bench_lm_pair.py: Table 3 and Table 4 for a decoder-only pair, on tiny random
Llamas (the shipped pair is what the script itself runs; its end-to-end run is marked
slow and skips without the shipped draft)."""

import json
import math
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import benchmarking, theory
from specdec.distributions import SamplingConfig
from specdec.models import llama
from script_loader import load_script

ROOT = pathlib.Path(__file__).parents[1]
bench_lm_pair = load_script("bench_lm_pair")

VOCAB, PAD, EOS = 260, 2, 2
# One gamma keeps the compilations (the file's cost) few; `best_gammas` and `table4`
# are tested on rows of several gammas below.
GAMMAS, MAX_NEW, TEMPS = [2], 6, (0.0, 1.0)
ROW_FIELDS = ("temperature", "draft", "gamma", "alpha", "alpha_empirical",
              "tokens_per_iteration", "eq1", "c", "v", "baseline_ms_per_token",
              "speculative_ms_per_token", "speedup", "predicted_speedup",
              "predicted_speedup_paper", "measured_over_predicted",
              "baseline_ms_per_token_decode", "speculative_ms_per_token_decode",
              "speedup_decode", "measured_over_predicted_decode")


class ByteTokenizer:
  """UTF-8 bytes as ids 4..259; chat = [1] + content + [2, 3]; EOS = pad = 2."""

  eos_id = pad_id = EOS
  vocab_size = VOCAB

  def encode(self, text, add_special_tokens=True):
    del add_special_tokens
    return [4 + b for b in text.encode()]

  def apply_chat_template(self, messages, add_generation_prompt=True):
    assert add_generation_prompt
    return [1] + self.encode(messages[0]["content"]) + [2, 3]


def tiny_llama(seed, **overrides):
  cfg = llama.tiny_config(vocab_size=VOCAB, **dict(dict(num_layers=1), **overrides))
  return llama.Llama(cfg, jax.device_put(llama.random_params(cfg, seed=seed)),
                     pad_id=PAD)


def prompts(lengths, seed):
  rng = np.random.default_rng(seed)
  return [rng.integers(4, VOCAB, n).tolist() + [3] for n in lengths]


@pytest.fixture(scope="module")
def target():
  return tiny_llama(1)


@pytest.fixture(scope="module")
def result(target):
  """Ragged prompts; n-gram drafts from the target's outputs on other ("training")
  prompts; the "distilled" draft is the target itself (alpha 1: every draft kept)."""
  corpus = bench_lm_pair.target_output_corpus(target, prompts([4, 7, 5, 6], seed=9),
                                              EOS, MAX_NEW, batch=2)
  drafts = dict(bench_lm_pair.ngram_drafts(corpus, VOCAB), distilled=target)
  # Batch 1 and alpha_gamma in the sweep: the alpha passes reuse the sweep's compiles.
  return bench_lm_pair.run(target, drafts, prompts([5, 9, 7], seed=3), EOS,
                           gammas=GAMMAS, temperatures=TEMPS, max_new_tokens=MAX_NEW,
                           repeats=1, batch=1, alpha_gamma=2, cost_rounds=1,
                           cost_repeats=1, cost_steps=2)


def test_the_json_has_every_promised_field(result):
  json.loads(json.dumps(result))  # Plain JSON.
  assert set(result) >= {"settings", "paper_table3", "alpha", "c", "v", "costs",
                         "sweep", "best_gamma", "table4", "phase_seconds", "seconds"}
  assert set(result["costs"]["prefill"]) == {"target", "draft"}
  assert all(x > 0 for x in result["costs"]["prefill"].values())
  assert list(result["alpha"]) == ["unigram", "bigram", "distilled"]
  for per_temp in result["alpha"].values():
    assert list(per_temp) == ["0", "1"]
    for a in per_temp.values():
      assert 0.0 <= a["teacher_forced"] <= 1.0 + 1e-6
      assert 0.0 <= a["empirical"] <= 1.0 + 1e-6
      assert 3 <= a["teacher_forced_positions"] <= 3 * MAX_NEW
      assert a["empirical_positions"] >= 1 and a["gamma"] == 2
  assert result["c"] > 0
  assert set(result["v"]) == {"1", "3"} and result["v"]["1"] == 1.0
  assert all(v > 0 for v in result["v"].values())
  assert [(r["temperature"], r["gamma"]) for r in result["sweep"]] == [
      (t, g) for t in TEMPS for g in GAMMAS]
  for r in result["sweep"]:
    for field in ROW_FIELDS:
      assert field in r, field
    assert r["speedup"] > 0 and r["predicted_speedup"] > 0
    assert ("identical_to_baseline" in r) == (r["temperature"] == 0)
  assert set(result["best_gamma"]) == {"0", "1"}
  assert len(result["table4"]) == len(result["sweep"])
  assert result["paper_table3"]["alpha"]["distilled"] == {"0": 0.88, "1": 0.89}
  s = result["settings"]
  assert s["prompts"] == 3 and s["input_length"] == 10 and s["pad_id"] == PAD
  assert s["prompt_tokens"] == [6, 10, 8] and s["gammas"] == GAMMAS


def test_a_draft_equal_to_the_target_is_always_accepted(result):
  """alpha 1 both ways, gamma + 1 tokens per iteration (Eq. 1 at alpha 1), and at
  temperature 0 the speculative decodes equal the baseline's."""
  for a in result["alpha"]["distilled"].values():
    assert a["teacher_forced"] == pytest.approx(1.0, abs=1e-5)
    assert a["empirical"] == pytest.approx(1.0, abs=1e-5)
  for r in result["sweep"]:
    assert r["tokens_per_iteration"] == r["gamma"] + 1
    assert r["eq1"] == pytest.approx(r["gamma"] + 1)
    if r["temperature"] == 0:
      assert r["identical_to_baseline"] and r["identical_rows"] == 3


def test_ngram_drafts_are_accepted_less_than_the_target_itself(result):
  for name in ("unigram", "bigram"):
    for t in ("0", "1"):
      assert result["alpha"][name][t]["teacher_forced"] < 0.95, (name, t)
  # Greedy acceptance of a unigram draft: its one most frequent token.
  assert result["alpha"]["unigram"]["0"]["teacher_forced"] < 0.5


def test_sweep_predictions_best_gamma_and_table4_recompute(result):
  c, v = result["c"], result["v"]
  for r in result["sweep"]:
    g = r["gamma"]
    assert r["alpha"] == result["alpha"]["distilled"][f"{r['temperature']:g}"][
        "teacher_forced"]
    assert r["eq1"] == pytest.approx(float(theory.expected_tokens(r["alpha"], g)))
    assert r["v"] == v[str(g + 1)] and r["c"] == c
    assert r["predicted_speedup"] == pytest.approx(r["eq1"] / (g * c + r["v"]))
    assert r["predicted_speedup_paper"] == pytest.approx(r["eq1"] / (g * c + 1))
    assert r["speedup"] == pytest.approx(r["baseline_ms_per_token"]
                                         / r["speculative_ms_per_token"])
    assert r["measured_over_predicted"] == pytest.approx(r["speedup"]
                                                         / r["predicted_speedup"])
    # Without prefill: each prompt's measured prefill off the timed seconds.
    prefill, n = result["costs"]["prefill"], result["settings"]["prompts"]
    assert r["baseline_ms_per_token_decode"] == pytest.approx(
        r["baseline_ms_per_token"] - n * prefill["target"] * 1e3 / r["baseline_tokens"])
    assert r["speculative_ms_per_token_decode"] == pytest.approx(
        r["speculative_ms_per_token"] - n * (prefill["target"] + prefill["draft"]) * 1e3
        / r["speculative_tokens"])
    assert r["speedup_decode"] == pytest.approx(r["baseline_ms_per_token_decode"]
                                                / r["speculative_ms_per_token_decode"])
  for t, best in result["best_gamma"].items():
    row, = [r for r in result["sweep"] if f"{r['temperature']:g}" == t]
    assert (best["gamma"], best["speedup"]) == (row["gamma"], row["speedup"])
    assert (best["gamma_decode"], best["speedup_decode"]) == (row["gamma"],
                                                              row["speedup_decode"])
  for row, r in zip(result["table4"], result["sweep"]):
    assert (row["expected_tokens"], row["empirical_tokens"], row["empirical_speedup"]) \
        == (r["eq1"], r["tokens_per_iteration"], r["speedup"])


def test_best_gamma_is_the_highest_measured_speedup_per_temperature():
  def row(t, g, speedup, predicted):
    return dict(temperature=t, gamma=g, alpha=0.5, eq1=1.5, tokens_per_iteration=1.4,
                speedup=speedup, predicted_speedup=predicted,
                predicted_speedup_paper=predicted + 1, measured_over_predicted=0.5)
  rows = [row(0.0, 1, 0.9, 1.2), row(0.0, 2, 1.1, 1.0), row(0.0, 3, 0.8, 1.3),
          row(1.0, 1, 0.7, 0.9), row(1.0, 2, 0.6, 0.95)]
  best = bench_lm_pair.best_gammas(rows)
  assert list(best) == ["0", "1"]
  assert (best["0"]["gamma"], best["0"]["speedup"]) == (2, 1.1)
  assert (best["0"]["predicted_best_gamma"], best["1"]["gamma"],
          best["1"]["predicted_best_gamma"]) == (3, 1, 2)
  assert "gamma_decode" not in best["0"]
  for r, loop in zip(rows, (1.0, 0.9, 1.2, 0.5, 0.6)):
    r["speedup_decode"] = loop
  best = bench_lm_pair.best_gammas(rows)
  assert (best["0"]["gamma_decode"], best["1"]["gamma_decode"]) == (3, 2)
  assert best["0"]["gamma"] == 2
  table = bench_lm_pair.table4(rows)
  assert [(r["temperature"], r["gamma"]) for r in table] == [
      (r["temperature"], r["gamma"]) for r in rows]
  assert table[1]["expected_speedup"] == 1.0 and table[1]["expected_speedup_paper"] == 2.0


def test_markdown_shows_every_draft_beside_the_papers_alpha(result):
  text = bench_lm_pair.markdown(result)
  lines = text.splitlines()
  assert sum(line.startswith("| unigram | 0 |") and "0.03 (unigram)" in line
             for line in lines) == 1
  assert sum(line.startswith("| distilled | 1 |") and "0.89 (GPT-like (6M))" in line
             for line in lines) == 1
  for t in TEMPS:
    for g in GAMMAS:
      assert sum(line.startswith(f"| {t:g} | {g} |") for line in lines) == 2  # + Table 4
  assert "v(3) = " in text and "Best measured gamma at temperature 1: 2" in text
  assert "equals the baseline token for token: yes" in text


def test_teacher_forced_alpha_is_teacher_forced_betas_with_the_target_pass_shared(
    target, result):
  del result  # Run first: this reuses its compilations (shapes [1, 10], 6 tokens).
  other = tiny_llama(5)
  x = jnp.asarray(benchmarking.right_pad(prompts([3], seed=4), PAD, length=10))
  sampling = SamplingConfig(temperature=1.0)
  out = bench_lm_pair.autoregressive_sample(target, x, jax.random.key(0),
                                            max_new_tokens=MAX_NEW, sampling=sampling,
                                            eos_id=EOS)
  shared = benchmarking.teacher_forced_alpha(target, {"other": other, "self": target},
                                             x, out.tokens, out.lengths, sampling)
  alone = benchmarking.teacher_forced_betas(target, other, x, out.tokens, out.lengths,
                                            sampling)
  for a, b in zip(shared["other"], alone):
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert np.all(a < 0.999)
  for a, length in zip(shared["self"], np.asarray(out.lengths)):
    assert a.shape == (length,)
    np.testing.assert_allclose(a, 1.0, atol=1e-5)


def test_target_output_corpus_is_the_start_token_then_the_greedy_output(target, result):
  del result  # Run first: this reuses its compilations (batches [2, 8]).
  rows = prompts([4, 7, 2], seed=6)
  corpus = bench_lm_pair.target_output_corpus(target, rows, EOS, MAX_NEW, batch=2)
  assert len(corpus) == 3
  rows = rows[:2]
  x = jnp.asarray(benchmarking.right_pad(rows, PAD))
  out = bench_lm_pair.autoregressive_sample(target, x, jax.random.key(0),
                                            max_new_tokens=MAX_NEW,
                                            sampling=SamplingConfig(temperature=0.0),
                                            eos_id=EOS)
  for seq, row, tokens, length in zip(corpus, rows, np.asarray(out.tokens),
                                      np.asarray(out.lengths)):
    assert seq[0] == row[-1] == 3
    assert seq[1:] == tokens[:length].tolist()
    assert len(seq) - 1 == MAX_NEW or seq[-1] == EOS


def test_text_corpus_leaves_out_the_held_out_texts_and_training_prompts_fit():
  tok = ByteTokenizer()
  full = bench_lm_pair.text_corpus(tok, EOS)
  held_out = "Summarize: " + bench_lm_pair.data.load_examples(
      bench_lm_pair.data.CNNDM_TASK)[0]["article"][:200]
  fewer = bench_lm_pair.text_corpus(tok, EOS, exclude=[held_out])
  assert len(fewer) == len(full) - 1 == 250 + 3003 - 1
  assert all(seq[-1] == EOS for seq in full)
  messages, ids = bench_lm_pair.training_prompts(tok, 5, max_tokens=120)
  assert len(messages) == len(ids) == 5 and all(len(x) <= 120 for x in ids)
  assert ids[0] == tok.apply_chat_template([{"role": "user", "content": messages[0]}])
  from specdec import lm_prompts  # pylint: disable=g-import-not-at-top
  evaluation = {p.text for p in lm_prompts.split()[1]}
  assert not any(t in m for t in evaluation for m in messages)


def test_layer_skip_drafts_are_the_target_without_the_named_layers():
  target = tiny_llama(1, num_layers=4)
  drafts = bench_lm_pair.layer_skip_drafts(target, ["3,1", "0"])
  assert list(drafts) == ["skip 1,3", "skip 0"]
  assert drafts["skip 1,3"].config.num_layers == 2
  assert drafts["skip 1,3"].params["layers_1"] is target.params["layers_2"]
  assert drafts["skip 0"].params["layers_0"] is target.params["layers_1"]
  for bad in ("", "x", "4", "-1", "0,1,2,3"):
    with pytest.raises(bench_lm_pair.app.UsageError, match="lmp_skip_layers"):
      bench_lm_pair.layer_skip_drafts(target, [bad])


def test_right_pad_and_verify_costs():
  np.testing.assert_array_equal(benchmarking.right_pad([[5, 6], [7]], 2),
                                [[5, 6], [7, 2]])
  np.testing.assert_array_equal(benchmarking.right_pad([[5]], 2, length=3), [[5, 2, 2]])
  with pytest.raises(ValueError, match="ends with pad_id"):
    benchmarking.right_pad([[5, 2]], 2)
  with pytest.raises(ValueError, match="no pad_id"):
    benchmarking.right_pad([[5, 6], [7]], None)
  with pytest.raises(ValueError, match="exceeds length 1"):
    benchmarking.right_pad([[5, 6]], 2, length=1)
  with pytest.raises(ValueError, match="gammas must be positive"):
    bench_lm_pair.run(None, {"distilled": None}, [[5]], EOS, gammas=[0])
  with pytest.raises(ValueError, match="sweep_draft: 'distilled'"):
    bench_lm_pair.run(None, {"bigram": None}, [[5]], EOS, gammas=[1])


@pytest.mark.slow
def test_the_script_runs_on_the_shipped_pair(tmp_path):
  """A few prompts and tokens of the real pair end to end (skips without its draft)."""
  from specdec import pretrained  # pylint: disable=g-import-not-at-top
  try:
    pretrained.lm_draft_path(bench_lm_pair.PAIR)
    pretrained.lm_path(bench_lm_pair.PAIR, verify=False)
  except (AttributeError, FileNotFoundError, ValueError, KeyError) as e:
    pytest.skip(f"the shipped pair {bench_lm_pair.PAIR} is not here: {e}")
  out = tmp_path / "lm_pair.json"
  proc = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "bench_lm_pair.py"), "--lmp_prompts=2",
       "--lmp_max_new_tokens=8", "--lmp_gammas=1,2", "--lmp_repeats=1",
       "--lmp_alpha_gamma=2", "--lmp_batch=2", "--lmp_ngram_prompts=4",
       "--lmp_ngram_max_new_tokens=8", "--lmp_cost_rounds=1", "--lmp_cost_repeats=1",
       "--lmp_cost_steps=2", f"--lmp_json={out}"],
      capture_output=True, text=True, timeout=1200, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert list(result["alpha"]) == ["unigram", "bigram", "distilled", "distilled+lookup"]
  assert all(set(a) == {"0", "1"} for a in result["alpha"].values())
  assert result["settings"]["sweep_draft"] == "distilled+lookup"
  assert result["settings"]["packed_weights"] == dict(target=True, draft=True)
  assert result["settings"]["context_lookup"]["min_ngram"] >= 1
  assert all(r["draft"] == "distilled+lookup" for r in result["sweep"])
  assert set(result["v"]) == {"1", "2", "3"} and result["c"] > 0
  assert all(r["identical_to_baseline"] for r in result["sweep"]
             if r["temperature"] == 0)
  assert result["settings"]["ngram_corpus"] == "target_outputs"
  assert set(result["best_gamma"]) == {"0", "1"}
  assert math.isfinite(result["alpha"]["distilled"]["0"]["teacher_forced"])
  assert (tmp_path / "lm_pair.md").is_file()
