"""The README's main job runs end to end (tiny settings): `python -m specdec.bench
demo` (`specdec.bench.demo`)."""

import json

import pytest

from specdec import adaptive, pretrained
from specdec.bench import demo as bench_demo
from specdec.data import lm_prompts


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_demo_runs_on_two_sentences(tmp_path):
  result = bench_demo.run_t5("multi30k_ende", num_sentences=2, gamma=2,
                             max_new_tokens=8, input_length=48, repeats=1, seed=0,
                             progress=False)
  # Per temperature: the fixed gamma, then AutoGamma, timed beside one baseline.
  assert [r["temperature"] for r in result["rows"]] == [0.0, 0.0, 1.0, 1.0]
  # Each temperature runs the shipped draft of the higher measured alpha.
  assert [r["draft"] for r in result["rows"]] == [
      pretrained.best_draft("multi30k_ende", t) for t in (0.0, 0.0, 1.0, 1.0)]
  fixed, auto = result["rows"][0::2], result["rows"][1::2]
  assert all(r["gamma"] == 2 and r["costs"]["v"] > 0 for r in fixed)
  assert all(r["gamma"] == "auto" and sum(r["gamma_histogram"].values()) > 0
             for r in auto)
  assert result["rows"][0]["identical_to_baseline"]
  assert result["rows"][1]["identical_to_baseline"]
  assert result["rows"][0]["baseline_ms_per_token"] == result["rows"][1][
      "baseline_ms_per_token"]
  for row in fixed:
    assert 0.0 <= row["alpha"] <= 1.0
    assert 1.0 <= row["tokens_per_iteration"] <= 3.0
  for row in result["rows"]:
    assert row["speedup"] > 0 and row["predicted_speedup"] > 0
    assert row["nonfinite_positions"] == 0
  assert len(result["examples"]) == 2
  table = bench_demo.format_table(result)
  assert "meas/pred" in table and "| auto " in table
  bench_demo.save_plot(result, str(tmp_path / "plot.png"))
  assert (tmp_path / "plot.png").stat().st_size > 1000
  json.dumps(result)


class _ByteTokenizer:
  """A stand-in tokenizer: one id per byte of a fixed chat rendering."""
  eos_id, pad_id = 2, 1

  def apply_chat_template(self, messages, add_generation_prompt=True):
    return [3 + (b % 60) for b in f"<u>{messages[0]['content']}<a>".encode()]

  def decode(self, ids):
    return " ".join(map(str, ids))


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_decoder_only_part_runs_with_tiny_models(monkeypatch):
  """run_lm's wiring (chat prompts, pad buckets, both temperatures, the model card's
  gamma) on tiny random Llamas; the shipped pair's own run is in
  test_the_demo_runs_the_shipped_decoder_only_pair."""
  from specdec.models import llama
  target_cfg = llama.tiny_config()
  draft_cfg = llama.tiny_config(num_layers=1, hidden_size=16, num_heads=2,
                                num_kv_heads=1)
  target = llama.Llama(target_cfg, llama.random_params(target_cfg, 0), pad_id=1)
  draft = llama.Llama(draft_cfg, llama.random_params(draft_cfg, 1), pad_id=1)
  monkeypatch.setattr(pretrained, "load_pair", lambda name: (
      target.with_packed_weights(), draft.with_packed_weights(), _ByteTokenizer()))
  monkeypatch.setattr(pretrained, "pair_info", lambda name: {
      "best_gamma": {"0": 3, "1": 2},
      "context_lookup": {"weight": 0.9, "best_gamma": {"0": 4, "1": 1}}})
  rules = []

  def auto_gamma(name, temperature, batch, draft):
    rules.append((name, temperature, batch, draft))
    return adaptive.AutoGamma.from_c(0.05, gammas=(0, 1, 2), prior=0.5)

  monkeypatch.setattr(pretrained, "auto_gamma", auto_gamma)
  prompts = ["a short prompt", "another prompt", "third"]
  result = bench_demo.run_lm("tiny_lm", num_prompts=2, gamma=None, max_new_tokens=6,
                             repeats=1, seed=0, progress=False, prompts=prompts)
  # Per temperature one row per draft, each at its own gamma from the card, then
  # AutoGamma with the first draft on the pair's costs at batch 1.
  assert [r["temperature"] for r in result["rows"]] == [0.0] * 3 + [1.0] * 3
  assert [r["draft"] for r in result["rows"]] == ["draft+lookup", "draft",
                                                  "draft+lookup"] * 2
  assert [r["gamma"] for r in result["rows"]] == [4, 3, "auto", 1, 2, "auto"]
  assert rules == [("tiny_lm", 0.0, 1, "draft+lookup"), ("tiny_lm", 1.0, 1,
                                                         "draft+lookup")]
  assert sum(result["rows"][2]["gamma_histogram"].values()) > 0
  without = bench_demo.run_lm("tiny_lm", num_prompts=1, gamma=None, max_new_tokens=4,
                              repeats=1, seed=0, progress=False, prompts=prompts,
                              auto=False)
  assert [r["gamma"] for r in without["rows"]] == [4, 3, 1, 2]
  assert result["num_prompts"] == 2 and result["packed_weights"]
  assert all(r["identical_to_baseline"] for r in result["rows"][:2])
  # The rows share one baseline, timed beside both drafts.
  assert result["rows"][0]["baseline_ms_per_token"] == result["rows"][1][
      "baseline_ms_per_token"]
  with pytest.raises(ValueError, match="drafts"):
    bench_demo.run_lm("tiny_lm", num_prompts=1, gamma=None, max_new_tokens=6, repeats=1,
                      seed=0, progress=False, drafts=("draft_full",))
  for row in result["rows"]:
    assert row["speedup"] > 0
    if row["gamma"] != "auto":
      assert 0.0 <= row["alpha"] <= 1.0 and row["costs"]["v"] > 0
  # Both prompts fit one pad bucket: one compiled decode per decoder and temperature.
  assert [e["prompt"] for e in result["examples"]] == ["a short prompt",
                                                       "another prompt"]
  assert "meas/pred" in bench_demo.format_table(result)
  json.dumps(result)
  text = bench_demo.render({"tiny_lm": result})
  assert "PROMPT  a short prompt" in text and "identical to the baseline: yes" in text


def test_the_demo_prompts_are_english_and_held_out_of_every_distillation_prompt():
  """The decoder-only demo's prompts play to a small instruct model's strengths
  (explanations, a summary, a continuation; no translation) and are not the text
  the draft was distilled or tuned on: no training or evaluation prompt holds one."""
  import inspect
  assert inspect.signature(bench_demo.run_lm).parameters["prompts"].default == (
      lm_prompts.DEMO_PROMPTS)
  assert len(lm_prompts.DEMO_PROMPTS) >= 6
  for p in lm_prompts.DEMO_PROMPTS:
    assert p.isascii() and "German" not in p and "Translate" not in p
  contents = [p.content for p in lm_prompts.all_prompts()]
  texts = {p.text for p in lm_prompts.all_prompts()}
  for p in lm_prompts.DEMO_PROMPTS:
    assert p not in contents and p not in texts
    assert not any(p in c or (len(c) > 30 and c in p) for c in contents), p


def test_the_demo_config_is_checked():
  with pytest.raises(ValueError, match="pair"):
    bench_demo.run(bench_demo.Config(pair="nope"))
  with pytest.raises(ValueError, match="num_prompts"):
    bench_demo.run(bench_demo.Config(num_prompts=0))


def test_lm_inputs_pad_each_prompt_to_a_bucket_with_the_pad_id():
  inputs = bench_demo.lm_inputs(_ByteTokenizer(), ["x", "y" * 40], pad_id=1)
  assert [x.shape for x in inputs] == [(1, 32), (1, 46)]  # 7 and 46 bytes
  assert int(inputs[0][0, -1]) == 1 and int(inputs[1][0, -1]) != 1


@pytest.mark.slow
def test_the_demo_runs_the_shipped_decoder_only_pair():
  """The shipped SmolLM2 pair end to end (one prompt, a few tokens): loads, packs,
  decodes at both temperatures, and temperature 0 equals the baseline."""
  pytest.importorskip("tokenizers")
  try:
    pretrained.lm_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  result = bench_demo.run_lm("smollm2_135m_instruct", num_prompts=1, gamma=2,
                             max_new_tokens=6, repeats=1, seed=0, progress=False)
  assert result["packed_weights"] and result["num_prompts"] == 1
  assert [r["draft"] for r in result["rows"]] == ["draft+lookup", "draft",
                                                  "draft+lookup"] * 2
  assert [r["gamma"] for r in result["rows"]] == [2, 2, "auto"] * 2
  assert all(r["identical_to_baseline"] for r in result["rows"][:3])
  for row in result["rows"]:
    assert row["nonfinite_positions"] == 0
    if row["gamma"] != "auto":
      assert 0.0 <= row["alpha"] <= 1.0
  assert result["examples"][0]["prompt"] == lm_prompts.DEMO_PROMPTS[0]
