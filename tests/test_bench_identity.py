"""`python -m specdec.bench identity` (specdec.bench.identity): the identity rate and
the logits at a mismatch, for a tiny float32 T5 pair and a tiny random Llama target
behind an injected loader, and the subcommand on two sentences of the shipped pair."""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec.bench import identity as bench_identity
from specdec.data import lm_prompts
from specdec.models import llama

from t5_helpers import random_inputs, tiny_model

GAMMA, MAX_NEW_TOKENS = 2, 8
T5_EOS = 1
LM_VOCAB, LM_PAD, MAX_PROMPT = 260, 2, 40


class ByteTokenizer:
  """UTF-8 bytes as ids 4..259; chat = [1] + content + [2, 3]; EOS = pad = 2 (as
  SmolLM2's <|im_end|>: inside every prompt, never at its end)."""

  eos_id = pad_id = 2
  vocab_size = LM_VOCAB

  def encode(self, text, add_special_tokens=True):
    del add_special_tokens
    return [4 + b for b in text.encode()]

  def apply_chat_template(self, messages, add_generation_prompt=True):
    del add_generation_prompt
    return [1] + self.encode(messages[0]["content"]) + [2, 3]


def load_tiny_lm(name, dtype=jnp.float32):
  """`pretrained.load_lm`'s signature: a random tiny Llama and the byte tokenizer."""
  assert name == "tiny"
  cfg = llama.tiny_config(vocab_size=LM_VOCAB, dtype=dtype)
  return llama.Llama(cfg, llama.random_params(cfg, seed=1), pad_id=LM_PAD), ByteTokenizer()


@pytest.fixture(scope="module")
def pair():
  layers = dict(num_encoder_layers=1, num_decoder_layers=1)
  return tiny_model("1.1", **layers), tiny_model("1.1", seed=5, **layers)


@pytest.fixture(scope="module")
def lm_workload():
  return bench_identity.lm_workload(
    "tiny", ["bigram", "tiny_llama"], ["cnndm", "wmt_ende"], 3, MAX_PROMPT, load_lm=load_tiny_lm
  )


@pytest.mark.slow  # The benchmark command end to end; runs after the default suite.
def test_greedy_pair_is_identical_and_chunks_round_like_single_steps(pair):
  """3 rows in batches of 2 (the last padded): every row identical, the chunk/single
  differences at float32 rounding, every generated position counted once."""
  target, draft = pair
  inputs = np.asarray(random_inputs(3, 6, target.vocab_size, seed=3, pad_from={1: 4}))
  result = bench_identity.measure(
    target, {"d": draft}, inputs, [GAMMA], batch=2, max_new_tokens=MAX_NEW_TOKENS, eos_id=T5_EOS
  )
  row = result["drafts"]["d"][str(GAMMA)]
  assert (row["rows"], row["identical"], row["identity_rate"]) == (3, 3, 1.0)
  assert row["mismatches"] == []
  assert 0.0 <= row["acceptance"] <= 1.0
  assert result["gammas"][str(GAMMA)]["max_abs_chunk_minus_single"] < 1e-4
  assert 3 <= result["positions"] <= 3 * MAX_NEW_TOKENS
  assert result["min_top2_gap"] > 0.0
  assert "| float32 | d | 2 | 3/3 | 1.000 |" in bench_identity.format_table(
    dict(
      pair="tiny",
      prompts="3 rows",
      batch=2,
      max_new_tokens=MAX_NEW_TOKENS,
      backend="cpu",
      dtypes={"float32": result},
    )
  )


def test_lm_prompts_fit_alternate_tasks_and_leave_them_out_of_the_corpus(lm_workload):
  """Right-padded with pad_id, each at most MAX_PROMPT ids and ending in the chat
  template's last id; tasks alternate; no prompt text is in the bigram corpus."""
  inputs = lm_workload.inputs
  assert inputs.shape[0] == 3 and inputs.shape[1] <= MAX_PROMPT
  tok = ByteTokenizer()
  prompts, messages, corpus = bench_identity.lm_prompts(tok, ["cnndm", "wmt_ende"], 3, MAX_PROMPT)
  np.testing.assert_array_equal(inputs, lm_prompts.right_pad(prompts, LM_PAD))
  assert [m.split(":")[0] for m in messages] == ["Summarize", "Translate to German", "Summarize"]
  for p, row in zip(prompts, inputs):
    assert row[len(p) - 1] == 3 and (row[len(p) :] == LM_PAD).all()
  texts = [m.split(": ", 1)[1] for m in messages]
  assert not any(t in c for t in texts[::2] for c in corpus)  # Article prefixes.
  assert len(corpus) == 250 + 3003 - 3


def test_lm_target_teacher_forcing_feeds_the_prompts_last_token_first(lm_workload):
  """Single steps after `init` give the full forward's logits at the prompt's last
  position and the continuation's, for a right-padded row as for its unpadded self."""
  target, _ = lm_workload.load(jnp.float32)
  row = int(np.argmin((lm_workload.inputs != LM_PAD).sum(1)))  # The most padding.
  x = lm_workload.inputs[row : row + 1]
  length = int(target.prompt_lengths(jnp.asarray(x))[0])
  assert length < x.shape[1]
  continuation = np.array([[7, 9, 11]], np.int32)
  fed = bench_identity.decoder_inputs(continuation, np.asarray(target.start_tokens(x)))
  got = np.asarray(
    bench_identity.teacher_forced(target, jnp.asarray(x), jnp.asarray(fed), chunk=1)
  )[0]
  full = np.asarray(target.forward(np.concatenate([x[:, :length], continuation], 1)))[0]
  np.testing.assert_allclose(got, full[length - 1 : length + 2], atol=1e-4)


@pytest.mark.slow  # ~10 s; the real SmolLM2 pair's greedy identity is tested in
# test_pretrained_lm_pair and test_pretrained_lm.
def test_lm_greedy_decodes_are_identical_with_both_drafts(lm_workload):
  """3 prompts in batches of 2, bigram and tiny-Llama drafts: every row identical,
  chunk/single differences at float32 rounding."""
  results = bench_identity.run_workload(
    lm_workload, ["float32"], [GAMMA], batch=2, max_new_tokens=6
  )
  r = results["dtypes"]["float32"]
  assert sorted(r["drafts"]) == ["bigram", "tiny_llama"]
  for runs in r["drafts"].values():
    m = runs[str(GAMMA)]
    assert (m["rows"], m["identical"], m["mismatches"]) == (3, 3, [])
  assert r["gammas"][str(GAMMA)]["max_abs_chunk_minus_single"] < 1e-4
  assert 3 <= r["positions"] <= 3 * 6 and r["min_top2_gap"] > 0.0
  assert "target_per_position_logits" not in r
  assert "| float32 | bigram | 2 | 3/3 | 1.000 |" in bench_identity.format_table(results)


def _greedy_rows(target, inputs, start):
  """The greedy decode of one row, teacher-forced past any EOS, and its single-step
  logits [MAX_NEW_TOKENS, V]."""
  base = np.zeros(MAX_NEW_TOKENS, np.int32)
  for j in range(MAX_NEW_TOKENS):
    d = jnp.asarray(bench_identity.decoder_inputs(base[None], start))
    logits = np.asarray(bench_identity.teacher_forced(target, jnp.asarray(inputs), d, chunk=1))[0]
    base[j] = np.argmax(logits[j])
  return base, logits


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
@pytest.mark.parametrize("family", ["t5", "llama"])
def test_mismatch_report_reads_the_single_step_logits_at_the_first_difference(
  family, pair, lm_workload
):
  """A speculative row that took the runner-up at position 3: the report finds j = 3,
  the baseline's token is the single-step argmax, the margin is the top-2 gap, and
  every chunk placement of position 3 keeps the baseline's argmax."""
  if family == "t5":
    target = pair[0]
    inputs = np.asarray(random_inputs(1, 6, target.vocab_size, seed=3))
  else:
    target = lm_workload.load(jnp.float32)[0]
    inputs = lm_workload.inputs[1:2]
  base, logits = _greedy_rows(target, inputs, np.asarray(target.start_tokens(jnp.asarray(inputs))))
  spec = base.copy()
  j = 3
  spec[j] = np.argsort(logits[j])[-2]
  assert bench_identity.first_difference(base, spec) == j
  report = bench_identity.mismatch_report(target, inputs, base, spec, logits[j], j, GAMMA)
  assert report["single_top2"] == [base[j], spec[j]]
  assert report["single_margin_baseline_over_speculative"] == pytest.approx(
    report["single_top2_gap"]
  )
  assert len(report["chunk_argmaxes"]) == GAMMA + 1
  assert report["chunk_argmaxes"] == [base[j]] * (GAMMA + 1)
  assert not report["chunk_argmax_is_speculative_token"]
  assert report["max_abs_chunk_minus_single"] < 1e-4


def test_generated_mask_top2_gap_fitting_prefix_and_right_pad():
  tokens = np.array([[5, 1, 0, 0], [5, 6, 7, 8]])  # EOS 1 ends row 0.
  np.testing.assert_array_equal(
    bench_identity.generated_mask(tokens, 1), [[1, 1, 0, 0], [1, 1, 1, 1]]
  )
  np.testing.assert_allclose(bench_identity.top2_gap(np.array([[1.0, 3.0, 2.5]])), [0.5])
  assert bench_identity.first_difference(tokens[0], tokens[0]) is None
  fits = lambda n: lambda t: len(t) <= n
  assert bench_identity.fitting_prefix("A b. C d. E f.", fits(9)) == "A b. C d."
  assert bench_identity.fitting_prefix("A b. C d. E f.", fits(3)) == "A"
  assert bench_identity.fitting_prefix("A b. C d.", fits(0)) is None
  np.testing.assert_array_equal(lm_prompts.right_pad([[5, 6], [7]], 2), [[5, 6], [7, 2]])
  with pytest.raises(ValueError, match="ends with pad_id"):
    lm_prompts.right_pad([[5, 2]], 2)
  with pytest.raises(ValueError, match="no pad_id"):
    lm_prompts.right_pad([[5, 6], [7]], None)
  with pytest.raises(ValueError, match="lm_drafts: unknown draft 'trigram'"):
    bench_identity.lm_workload("tiny", ["trigram"], ["cnndm"], 1, MAX_PROMPT, load_lm=load_tiny_lm)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_subcommand_runs_on_two_sentences_of_the_shipped_pair():
  config = bench_identity.Config(
    num_sentences=2, gammas=(2,), dtypes=("float32",), batch=2, max_new_tokens=4
  )
  results = bench_identity.run(config)
  (runs,) = results["dtypes"]["float32"]["drafts"].values()
  (run_at_2,) = runs.values()
  assert run_at_2["rows"] == 2 and run_at_2["identical"] == 2
  assert "| float32 | draft_distilled | 2 | 2/2 |" in bench_identity.render(results)
  for bad, match in (
    (dict(dtypes=("float16",)), "dtypes"),
    (dict(pair="x"), "pair"),
    (dict(batch=0), "batch"),
  ):
    with pytest.raises(ValueError, match=match):
      bench_identity.run(bench_identity.Config(**bad))
