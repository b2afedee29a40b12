"""`python -m specdec.bench compare-hf` (specdec.bench.compare_hf): specdec and
transformers on the same tiny random pair."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("torch", reason="the comparison needs torch (the `hf` extra)")
pytest.importorskip("transformers", reason="the comparison needs transformers (the `hf` extra)")

from specdec.bench import compare_hf

from t5_helpers import random_inputs, tiny_model

GAMMA, MAX_NEW = 2, 6
SYSTEM_FIELDS = (
  "implementation",
  "settings",
  "baseline",
  "prompt_seconds",
  "prompt_tokens",
  "seconds",
  "tokens",
  "ms_per_token",
  "speedup",
  "target_calls",
  "draft_calls",
  "tokens_per_target_call",
  "identical_to_reference",
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  target = tiny_model("1.1", seed=1)
  draft = tiny_model("1.1", seed=2, num_encoder_layers=1, num_decoder_layers=1)
  hf_target, hf_draft = compare_hf.export_pair(target, draft, tmp_path_factory.mktemp("hf"))
  # Padded like specdec's inputs: transformers must see the same, unpadded, prompt.
  prompts = list(random_inputs(2, 9, target.vocab_size, seed=3, pad_from={1: 6}))
  return compare_hf.run_comparison(
    target,
    draft,
    hf_target,
    hf_draft,
    prompts,
    gamma=GAMMA,
    max_new_tokens=MAX_NEW,
    repeats=1,
    threads=1,
  )


@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
def test_every_system_and_field_is_present(result):
  assert set(result) >= {"settings", "systems", "ratios", "agreement", "reference_tokens"}
  assert list(result["systems"]) == compare_hf.system_names(GAMMA)
  for name, r in result["systems"].items():
    for field in SYSTEM_FIELDS:
      assert field in r, (name, field)
    assert len(r["prompt_seconds"]) == len(r["prompt_tokens"]) == 2
    assert all(t > 0 for t in r["prompt_seconds"]) and r["ms_per_token"] > 0
    assert 1 <= r["tokens"] <= 2 * MAX_NEW and r["target_calls"] >= 1
  s = result["settings"]
  for field in (
    "transformers",
    "torch",
    "jax",
    "torch_threads",
    "cpu_count",
    "gamma",
    "max_new_tokens",
    "repeats",
    "hf_attn_implementation",
  ):
    assert field in s, field
  assert s["torch_threads"] == 1 and s["gamma"] == GAMMA
  effective = result["systems"]["hf_assisted"]["settings"]["effective"]
  assert effective == dict(
    num_assistant_tokens=GAMMA,
    num_assistant_tokens_schedule="constant",
    assistant_confidence_threshold=0.0,
  )


@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
def test_speedups_and_ratios_recompute(result):
  systems = result["systems"]
  for r in systems.values():
    assert math.isclose(r["ms_per_token"], r["seconds"] * 1e3 / r["tokens"])
    base = systems[r["baseline"]]
    assert r["baseline"] == (
      "hf_baseline" if r["implementation"] == "transformers" else "specdec_baseline"
    )
    assert math.isclose(r["speedup"], base["ms_per_token"] / r["ms_per_token"])
  assert systems["hf_baseline"]["speedup"] == systems["specdec_baseline"]["speedup"] == 1
  spec = systems["specdec_speculative"]
  assert [q["hf_system"] for q in result["ratios"]] == [
    "hf_assisted",
    "hf_assisted_heuristic",
    "hf_assisted_defaults",
  ]
  for q in result["ratios"]:
    hf = systems[q["hf_system"]]
    assert math.isclose(
      q["baseline_ms_per_token"],
      systems["specdec_baseline"]["ms_per_token"] / systems["hf_baseline"]["ms_per_token"],
    )
    assert math.isclose(q["speculative_ms_per_token"], spec["ms_per_token"] / hf["ms_per_token"])
    assert math.isclose(q["speedup"], spec["speedup"] / hf["speedup"])


@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
def test_all_systems_give_the_same_tokens(result):
  agreement = result["agreement"]
  assert agreement["all_agree"], agreement["disagreements"]
  assert agreement["identical"] == {n: 2 for n in compare_hf.system_names(GAMMA)}
  systems = result["systems"]
  assert len({tuple(r["prompt_tokens"]) for r in systems.values()}) == 1
  # gamma drafts per iteration, as in Algorithm 1, on both sides.
  assert systems["specdec_speculative"]["draft_calls"] == (
    GAMMA * systems["specdec_speculative"]["target_calls"]
  )
  assert systems["hf_baseline"]["target_calls"] == systems["hf_baseline"]["tokens"]
  assert systems["specdec_baseline"]["target_calls"] == systems["specdec_baseline"]["tokens"]


@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
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


# ------------------------------------------------------------------------------
# The decoder-only pair (--hf_pair=smollm2_135m_instruct), on tiny random Llamas.
# ------------------------------------------------------------------------------
LM_VOCAB, LM_PAD, LM_PAD_MULTIPLE = 96, 2, 8


def _lm_prompts():
  rng = np.random.default_rng(4)
  return [rng.integers(4, LM_VOCAB, n).tolist() + [3] for n in (5, 11)]


@pytest.fixture(scope="module")
def lm_pair(tmp_path_factory):
  """Tiny random specdec Llamas, their transformers copies, the prompts, and an EOS id
  that the greedy decode of prompt 0 first reaches at its third token or later (so
  stopping is exercised) with the length it stops at."""
  import jax

  from specdec.io.hf import save_hf_llama
  from specdec.models import llama

  models = []
  for seed, layers in ((1, 2), (2, 1)):
    cfg = llama.tiny_config(vocab_size=LM_VOCAB, num_layers=layers)
    model = llama.Llama(cfg, jax.device_put(llama.random_params(cfg, seed=seed)), pad_id=LM_PAD)
    path = tmp_path_factory.mktemp(f"llama{seed}")
    save_hf_llama(path, cfg, model.params)
    models.append((model, compare_hf.load_hf_llama(path, model)))
  (target, hf_target), (draft, hf_draft) = models
  prompts = compare_hf.pad_prompts(_lm_prompts(), LM_PAD, LM_PAD_MULTIPLE)
  free = compare_hf.specdec_tokens(
    compare_hf.autoregressive_sample(
      target,
      jax.numpy.asarray(prompts[0]),
      jax.random.key(0),
      max_new_tokens=MAX_NEW,
      sampling=compare_hf.GREEDY,
      eos_id=None,
    )
  )
  stop = next(j for j in range(2, len(free)) if free[j] not in free[:j])
  return target, draft, hf_target, hf_draft, prompts, (free[stop], stop + 1)


@pytest.fixture(scope="module")
def lm_result(lm_pair):
  from specdec.drafts import lookup

  target, draft, hf_target, hf_draft, prompts, (eos, _) = lm_pair
  return compare_hf.run_comparison(
    target,
    draft,
    hf_target,
    hf_draft,
    prompts,
    gamma=GAMMA,
    max_new_tokens=MAX_NEW,
    repeats=1,
    threads=1,
    eos_id=eos,
    pad_id=LM_PAD,
    lookup_draft=lookup.ContextLookup.create(draft, 0.8, 1, 3),
  )


def test_lm_prompts_are_padded_for_specdec_only(lm_pair):
  prompts = lm_pair[4]
  assert [p.shape for p in prompts] == [(1, 8), (1, 16)]
  for p, ids in zip(prompts, _lm_prompts()):
    unpadded, mask = compare_hf._unpadded(p, LM_PAD)
    assert unpadded[0].tolist() == ids and mask.sum() == len(ids)
    assert (p[0, len(ids) :] == LM_PAD).all()


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
def test_lm_pair_every_system_gives_the_specdec_baseline_tokens(lm_pair, lm_result):
  eos, stop = lm_pair[5]
  agreement = lm_result["agreement"]
  assert agreement["all_agree"], agreement["disagreements"]
  names = compare_hf.system_names(GAMMA, lookup=True)
  assert agreement["identical"] == {n: 2 for n in names}
  assert list(lm_result["systems"]) == names
  assert lm_result["systems"]["hf_prompt_lookup"]["settings"]["max_matching_ngram_size"] == 3
  assert [(q["specdec_system"], q["hf_system"]) for q in lm_result["ratios"]][-1] == (
    "specdec_speculative_lookup",
    "hf_prompt_lookup",
  )
  systems = lm_result["systems"]
  for name, r in systems.items():
    for field in SYSTEM_FIELDS:
      assert field in r, (name, field)
    # Both implementations stop on the EOS of prompt 0 (not at max_new_tokens), and
    # transformers' outputs exclude the prompt.
    assert r["prompt_tokens"][0] == stop < MAX_NEW, name
    assert r["speedup"] > 0
  assert lm_result["reference_tokens"][0][-1] == eos
  assert systems["specdec_speculative"]["draft_calls"] == (
    GAMMA * systems["specdec_speculative"]["target_calls"]
  )
  assert systems["hf_baseline"]["target_calls"] == systems["hf_baseline"]["tokens"]
  s = lm_result["settings"]
  assert s["family"] == "decoder-only" and s["eos_id"] == eos
  assert s["prompt_tokens"] == [6, 12] and s["input_lengths"] == [8, 16]
  assert s["hf_generate_kwargs"] == dict(
    eos_token_id=eos, pad_token_id=eos, min_length=0, min_new_tokens=None
  )
  assert "decoder_start_token_id" not in s
  assert "chat prompts of 6-12 tokens" in compare_hf.markdown(lm_result)


def test_lm_hf_tokens_drop_the_prompt():
  torch = pytest.importorskip("torch")
  assert compare_hf.hf_tokens(torch.tensor([[9, 8, 3, 5, 7, 4, 4]]), eos_id=7, start=3) == [5, 7]


def test_load_hf_llama_refuses_other_weights(lm_pair, tmp_path):
  import jax

  from specdec.io.hf import save_hf_llama

  draft = lm_pair[1]
  save_hf_llama(tmp_path, draft.config, draft.params)
  other = draft.replace(params=jax.tree.map(lambda x: x + 1e-3, draft.params))
  with pytest.raises(ValueError, match="differently from the specdec model's weights"):
    compare_hf.load_hf_llama(tmp_path, other)


@pytest.mark.slow
def test_the_shipped_lm_pair_loads_in_transformers_with_the_same_weights():
  """The real pair (skips without its draft): transformers' draft holds specdec's
  weights, and one greedy decode of a held-out prompt agrees on both sides."""
  from specdec import pretrained

  pytest.importorskip("gguf")
  try:
    pretrained.lm_draft_path(compare_hf.LM_PAIR)
    pretrained.lm_path(compare_hf.LM_PAIR, verify=False)
  except (AttributeError, FileNotFoundError, ValueError, KeyError) as e:
    pytest.skip(f"the shipped pair {compare_hf.LM_PAIR} is not here: {e}")
  name = pretrained.lm_transformers_draft(compare_hf.LM_PAIR)
  target, draft, tok = pretrained.load_pair(compare_hf.LM_PAIR, draft=name)
  hf_target, hf_draft = compare_hf.load_hf_lm_pair(compare_hf.LM_PAIR, draft, name)
  ids = tok.apply_chat_template(
    [{"role": "user", "content": pretrained.lm_eval_prompts(compare_hf.LM_PAIR)[0]}]
  )
  prompts = compare_hf.pad_prompts([ids], target.pad_id, 32)
  result = compare_hf.run_comparison(
    target,
    draft,
    hf_target,
    hf_draft,
    prompts,
    gamma=3,
    max_new_tokens=8,
    repeats=1,
    eos_id=tok.eos_id,
    pad_id=target.pad_id,
  )
  assert result["agreement"]["all_agree"], result["agreement"]["disagreements"]


@pytest.mark.slow  # Shares the benchmark run's fixture; after the default suite.
def test_the_subcommand_checks_its_config_and_renders(result):
  for bad, match in (
    (dict(pair="nope"), "pair"),
    (dict(gamma=0), "gamma"),
    (dict(sentences=0), "sentences"),
  ):
    with pytest.raises(ValueError, match=match):
      compare_hf.run(compare_hf.Config(**bad))
  text = compare_hf.render(dict(result, settings=dict(result["settings"], pair="tiny")))
  assert text.startswith("specdec vs transformers") and "hf_assisted" in text


@pytest.mark.slow
def test_the_subcommand_runs_on_the_shipped_pair():
  out = compare_hf.run(compare_hf.Config(sentences=1, max_new_tokens=6, repeats=1, progress=False))
  assert out["agreement"]["all_agree"] and out["settings"]["pair"] == "multi30k_ende"
