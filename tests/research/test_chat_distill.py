"""The chat distillation data and objectives of scripts/research (`lm_eval_sets`,
`lm_chat_prompts`, the 'tv' and 'kd' objectives of `lm_training`), and a smoke run of
the pipeline on a tiny target: user turns it writes, its decodes, soft targets,
training with each objective, resuming, and alpha."""

import hashlib
import json
import pathlib

import jax
import jax.numpy as jnp
import lm_chat_prompts
import lm_eval_sets
import numpy as np
import pytest

from specdec.data import lm_prompts
from specdec.models import llama

import lm_decodes
import lm_evaluation
import lm_training

pytestmark = pytest.mark.research


# ------------------------------------------------------------------------------
# Evaluation sets.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(lm_eval_sets.SETS))
def test_each_evaluation_set_has_at_least_48_distinct_prompts(name):
  contents = lm_eval_sets.contents(name)
  assert len(contents) >= 48
  assert len(set(contents)) == len(contents)
  assert all(c.strip() for c in contents)


def test_the_summaries_are_of_held_out_articles_and_rebuild_from_the_data():
  rows = lm_eval_sets.load("cnndm")
  assert all(lm_prompts.is_heldout(r["index"]) for r in rows)
  assert {r["passage"] for r in rows} == {0, 1}
  assert rows == lm_eval_sets.cnndm_prompts()
  # None of them uses a training instruction.
  training_instructions = {i for v in lm_prompts.INSTRUCTIONS.values() for i in v}
  assert not any(r["content"].startswith(i) for r in rows for i in training_instructions)


def test_todays_evaluation_prompts_are_frozen_unchanged():
  path = lm_eval_sets.path("eval_prompts")
  assert hashlib.sha256(path.read_bytes()).hexdigest() == lm_eval_sets.SHIPPED_EVAL_PROMPTS_SHA256
  assert len(lm_eval_sets.load("eval_prompts")) == 64


def test_an_unknown_set_is_refused_by_name():
  with pytest.raises(ValueError, match="name"):
    lm_eval_sets.load("chats")


# ------------------------------------------------------------------------------
# Training prompts.
# ------------------------------------------------------------------------------
def _evaluation():
  texts = lm_chat_prompts.held_out_texts()
  assert set(lm_prompts.DEMO_PROMPTS) <= set(texts)
  assert set(lm_eval_sets.contents("chat")) <= set(texts)
  return texts


def test_no_evaluation_text_is_in_a_training_prompt():
  train = [p["content"] for p in lm_chat_prompts.training_prompts(_evaluation())]
  assert len(train) > 2000
  assert lm_chat_prompts.overlapping(train, _evaluation()) == []
  # Nor in the templated prompts before filtering: the templates were written apart.
  templated = [p["content"] for p in lm_chat_prompts.templated_prompts()]
  assert lm_chat_prompts.overlapping(templated, _evaluation()) == []


def test_the_overlap_check_finds_a_planted_evaluation_text():
  chat = lm_eval_sets.contents("chat")
  planted = [
    f"Please answer this: {chat[3]}",
    "Tell me a joke about cats.",
    "Summarize: " + lm_eval_sets.contents("cnndm")[0].split("\n\n")[1][:200],
    chat[5].upper(),
  ]
  assert lm_chat_prompts.overlapping(planted, _evaluation()) == [0, 2, 3]
  kept = lm_chat_prompts.training_prompts(_evaluation(), self_written=planted)
  contents = {p["content"] for p in kept}
  assert "Tell me a joke about cats." in contents
  assert not contents & {planted[0], planted[2], planted[3]}


def test_templated_prompts_cover_every_category_in_any_prefix():
  prompts = lm_chat_prompts.templated_prompts()
  categories = set(lm_chat_prompts.TEMPLATES)
  assert {p["category"] for p in prompts[: len(categories)]} == categories
  assert len({p["content"] for p in prompts}) == len(prompts)
  assert prompts == lm_chat_prompts.templated_prompts()  # a fixed order


def test_target_written_turns_are_cleaned_and_deduplicated():
  clean = lm_chat_prompts.clean_self_prompt
  assert clean("  What is   the best way to learn Spanish? ") == (
    "What is the best way to learn Spanish?"
  )
  assert clean("Hi there") is None  # too short
  assert clean("<|im_start|>assistant what is a cat and a dog") is None
  assert clean("数学 是 什么 意思 呢 请 告诉 我") is None
  assert lm_chat_prompts.dedupe(["How are you?", "how are you", "Why?"]) == ["How are you?", "Why?"]


# ------------------------------------------------------------------------------
# Objectives.
# ------------------------------------------------------------------------------
def _distributions(seed, shape=(3, 5, 16)):
  rng = np.random.default_rng(seed)
  log_p = jax.nn.log_softmax(jnp.asarray(rng.normal(size=shape) * 2, jnp.float32))
  log_q = jax.nn.log_softmax(jnp.asarray(rng.normal(size=shape) * 2, jnp.float32))
  return log_p, log_q


def test_acceptance_over_the_whole_vocabulary_is_one_minus_tv():
  log_p, log_q = _distributions(0)
  p, q = jnp.exp(log_p), jnp.exp(log_q)
  top, ids = jax.lax.top_k(log_p, 16)
  alpha = lm_training.top_k_acceptance(log_q, top, ids)
  tv = 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
  np.testing.assert_allclose(alpha, 1 - tv, atol=1e-5)
  np.testing.assert_allclose(alpha, jnp.sum(jnp.minimum(p, q), -1), atol=1e-5)


def test_acceptance_over_the_top_k_bounds_the_true_one_from_above():
  log_p, log_q = _distributions(1)
  true = jnp.sum(jnp.minimum(jnp.exp(log_p), jnp.exp(log_q)), -1)
  for k in (1, 4, 8):
    top, ids = jax.lax.top_k(log_p, k)
    alpha = lm_training.top_k_acceptance(log_q, top, ids)
    assert bool(jnp.all(alpha >= true - 1e-6)) and bool(jnp.all(alpha <= 1 + 1e-6))
  # Ids at or past the shortlist's size join the bucket: with every id there, alpha
  # is 1 (one bucket holds everything).
  top, ids = jax.lax.top_k(log_p, 4)
  np.testing.assert_allclose(
    lm_training.top_k_acceptance(log_q, top, ids, listed=0), 1.0, atol=1e-6
  )


def test_the_settings_refuse_an_unknown_objective_by_name():
  with pytest.raises(ValueError, match="objective"):
    lm_training.TrainSettings(objective="kl")
  with pytest.raises(ValueError, match="soft_weight"):
    lm_training.TrainSettings(soft_weight=1.5)


# ------------------------------------------------------------------------------
# Smoke run of the pipeline on a tiny target.
# ------------------------------------------------------------------------------
class TinyTokenizer:
  """Letters as ids 3..28, space 29; a chat template of fixed ids around the user's
  text (eos 2 ends a turn, pad 0)."""

  eos_id, pad_id = 2, 0

  def encode(self, text, add_special_tokens=True):
    del add_special_tokens
    return [3 + (ord(c) - 97) % 26 if c != " " else 29 for c in text.lower()]

  def decode(self, ids):
    return "".join(" " if i == 29 else chr(97 + (i - 3) % 26) for i in ids if 3 <= i <= 29)

  def apply_chat_template(self, messages, add_generation_prompt=True):
    ids = [30, 31]
    for m in messages:
      ids += [32] + self.encode(m["content"]) + [2]
    return ids + ([33] if add_generation_prompt else [])


def _tiny_target():
  cfg = llama.tiny_config(vocab_size=40, tie_word_embeddings=True)
  return llama.Llama(cfg, llama.random_params(cfg, 0), pad_id=0)


def test_the_pipeline_runs_on_a_tiny_target_and_resumes(tmp_path):
  target, tok = _tiny_target(), TinyTokenizer()
  # 1. The target writes user turns; a rerun adds only missing shards.
  prefix = lm_chat_prompts.user_turn_prefix(tok)
  assert prefix == [30, 31, 32]
  self_dir = str(tmp_path / "self_prompts")
  done = lm_decodes.sample_user_turns(target, tok, prefix, self_dir, 2, 4, 12, 0)
  assert done["rows"] == 8
  assert lm_decodes.sample_user_turns(target, tok, prefix, self_dir, 2, 4, 12, 0)["rows"] == 0
  rows = [
    json.loads(line)
    for n in range(2)
    for line in pathlib.Path(f"{self_dir}/self_{n:04d}.jsonl").read_text().splitlines()
  ]
  assert len(rows) == 8 and all({"text", "ended"} <= set(r) for r in rows)
  # 2. Decodes at temperatures 0 and 1, and soft targets along them.
  prompts = lm_chat_prompts.as_prompts(
    [
      dict(content=c)
      for c in (
        "what is rain",
        "how do bees fly",
        "name a cat",
        "say hi",
        "tell a story",
        "why is it cold",
      )
    ],
    "templated",
  )
  dirs = {t: str(tmp_path / f"gen_t{t}") for t in (0, 1)}
  for t in (0, 1):
    tokens = lm_decodes.generate_window(target, tok, prompts, dirs[t], 0, float(t), 4, 8, 0)
    assert tokens > 0
  import glob

  for path in sorted(glob.glob(f"{tmp_path}/gen_t*/batch_*.npz")):
    assert lm_decodes.soft_targets_one(target, path, 4, 5, float("inf")) == 1
  data = [e for t in (0, 1) for e in lm_decodes.examples(lm_decodes.load_decodes(dirs[t]))]
  assert len(data) == 12 and all(e[2] is not None for e in data)
  # 3. Each objective trains a tiny draft, the validation loss falls for the
  # sequence objective, and a rerun resumes the finished run without training more.
  cfg = llama.LlamaConfig(
    vocab_size=40,
    hidden_size=16,
    intermediate_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    rope_theta=10000.0,
    tie_word_embeddings=True,
  )
  alphas = {}
  for objective in lm_training.OBJECTIVES:
    s = lm_training.TrainSettings(
      batch_size=4,
      train_steps=12,
      learning_rate=1e-2,
      warmup_steps=2,
      eval_every=6,
      checkpoint_every=6,
      patience=0,
      max_new_tokens=8,
      top_k=5,
      objective=objective,
    )
    out_dir = str(tmp_path / objective)
    out = lm_training.train(cfg, target.params, data, data[:4], out_dir, 0, s)
    assert out["objective"] == objective and out["stopped_at"] == 12
    assert out["soft_targets"]["top_k"] == (0 if objective == "sequence" else 5)
    again = lm_training.train(cfg, target.params, data, data[:4], out_dir, 0, s)
    assert again["history"] == out["history"]
    import flax.serialization

    with open(f"{out_dir}/train/params.msgpack", "rb") as f:
      params = flax.serialization.msgpack_restore(f.read())
    draft = llama.Llama(cfg, jax.tree.map(jnp.asarray, params), pad_id=0)
    alphas[objective] = lm_evaluation.corpus_alpha(
      target, draft, lm_decodes.load_decodes(dirs[1]), lm_decodes.SAMPLED
    )
    assert 0 < alphas[objective] <= 1
  # 4. 'tv' needs soft targets.
  with pytest.raises(ValueError, match="objective"):
    lm_training.train(
      cfg,
      target.params,
      [(e[0], e[1], None) for e in data],
      data[:4],
      str(tmp_path / "none"),
      0,
      lm_training.TrainSettings(objective="tv", max_new_tokens=8),
    )


def test_round_counts_add_the_target_written_prompts_decodes(tmp_path):
  def batch(directory, lengths):
    directory.mkdir(exist_ok=True)
    n = len(lengths)
    np.savez(
      directory / "batch_0000_00.npz",
      inputs=np.ones((n, 4), np.int32),
      prompt_lengths=np.full((n,), 4, np.int32),
      tokens=np.ones((n, 8), np.int32),
      lengths=np.asarray(lengths, np.int32),
    )

  batch(tmp_path / "gen_train_t0", [3, 5])
  batch(tmp_path / "gen_self_t0", [8])
  batch(tmp_path / "gen_train_t1", [2])
  counts = lm_decodes.round_counts(str(tmp_path))
  assert counts == {"0": dict(rows={"0": 3, "1": 1}, tokens={"0": 16, "1": 2})}


def test_the_card_sentence_names_the_chat_sources():
  words = lm_chat_prompts.prompts_words(2600, 100, 33, dict(chat=52, cnndm=50), 200)
  assert words.startswith("2600 templated chat prompts")
  assert "100 user turns written by the target itself" in words
  assert "chat (52), cnndm (50)" in words and "6-grams" in words


def test_summaries_of_stages_run_at_once_keep_each_others_entries():
  import distill_lm

  loaded = dict(alpha=dict(shipped=dict(chat_t0=0.3)), rounds={"0": 1})
  # Another process added alpha['kd'] and 'soft_minutes' meanwhile.
  on_disk = dict(
    alpha=dict(shipped=dict(chat_t0=0.3), kd=dict(chat_t0=0.5)), rounds={"0": 1}, soft_minutes=3.0
  )
  now = dict(alpha=dict(shipped=dict(chat_t0=0.3), tv=dict(chat_t0=0.6)), rounds={"0": 1})
  merged = distill_lm.merge_changes(on_disk, loaded, now)
  assert merged == dict(
    alpha=dict(shipped=dict(chat_t0=0.3), kd=dict(chat_t0=0.5), tv=dict(chat_t0=0.6)),
    rounds={"0": 1},
    soft_minutes=3.0,
  )
