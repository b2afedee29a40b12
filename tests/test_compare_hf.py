"""scripts/compare_hf.py: specdec and transformers on the same tiny random pair."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("torch", reason="the comparison needs torch (the `hf` extra)")
pytest.importorskip("transformers", reason="the comparison needs transformers (the `hf` extra)")

from t5_helpers import random_inputs, tiny_model  # pylint: disable=g-import-not-at-top

_SPEC = importlib.util.spec_from_file_location(
    "compare_hf", pathlib.Path(__file__).parents[1] / "scripts" / "compare_hf.py")
compare_hf = importlib.util.module_from_spec(_SPEC)
sys.modules["compare_hf"] = compare_hf
_SPEC.loader.exec_module(compare_hf)

GAMMA, MAX_NEW = 2, 6
SYSTEM_FIELDS = ("implementation", "settings", "baseline", "prompt_seconds",
                 "prompt_tokens", "seconds", "tokens", "ms_per_token", "speedup",
                 "target_calls", "draft_calls", "tokens_per_target_call",
                 "identical_to_reference")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  target = tiny_model("1.1", seed=1)
  draft = tiny_model("1.1", seed=2, num_encoder_layers=1, num_decoder_layers=1)
  hf_target, hf_draft = compare_hf.export_pair(target, draft,
                                               tmp_path_factory.mktemp("hf"))
  # Padded like specdec's inputs: transformers must see the same, unpadded, prompt.
  prompts = list(random_inputs(2, 9, target.vocab_size, seed=3, pad_from={1: 6}))
  return compare_hf.run_comparison(target, draft, hf_target, hf_draft, prompts,
                                   gamma=GAMMA, max_new_tokens=MAX_NEW, repeats=1,
                                   threads=1)


def test_every_system_and_field_is_present(result):
  assert set(result) >= {"settings", "systems", "ratios", "agreement",
                         "reference_tokens"}
  assert list(result["systems"]) == compare_hf.system_names(GAMMA)
  for name, r in result["systems"].items():
    for field in SYSTEM_FIELDS:
      assert field in r, (name, field)
    assert len(r["prompt_seconds"]) == len(r["prompt_tokens"]) == 2
    assert all(t > 0 for t in r["prompt_seconds"]) and r["ms_per_token"] > 0
    assert 1 <= r["tokens"] <= 2 * MAX_NEW and r["target_calls"] >= 1
  s = result["settings"]
  for field in ("transformers", "torch", "jax", "torch_threads", "cpu_count", "gamma",
                "max_new_tokens", "repeats", "hf_attn_implementation"):
    assert field in s, field
  assert s["torch_threads"] == 1 and s["gamma"] == GAMMA
  effective = result["systems"]["hf_assisted"]["settings"]["effective"]
  assert effective == dict(num_assistant_tokens=GAMMA,
                           num_assistant_tokens_schedule="constant",
                           assistant_confidence_threshold=0.0)


def test_speedups_and_ratios_recompute(result):
  systems = result["systems"]
  for name, r in systems.items():
    assert math.isclose(r["ms_per_token"], r["seconds"] * 1e3 / r["tokens"])
    base = systems[r["baseline"]]
    assert r["baseline"] == ("hf_baseline" if r["implementation"] == "transformers"
                             else "specdec_baseline")
    assert math.isclose(r["speedup"], base["ms_per_token"] / r["ms_per_token"])
  assert systems["hf_baseline"]["speedup"] == systems["specdec_baseline"]["speedup"] == 1
  spec = systems["specdec_speculative"]
  assert [q["hf_system"] for q in result["ratios"]] == [
      "hf_assisted", "hf_assisted_heuristic", "hf_assisted_defaults"]
  for q in result["ratios"]:
    hf = systems[q["hf_system"]]
    assert math.isclose(q["baseline_ms_per_token"],
                        systems["specdec_baseline"]["ms_per_token"]
                        / systems["hf_baseline"]["ms_per_token"])
    assert math.isclose(q["speculative_ms_per_token"],
                        spec["ms_per_token"] / hf["ms_per_token"])
    assert math.isclose(q["speedup"], spec["speedup"] / hf["speedup"])


def test_all_systems_give_the_same_tokens(result):
  agreement = result["agreement"]
  assert agreement["all_agree"], agreement["disagreements"]
  assert agreement["identical"] == {n: 2 for n in compare_hf.system_names(GAMMA)}
  systems = result["systems"]
  assert len({tuple(r["prompt_tokens"]) for r in systems.values()}) == 1
  # gamma drafts per iteration, as in Algorithm 1, on both sides.
  assert systems["specdec_speculative"]["draft_calls"] == (
      GAMMA * systems["specdec_speculative"]["target_calls"])
  assert systems["hf_baseline"]["target_calls"] == systems["hf_baseline"]["tokens"]
  assert systems["specdec_baseline"]["target_calls"] == systems["specdec_baseline"]["tokens"]


def test_markdown_has_a_row_per_system(result):
  text = compare_hf.markdown(result)
  for name in compare_hf.system_names(GAMMA):
    assert sum(line.startswith(f"| {name} |") for line in text.splitlines()) == 1, name
  for q in result["ratios"]:
    assert f"vs {q['hf_system']} |" in text


def test_hf_tokens_drops_the_start_token_and_padding():
  torch = pytest.importorskip("torch")
  assert compare_hf.hf_tokens(torch.tensor([[0, 5, 0, 7, 1, 0, 0]])) == [5, 0, 7, 1]
  assert compare_hf.hf_tokens(torch.tensor([[0, 5, 6]])) == [5, 6]
  ids, mask = compare_hf._unpadded(np.array([[4, 5, 1, 0, 0]]))
  assert ids.tolist() == [[4, 5, 1]] and mask.tolist() == [[1, 1, 1]]
