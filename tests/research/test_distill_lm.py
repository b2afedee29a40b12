"""The distill_lm pipeline's pieces (scripts/research/lm_*.py, distill_lm.py): early
stopping on validation loss, the best checkpoint shipped, the shortlist, the decode
caches and their transformers twins, and the model card's words."""

import dataclasses
import json
import types

import jax
import numpy as np
import pytest

import distill_lm
import lm_card
import lm_decodes
import lm_evaluation
import lm_training

pytestmark = pytest.mark.research


def _history(losses, every=100):
  return [
    dict(step=i * every, train_loss=0.0, val_loss=v, seconds=60.0 * i) for i, v in enumerate(losses)
  ]


@pytest.mark.parametrize(
  "losses, patience, expected",
  [
    ([11.5, 5.4, 4.8, 4.4, 4.5, 4.6], 2, True),  # two above the best (4.4)
    ([11.5, 5.4, 4.8, 4.4, 4.5], 2, False),  # one only
    ([11.5, 5.4, 4.4, 4.6, 4.3], 2, False),  # a new best resets it
    ([11.5, 5.4, 4.4, 4.4, 4.4], 2, False),  # equal to the best is not worse
    ([11.5, 5.4, 4.4, 4.6, 4.7], 0, False),  # patience 0: never
    ([4.0, 4.1], 2, False),  # too short to tell
    ([4.0, 4.1, 4.2], 2, True),
  ],
)
def test_stopped(losses, patience, expected):
  assert lm_training.stopped(_history(losses), patience) is expected


def test_finish_training_ships_the_best_validation(tmp_path):
  (tmp_path / "params.msgpack").write_bytes(b"last")
  (tmp_path / lm_training.BEST_PARAMS).write_bytes(b"best")
  history = _history([11.5, 5.4, 4.38, 4.47, 4.60])
  data = [(np.arange(3), np.arange(5), None)] * 64
  settings = lm_training.TrainSettings(batch_size=32)
  out = lm_training.finish_training(str(tmp_path), history, 1160, data, top_k=0, s=settings)
  assert (tmp_path / "params.msgpack").read_bytes() == b"best"
  assert not (tmp_path / lm_training.BEST_PARAMS).exists()
  assert (out["steps"], out["planned_steps"], out["stopped_at"]) == (200, 1160, 400)
  assert out["final_val_loss"] == 4.38
  assert out["minutes"] == 2.0
  assert out["epochs"] == 100.0  # 200 steps of 32 sequences over 64
  assert (out["batch_size"], out["soft_targets"]["weight"]) == (32, 0.0)


def test_save_if_best_writes_only_a_new_best_including_the_initial_one(tmp_path):
  best = tmp_path / lm_training.BEST_PARAMS
  lm_training.save_if_best(str(tmp_path), _history([4.0]), {"w": np.zeros(2)})
  assert best.exists()  # the initialisation's validation is a candidate too
  first = best.read_bytes()
  lm_training.save_if_best(str(tmp_path), _history([4.0, 4.5]), {"w": np.ones(2)})
  assert best.read_bytes() == first
  lm_training.save_if_best(str(tmp_path), _history([4.0, 4.5, 3.9]), {"w": np.ones(2)})
  assert best.read_bytes() != first


def test_finish_training_without_a_best_file_keeps_params(tmp_path):
  (tmp_path / "params.msgpack").write_bytes(b"only")
  out = lm_training.finish_training(
    str(tmp_path),
    _history([5.0, 4.0]),
    100,
    [(np.arange(2), np.arange(2), None)],
    top_k=0,
    s=lm_training.TrainSettings(),
  )
  assert (tmp_path / "params.msgpack").read_bytes() == b"only"
  assert out["steps"] == out["stopped_at"] == 100


def test_shortlist_ids_keeps_special_ids_first_then_frequency():
  data = [
    (np.array([1]), np.array([7, 7, 7, 5, 5, 9, 2]), None),
    (np.array([1]), np.array([5, 7, 3, 2]), None),
  ]
  ids = lm_training.shortlist_ids(data, size=4, keep=[2, 0])
  # 2 and 0 (EOS, padding) first, even though 0 never occurs; then 7 (4x), 5 (3x).
  np.testing.assert_array_equal(ids, [2, 0, 7, 5])
  assert ids.dtype == np.int32
  # Ties by id: 3 and 9 occur once each.
  np.testing.assert_array_equal(lm_training.shortlist_ids(data, 6, [2]), [2, 7, 5, 3, 9])


def test_write_card_keeps_the_hand_written_section(tmp_path, monkeypatch):
  generated = "# Card\n\n## Data\n\nnew facts\n\n## Limitations\n\nlimits\n"
  monkeypatch.setattr(lm_card, "model_card", lambda info: generated)
  lm_card.write_card(str(tmp_path), {})
  card = (tmp_path / "MODEL_CARD.md").read_text()
  assert card == generated  # nothing to keep on a first card
  hand = f"{lm_card.KEPT_SECTION} (by hand)\n\nc = 0.050, 1.2x\n"
  (tmp_path / "MODEL_CARD.md").write_text(card.replace("## Limitations", hand + "\n## Limitations"))
  lm_card.write_card(str(tmp_path), {})
  card = (tmp_path / "MODEL_CARD.md").read_text()
  assert card.count(lm_card.KEPT_SECTION) == 1
  assert card.index("new facts") < card.index("c = 0.050, 1.2x") < card.index("## Limitations")
  assert lm_card.kept_section("no such section") == ""


def test_responses_cut_at_the_first_eos_and_pad_after_it():
  generated = np.array([[5, 7, 2, 9, 2], [5, 6, 7, 8, 9], [2, 3, 3, 3, 3]])
  tokens, lengths = lm_decodes.responses(generated, eos_id=2, pad_id=0)
  np.testing.assert_array_equal(lengths, [3, 5, 1])
  np.testing.assert_array_equal(tokens, [[5, 7, 2, 0, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])


def _tiny_llama(tmp_path, vocab=64):
  from specdec.io.hf import save_hf_llama
  from specdec.models import llama

  cfg = llama.LlamaConfig(
    vocab_size=vocab,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    rope_theta=10000.0,
    tie_word_embeddings=True,
  )
  params = llama.random_params(cfg, 3)
  save_hf_llama(tmp_path / "draft", cfg, params)
  return cfg, params


def test_transformers_greedy_decodes_equal_specdec_ones(tmp_path):
  """The transformers backend's files hold what specdec's do, for the same weights
  (float32, greedy): left padding, EOS and lengths handled alike."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from specdec.models import llama

  cfg, params = _tiny_llama(tmp_path)
  prompts = [[1, 9, 14, 3], [1, 22], [1, 40, 41, 42, 43, 44, 45], [1, 7, 7]]
  target = llama.Llama(cfg, jax.device_put(params)).replace(pad_id=0)
  decode = lambda tok: lm_decodes.decode_batch(
    target, tok, prompts, 4, 12, lm_decodes.GREEDY, jax.random.key(0)
  )
  # EOS: a token the first decode emits at its 4th step, so that rows end early.
  first = decode(types.SimpleNamespace(eos_id=None, pad_id=0))
  tok = types.SimpleNamespace(eos_id=int(first["tokens"][0, 3]), pad_id=0)
  ours = decode(tok)
  hf = transformers.LlamaForCausalLM.from_pretrained(
    str(tmp_path / "draft"), dtype=torch.float32
  ).eval()
  theirs = lm_decodes.decode_batch_transformers(hf, tok, prompts, 12, 0.0, seed=0)
  assert (ours["lengths"] < 12).any(), "no decode met EOS: the test shows too little"
  for key in ("inputs", "prompt_lengths", "tokens", "lengths"):
    np.testing.assert_array_equal(theirs[key], ours[key], err_msg=key)


def test_warm_start_rejects_a_draft_of_another_shape(tmp_path):
  cfg, params = _tiny_llama(tmp_path)
  loaded = lm_training.warm_start_params(str(tmp_path / "draft"), cfg)
  np.testing.assert_allclose(
    loaded["token_embedder"]["embedding"],
    np.asarray(params["token_embedder"]["embedding"]),
    rtol=1e-6,
  )
  with pytest.raises(ValueError, match="init_from"):
    lm_training.warm_start_params(str(tmp_path / "draft"), dataclasses.replace(cfg, hidden_size=48))
  assert lm_training.warm_start_shortlist(str(tmp_path / "draft")) is None


def test_warm_start_record_and_words_name_the_earlier_draft(tmp_path):
  (tmp_path / "draft").mkdir()
  (tmp_path / "pair.json").write_text(
    json.dumps(
      dict(
        draft=dict(
          training=dict(
            steps=600, batch_size=32, minutes=31.2, response_tokens=311821, history=[1, 2]
          )
        ),
        data=dict(decodes_words="3360 prompts"),
        metrics=dict(teacher_forced_alpha={"0": 0.379, "1": 0.281}),
      )
    )
  )
  record = lm_training.warm_start_record(str(tmp_path / "draft"))
  assert "history" not in record["training"]
  assert record["data"]["decodes_words"] == "3360 prompts"
  words = lm_card.warm_start_words(dict(warm_start=record))
  assert words == (
    "from an earlier draft (600 steps of 32 sequences, 31.2 min, on "
    "311,821 response tokens; teacher-forced alpha 0.379 / 0.281), "
    "then "
  )
  assert lm_card.warm_start_words({}) == ""


def test_transformers_soft_targets_equal_specdec_ones(tmp_path):
  """The `soft` stage's transformers pass gives the target's top-k log-probs at the
  same response positions as specdec's teacher-forced `extend` (float32)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import jax.numpy as jnp

  from specdec.models import llama

  cfg, params = _tiny_llama(tmp_path)
  tok = types.SimpleNamespace(eos_id=None, pad_id=0)
  prompts = [[1, 9, 14, 3], [1, 22], [1, 40, 41, 42, 43, 44, 45]]
  target = llama.Llama(cfg, jax.device_put(params)).replace(pad_id=0)
  b = lm_decodes.decode_batch(target, tok, prompts, 3, 6, lm_decodes.GREEDY, jax.random.key(0))
  ours_v, ours_i = lm_decodes._top_log_probs(
    target, jnp.asarray(b["inputs"]), jnp.asarray(b["tokens"]), top_k=4
  )
  hf = transformers.LlamaForCausalLM.from_pretrained(
    str(tmp_path / "draft"), dtype=torch.float32
  ).eval()
  theirs_v, theirs_i = lm_decodes.top_log_probs_transformers(
    hf, [np.asarray(p) for p in prompts], b["tokens"], 4, chunk=2
  )
  np.testing.assert_array_equal(theirs_i, np.asarray(ours_i))
  np.testing.assert_allclose(theirs_v, np.asarray(ours_v), atol=1e-4)


def test_round_pools_swap_parity_every_round_and_refuse_repeated_greedy_decodes():
  prompts = list(range(20))
  first = dict(greedy=0, sampled=0)
  greedy0, sampled0 = lm_decodes.round_pools(prompts, 0, first, 100, 100)
  greedy1, sampled1 = lm_decodes.round_pools(prompts, 1, first, 100, 100)
  assert greedy0 == sampled1 == list(range(0, 20, 2))
  assert sampled0 == greedy1 == list(range(1, 20, 2))
  # Counts and skips apply within each pool.
  assert lm_decodes.round_pools(prompts, 1, dict(greedy=2, sampled=1), 3, 2) == ([5, 7, 9], [2, 4])
  assert lm_decodes.round_pools(prompts, 2, first, 0, 3) == ([], [1, 3, 5])
  with pytest.raises(ValueError, match="data_round"):
    lm_decodes.round_pools(prompts, 2, first, 1, 3)
  # Round 0 decoded greedily from its 4th greedy prompt on (--first_greedy=3): round 2
  # may decode the 3 before it, and no more.
  assert lm_decodes.round_pools(prompts, 2, first, 3, 0, greedy_before=3) == ([0, 2, 4], [])
  with pytest.raises(ValueError, match="at most 3"):
    lm_decodes.round_pools(prompts, 2, first, 4, 0, greedy_before=3)
  with pytest.raises(ValueError, match="at most 1"):
    lm_decodes.round_pools(prompts, 2, dict(greedy=2, sampled=0), 2, 0, greedy_before=3)
  with pytest.raises(ValueError, match="data_round"):
    lm_decodes.round_pools(prompts, -1, first, 1, 3)


def _write_batch(directory, lengths):
  directory.mkdir(parents=True, exist_ok=True)
  rows, width = len(lengths), max(lengths)
  np.savez(
    directory / f"batch_0000_{len(list(directory.iterdir())):02d}.npz",
    inputs=np.ones((rows, 3), np.int32),
    prompt_lengths=np.full(rows, 3),
    tokens=np.ones((rows, width), np.int32),
    lengths=np.asarray(lengths),
  )


def test_rounds_on_disk_are_counted_and_described_round_by_round(tmp_path):
  out = str(tmp_path)
  _write_batch(tmp_path / "gen_train_t0", [4, 5])
  _write_batch(tmp_path / "gen_train_t1", [6])
  _write_batch(tmp_path / "gen_train_t0_r1", [7, 8, 9])
  _write_batch(tmp_path / "gen_train_t0_r10", [1])
  (tmp_path / "gen_train_t0_rx").mkdir()  # not a round
  assert lm_decodes.round_dirs(out, "train_t0") == [
    str(tmp_path / d) for d in ("gen_train_t0", "gen_train_t0_r1", "gen_train_t0_r10")
  ]
  assert lm_decodes.round_dirs(out, "train_t1") == [str(tmp_path / "gen_train_t1")]
  counts = lm_decodes.round_counts(out)
  assert list(counts) == ["0", "1", "10"]
  assert counts["0"] == dict(rows={"0": 2, "1": 1}, tokens={"0": 9, "1": 6})
  assert counts["1"] == dict(rows={"0": 3, "1": 0}, tokens={"0": 24, "1": 0})
  # A summary from before rounds keeps round 0's record at its top level.
  summary = dict(
    generate_backend="transformers_bf16",
    generate_minutes=21.8,
    first_prompts=dict(greedy=3360, sampled=1536),
    rounds={
      "1": dict(
        generate_backend="specdec",
        gen_batch=32,
        first_prompts=dict(greedy=0, sampled=0),
        generate_minutes=3.0,
      )
    },
  )
  assert lm_decodes.round_record(summary, 0)["generate_minutes"] == 21.8
  assert lm_decodes.round_record(summary, 1)["generate_backend"] == "specdec"
  assert lm_decodes.round_record(summary, 10) == {}
  words = lm_card.decodes_words(dict(list(counts.items())[:2]), summary, 96)
  assert words.startswith(
    "Round 0: 2 training prompts (the even ones of the training order after the "
    "first 3360 greedy and 1536 sampled ones, decoded for an earlier draft) "
    "decoded greedily (9 response tokens) and 1 (the odd ones) sampled"
  )
  assert "in bfloat16), 21.8 min. Round 1: 3 training prompts (the odd ones of" in words
  # Round 1 sampled nothing: its empty pool is left out, not counted as "0 (...)".
  assert (
    "Round 1: 3 training prompts (the odd ones of the training order) decoded "
    "greedily (24 response tokens), at most 96 new tokens each"
  ) in words
  assert words.endswith("(batches of 32, `specdec.autoregressive_sample`, float32), 3.0 min.")


def test_the_card_reads_a_patience_stop_as_a_data_limit_not_as_still_falling():
  history = _history([4.09, 3.93, 3.80, 3.83, 3.815, 3.806], every=50)
  # Stopped by --patience at step 250 of 400 planned: its last loss is within 0.01
  # of the best, yet no later validation was lower.
  stopped = dict(history=history, steps=100, stopped_at=250, planned_steps=400)
  words = lm_card.training_verdict(stopped)
  assert words.startswith(
    "and no later validation was lower (the run stopped at "
    "step 250, 3.806), so it is limited by data"
  )
  assert "still falling" not in words
  ran_out = dict(history=history[:3], steps=100, stopped_at=100, planned_steps=100)
  assert lm_card.training_verdict(ran_out).startswith(
    "and was still falling at the last step (3.800 at step 100)"
  )
  # Ran its planned steps, best one validation before the end, the last 0.009 above
  # it: flat, not falling.
  flat = dict(
    history=_history([3.80, 3.76, 3.754, 3.763], every=50),
    steps=100,
    stopped_at=150,
    planned_steps=150,
  )
  words = lm_card.training_verdict(flat)
  assert words.startswith(
    "and stayed within 0.01 of it after, without falling "
    "further (3.763 at the last step, 150): a plateau"
  )
  assert "still falling" not in words
  rose = dict(
    history=_history([4.09, 3.93, 3.80, 3.95], every=50),
    steps=100,
    stopped_at=150,
    planned_steps=150,
  )
  assert lm_card.training_verdict(rose).startswith("and rose after")


def test_package_keeps_the_shipped_shape_measurements_unless_it_has_its_own():
  old = dict(
    draft=dict(steps=1),
    draft_full=dict(alpha=0.3),
    metrics={},
    candidates=dict(d128_l1=dict(c=0.078)),
    context_lookup=dict(weight=0.8, best_gamma={"0": 4}),
  )
  kept = distill_lm.kept_from_shipped(old, summary={})
  assert kept == dict(
    draft_full=dict(alpha=0.3),
    candidates=dict(d128_l1=dict(c=0.078)),
    context_lookup=dict(weight=0.8, best_gamma={"0": 4}),
  )
  fresh = distill_lm.kept_from_shipped(old, dict(candidates=dict(d256_l1=dict(c=0.17))))
  assert fresh["candidates"] == dict(d256_l1=dict(c=0.17))
  assert distill_lm.kept_from_shipped({}, {}) == {}


def test_the_card_reports_the_lookup_draft_beside_the_draft_alone():
  cl = dict(
    weight=0.8,
    min_ngram=2,
    max_ngram=4,
    max_new_tokens=96,
    gamma=4,
    teacher_forced_alpha={"0": 0.631, "1": 0.363},
    speculative={
      "0": dict(alpha_hat=0.611, tokens_per_iteration=2.27, rows=64, identical_to_greedy=64),
      "1": dict(alpha_hat=0.362, tokens_per_iteration=1.54, rows=64),
    },
    costs=dict(t_q=0.00095, c=0.038),
    predicted={"0": {"1": 1.5, "3": 1.96}, "1": {"1": 1.26, "3": 1.33}},
    best_gamma={"0": 3, "1": 2},
  )
  info = dict(metrics=dict(teacher_forced_alpha={"0": 0.451, "1": 0.347}), context_lookup=cl)
  text = "\n".join(lm_card.lookup_card_lines(info))
  assert "| 0 | 0.631 | 0.451 | 0.611 | 2.27 |" in text
  assert "64 of 64" in text and "c = 0.038" in text
  assert "| temperature 0 | 1.50x | 1.96x |" in text
  assert "gamma 3 at temperature 0, gamma 2 at temperature 1" in text
  # Settings alone (no measurements yet): no section.
  assert lm_card.lookup_card_lines(dict(context_lookup=dict(weight=0.8))) == []
  assert lm_card.lookup_card_lines({}) == []


def test_the_evaluated_draft_is_packed_as_load_pair_packs_it():
  """`--stages=evaluate` and `lookup` time the shipped draft; they must time the one
  `pretrained.load_pair` gives users (packed weights, in bfloat16 for its bfloat16
  values), not an unpacked copy that costs 1.5x per step."""
  pytest.importorskip("gguf")
  from specdec import pretrained
  from specdec.backends import cpu

  if not cpu.enabled():
    pytest.skip("no CPU kernel here: nothing is packed")
  try:
    pretrained.lm_path("smollm2_135m_instruct", verify=False)
  except FileNotFoundError as e:
    pytest.skip(f"the SmolLM2 wheel is not installed (`make test` installs it): {e}")
  target, draft, tok = pretrained.load_pair("smollm2_135m_instruct")
  evaluated = lm_evaluation.shipped_draft(str(pretrained.lm_draft_path()), target, tok)

  def dtypes(model):
    return jax.tree.map(lambda a: str(a.dtype), model.inner.packed)

  assert evaluated.inner.packed is not None
  assert dtypes(evaluated) == dtypes(draft)
  assert set(jax.tree.leaves(dtypes(evaluated))) == {"bfloat16"}
  assert evaluated.pad_id == draft.pad_id == tok.pad_id


def test_importing_the_pipelines_registers_no_flag():
  """Their flags are defined only when run as commands: importing them (these tests
  do) leaves absl's one registry to the library's own commands."""
  from absl import flags

  import distill_eagle  # noqa: F401 - imported for its side effects
  import package_pair  # noqa: F401 - imported for its side effects
  import train_pair  # noqa: F401 - imported for its side effects

  for name in ("soft_weight", "eagle_stages", "draft_data", "distilled_dir"):
    assert name not in flags.FLAGS, name


def test_train_settings_refuse_a_bad_value_by_name():
  with pytest.raises(ValueError, match="embedding_init"):
    lm_training.TrainSettings(embedding_init="pca")
  with pytest.raises(ValueError, match="batch_size"):
    lm_training.TrainSettings(batch_size=0)


def test_config_json_drops_what_a_checkpoint_does_not_fix():
  from specdec.models import llama, t5

  from common import config_json

  fields = config_json(llama.tiny_config())
  assert "dtype" not in fields and fields["vocab_size"] == llama.tiny_config().vocab_size
  t5_fields = config_json(t5.tiny_config("1.1"))
  assert "dropout_rate" not in t5_fields and "dtype" not in t5_fields
  assert isinstance(t5_fields["mlp_activations"], list)
  assert json.loads(json.dumps(t5_fields)) == t5_fields


def test_corpus_alpha_is_the_mean_beta_over_every_batch():
  """alpha over cached batches pools every generated position of every batch (a
  position-weighted mean, not a mean of per-batch means), from specdec's betas."""
  from llama_helpers import tiny_model

  from specdec.bench.alpha import teacher_forced_betas

  target, draft = tiny_model(0), tiny_model(1)
  sampling = lm_decodes.SAMPLED
  rng = np.random.default_rng(0)
  batches = [
    dict(
      inputs=rng.integers(1, 32, (n, 4)).astype(np.int32),
      tokens=rng.integers(1, 32, (n, 6)).astype(np.int32),
      lengths=np.asarray(lengths, np.int32),
    )
    for n, lengths in ((2, [6, 2]), (1, [3]))
  ]
  betas = np.concatenate(
    [
      np.concatenate(
        teacher_forced_betas(target, draft, b["inputs"], b["tokens"], b["lengths"], sampling)
      )
      for b in batches
    ]
  )
  assert len(betas) == 11
  alpha = lm_evaluation.corpus_alpha(target, draft, batches, sampling)
  np.testing.assert_allclose(alpha, betas.mean(), rtol=1e-6)
  assert 0 < alpha < 1


def test_training_lowers_the_validation_loss_and_resumes_where_it_stopped(tmp_path):
  """A tiny draft on a learnable toy (every response is the same 4 tokens): validation
  loss falls, the summary says what ran, and a rerun of a finished run trains no more."""
  from specdec.models import llama

  cfg = llama.LlamaConfig(
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    rope_theta=10000.0,
    tie_word_embeddings=True,
  )
  target_params = llama.random_params(dataclasses.replace(cfg, hidden_size=48, head_dim=24), 0)
  rng = np.random.default_rng(0)

  def toy(n):
    rows = [rng.integers(2, 32, rng.integers(2, 6)).astype(np.int32) for _ in range(n)]
    return [(p, np.asarray([7, 8, 9, 1], np.int32), None) for p in rows]

  data, validation = toy(64), toy(8)
  s = lm_training.TrainSettings(
    batch_size=8,
    train_steps=20,
    learning_rate=1e-2,
    warmup_steps=4,
    eval_every=10,
    checkpoint_every=10,
    patience=0,
    max_new_tokens=8,
  )
  out = lm_training.train(cfg, target_params, data, validation, str(tmp_path), 0, s)
  losses = [h["val_loss"] for h in out["history"]]
  assert [h["step"] for h in out["history"]] == [0, 10, 20]
  assert losses[-1] < losses[0] - 1.0
  assert out["steps"] == 20 and out["sequences"] == 64
  assert out["embedding_init"] == "svd" and out["epochs"] == 2.5
  assert (tmp_path / "train" / "params.msgpack").exists()
  again = lm_training.train(cfg, target_params, data, validation, str(tmp_path), 0, s)
  assert again["history"] == out["history"]


def test_the_shipped_card_is_what_its_pair_json_writes(tmp_path):
  """Every number and word of the shipped SmolLM2 card comes from pair.json and the
  hand-written section it keeps (the script's path aside, which moved to
  scripts/research after the card was written)."""
  from specdec import pretrained

  shipped_dir = pretrained.WEIGHTS_DIR / "smollm2_135m_instruct"
  shipped = (shipped_dir / "MODEL_CARD.md").read_text()
  (tmp_path / "MODEL_CARD.md").write_text(shipped)
  lm_card.write_card(str(tmp_path), json.loads((shipped_dir / "pair.json").read_text()))
  assert (tmp_path / "MODEL_CARD.md").read_text() == shipped.replace(
    "`scripts/distill_lm.py", "`scripts/research/distill_lm.py"
  )
