"""specdec.models.t5x_decoder: T5X's decoder-only network with a chunked cache, and,
with t5x installed, its parity with T5X's own `t5x.examples.decoder_only.network`."""

import dataclasses

from flax import traverse_util
from helpers import first_in_default
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import t5x as specdec_t5x
from specdec.distributions import SamplingConfig
from specdec.models import t5x_decoder
from specdec.models.base import DecodeModel
from specdec.sample import autoregressive_sample, speculative_sample

from t5_helpers import t5x_decoder_module as t5x_module, tiny_decoder as tiny_model

GREEDY = SamplingConfig(temperature=0.0)
# Rows of the test batch: prompt lengths P_b, an empty prompt among them.
PREFIXES = (3, 0, 6)
WIDTH = 8  # S: inputs [B, S]; P_b <= S - 1


def sequences(length, seed=0):
  """int32[3, length]: T5X's decoder inputs, BOS 0 then ids in [2, 64)."""
  x = np.random.default_rng(seed).integers(2, 64, (len(PREFIXES), length))
  x[:, 0] = t5x_decoder.BOS_ID
  return x.astype(np.int32)


def prompts(x, width=WIDTH):
  """T5X's `decoder_input_tokens * decoder_causal_attention` for prefixes PREFIXES."""
  keep = np.arange(width)[None] <= np.asarray(PREFIXES)[:, None]
  return jnp.asarray(np.where(keep, x[:, :width], 0), jnp.int32)


def full_logits(model, x):
  """float32[B, L, V]: the teacher-forced pass T5X's DecoderOnlyModel computes, with
  the prefix 0..P_b as its decoder_causal_attention."""
  causal = (np.arange(x.shape[1])[None] <= np.asarray(PREFIXES)[:, None]).astype(np.int32)
  x = jnp.asarray(x)
  return model.forward(x, jnp.ones_like(x), jnp.asarray(causal))


def rows_at(values, starts, k):
  """values[b, starts[b] + j] for j < k: [B, k, ...]."""
  index = np.asarray(starts)[:, None] + np.arange(k)[None]
  return np.take_along_axis(
    np.asarray(values), index.reshape(index.shape + (1,) * (np.ndim(values) - 2)), axis=1
  )


# ------------------------------------------------------------------ the network
def test_parameter_tree_is_t5x_decoder_only_tree():
  cfg = t5x_decoder.tiny_config(num_layers=1)
  shapes = {
    "/".join(k): v.shape
    for k, v in traverse_util.flatten_dict(t5x_decoder.param_shapes(cfg)).items()
  }
  layer = "decoder/layers_0"
  assert shapes == {
    "decoder/token_embedder/embedding": (64, 32),
    "decoder/relpos_bias/rel_embedding": (2, 32),
    f"{layer}/pre_self_attention_layer_norm/scale": (32,),
    f"{layer}/self_attention/query/kernel": (32, 16),
    f"{layer}/self_attention/key/kernel": (32, 16),
    f"{layer}/self_attention/value/kernel": (32, 16),
    f"{layer}/self_attention/out/kernel": (16, 32),
    f"{layer}/pre_mlp_layer_norm/scale": (32,),
    f"{layer}/mlp/wi_0/kernel": (32, 64),
    f"{layer}/mlp/wi_1/kernel": (32, 64),
    f"{layer}/mlp/wo/kernel": (64, 32),
    "decoder/decoder_norm/scale": (32,),
    "decoder/logits_dense/kernel": (32, 64),
  }
  tied = t5x_decoder.param_shapes(dataclasses.replace(cfg, logits_via_embedding=True))
  assert "logits_dense" not in tied["decoder"]
  axes = t5x_decoder.init_variables(cfg, jax.random.PRNGKey(0))["params_axes"]
  query = axes["decoder"]["layers_0"]["self_attention"]["query"]["kernel_axes"]
  assert query.names == ("embed", "joined_kv")


# T5X's own network at these sizes (jax.eval_shape of its init, measured with t5x).
@pytest.mark.parametrize(
  "name,count",
  [("base", 109_628_544), ("large", 341_231_104), ("xl", 1_223_527_424), ("xxl", 4_762_310_656)],
)
def test_presets_have_t5x_parameter_counts(name, count):
  assert t5x_decoder.param_count(t5x_decoder.CONFIGS[name]) == count


@pytest.mark.parametrize(
  "field,value",
  [
    ("num_layers", 0),
    ("num_heads", 0),
    ("mlp_activations", ["relu"]),
    ("mlp_activations", ("nope",)),
    ("dtype", jnp.int32),
  ],
)
def test_bad_configs_raise_errors_naming_the_field(field, value):
  cfg = dataclasses.replace(t5x_decoder.tiny_config(), **{field: value})
  with pytest.raises((TypeError, ValueError), match=f"config.{field}"):
    t5x_decoder.check_config(cfg)


def test_mask_is_causal_outside_the_prefix_and_both_ways_inside():
  targets = jnp.asarray([[5, 6, 7, 8, 0]])
  causal = jnp.asarray([[1, 1, 1, 0, 0]])
  mask = np.asarray(t5x_decoder.make_decoder_mask(targets, causal))[0, 0]
  expected = np.tril(np.ones((5, 5), bool))
  expected[:3, :3] = True
  expected[:, 4] = expected[4, :] = False  # the padding target
  np.testing.assert_array_equal(mask, expected)


def test_the_module_refuses_t5x_one_token_decoding():
  model = tiny_model()
  tokens = jnp.ones((1, 3), jnp.int32)
  with pytest.raises(ValueError, match=r"decode/prefill: .* no T5X one-token cache"):
    model.module.apply({"params": model.params}, tokens, tokens, decode=True)


# ------------------------------------------------------------------ the DecodeModel
# The default suite keeps the Llama and T5 versions of this check; CI runs both here after it.
@pytest.mark.slow
@pytest.mark.parametrize("bidirectional", [False, True])
def test_chunks_single_steps_and_the_full_forward_agree_across_per_row_prefixes(bidirectional):
  model = tiny_model(bidirectional=bidirectional)
  assert isinstance(model, DecodeModel)
  k = 4
  x = sequences(WIDTH + k)
  inputs = prompts(x)
  full = full_logits(model, x)
  np.testing.assert_array_equal(model.start_tokens(inputs), x[np.arange(3), list(PREFIXES)])
  state = model.init(inputs, k + 1)
  np.testing.assert_array_equal(model.lengths(state), PREFIXES)
  chunk = rows_at(x, PREFIXES, k)  # the start token, then 3 more per row
  logits, chunked = model.extend(state, jnp.asarray(chunk))
  np.testing.assert_array_equal(model.lengths(chunked), np.asarray(PREFIXES) + k)
  expected = rows_at(full, PREFIXES, k)
  np.testing.assert_allclose(logits, expected, atol=2e-5, rtol=1e-5)
  steps = []
  for j in range(k):
    step_logits, state = model.extend(state, jnp.asarray(chunk[:, j : j + 1]))
    steps.append(step_logits)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), logits, atol=2e-5, rtol=1e-5)
  # A bidirectional prefix changes what the prompt's positions see.
  other = tiny_model(bidirectional=not bidirectional)
  assert (
    np.max(
      np.abs(np.asarray(other.extend(other.init(inputs, k + 1), jnp.asarray(chunk))[0]) - logits)
    )
    > 1e-3
  )


def test_rewind_moves_each_row_back_and_masks_what_it_left():
  model = tiny_model()
  x = sequences(WIDTH + 6, seed=1)
  inputs = prompts(x)
  state = model.init(inputs, 7)
  _, state = model.extend(state, jnp.asarray(rows_at(x, PREFIXES, 4)))
  back = np.asarray(PREFIXES) + np.asarray([1, 3, 2])
  state = model.rewind(state, jnp.asarray(back))
  np.testing.assert_array_equal(model.lengths(state), back)
  # Feed other tokens from the rewound positions: the stale slots must not count.
  y = x.copy()
  for b, start in enumerate(back):
    y[b, start:] = (x[b, start:] + 7) % 62 + 2
  logits, _ = model.extend(state, jnp.asarray(rows_at(y, back, 3)))
  np.testing.assert_allclose(logits, rows_at(full_logits(model, y), back, 3), atol=2e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="lengths must have shape"):
    model.rewind(state, jnp.zeros((2,), jnp.int32))


def test_extend_writes_only_the_chunks_slots():
  model = tiny_model()
  inputs = prompts(sequences(WIDTH))
  state = model.init(inputs, 4)
  _, after = model.extend(state, jnp.full((3, 2), 9, jnp.int32))
  written = np.zeros(state.caches[0][0].shape[:2], bool)
  for b, start in enumerate(PREFIXES):
    written[b, start : start + 2] = True
  for before, new in zip(jax.tree.leaves(state.caches), jax.tree.leaves(after.caches)):
    changed = np.any(np.asarray(before) != np.asarray(new), axis=(2, 3))
    np.testing.assert_array_equal(changed, written)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize(
  "prefixes,bucket", first_in_default(1, [((40, 0, 30), 64), ((70, 5, 2), 128)])
)
def test_prefill_feeds_only_the_shortest_bucket_that_holds_every_prompt(
  bidirectional, prefixes, bucket
):
  """Inputs 150 wide (T5X pads its features to a fixed length): `init` writes the
  first `bucket` slots and computes nothing past them, and the next logits are those
  of the same prompts padded only to the longest."""
  model = tiny_model(bidirectional=bidirectional, num_layers=1)
  x = np.random.default_rng(3).integers(2, 64, (3, 150))
  x[:, 0] = t5x_decoder.BOS_ID
  keep = np.arange(150)[None] <= np.asarray(prefixes)[:, None]
  wide = jnp.asarray(np.where(keep, x, 0), jnp.int32)
  state = model.init(wide, 4)
  for key_cache, _ in state.caches:
    written = np.any(np.asarray(key_cache) != 0.0, axis=(0, 2, 3))  # [T]
    np.testing.assert_array_equal(np.flatnonzero(written), np.arange(bucket))
  start = model.start_tokens(wide)[:, None]
  narrow = wide[:, : max(prefixes) + 1]
  np.testing.assert_allclose(
    model.extend(state, start)[0],
    model.extend(model.init(narrow, 4), start)[0],
    atol=2e-5,
    rtol=1e-5,
  )


def test_bad_ids_and_arguments_raise_errors_naming_them():
  model = tiny_model()
  inputs = prompts(sequences(WIDTH))
  with pytest.raises(ValueError, match="inputs holds token ids outside"):
    model.init(inputs.at[0, 1].set(64), 4)
  with pytest.raises(ValueError, match="max_length must be a positive int"):
    model.init(inputs, 0)
  state = model.init(inputs, 4)
  with pytest.raises(ValueError, match="tokens holds token ids outside"):
    model.extend(state, jnp.full((3, 1), -1, jnp.int32))
  with pytest.raises(ValueError, match="tokens has batch 2"):
    model.extend(state, jnp.ones((2, 1), jnp.int32))
  with pytest.raises(ValueError, match="a chunk of 99 tokens"):
    model.extend(state, jnp.ones((3, 99), jnp.int32))
  with pytest.raises(ValueError, match="params must be the parameter tree"):
    t5x_decoder.T5XDecoder(model.config, {"params": model.params}).init(inputs, 4)
  with pytest.raises(TypeError, match="bidirectional_prefix must be a bool"):
    t5x_decoder.T5XDecoder(model.config, model.params, bidirectional_prefix=1)


# ------------------------------------------------------------------ decoding
@pytest.fixture(scope="module")
def pair():
  """(target, draft): the draft is the target with noise added to every parameter,
  so that it agrees with the target often, but not always."""
  target = tiny_model(seed=2)
  noise = tiny_model(seed=3).params
  return target, dataclasses.replace(
    target, params=jax.tree.map(lambda p, n: p + 0.3 * n, target.params, noise)
  )


@pytest.fixture(scope="module")
def greedy_reference(pair):
  inputs = prompts(sequences(WIDTH, seed=3))
  return inputs, autoregressive_sample(
    pair[0], inputs, jax.random.PRNGKey(0), max_new_tokens=WIDTH, sampling=GREEDY, eos_id=1
  )


def test_greedy_speculative_decoding_equals_the_greedy_decode(pair, greedy_reference):
  target, draft = pair
  inputs, expected = greedy_reference
  assert all(len(set(row)) > 3 for row in np.asarray(expected.tokens).tolist())
  out = speculative_sample(
    target,
    draft,
    inputs,
    jax.random.PRNGKey(1),
    gamma=3,
    max_new_tokens=WIDTH,
    sampling=GREEDY,
    eos_id=1,
  )
  np.testing.assert_array_equal(out.tokens, expected.tokens)
  # Both branches of Algorithm 1 ran: accepted drafts and rejections.
  assert int(np.sum(out.stats.accepted)) > 0 and int(np.sum(out.stats.rejected)) > 0


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_t5x_decode_cuts_each_row_where_t5x_stops_and_scores_what_it_keeps(pair, greedy_reference):
  """specdec.t5x.decode_decoder_only: row b keeps L - P_b tokens, as T5X's
  temperature_sample writes them, and its score is T5X's: the log-probability of the
  kept tokens under the teacher-forced target (temperature 1)."""
  target, draft = pair
  inputs, reference = greedy_reference
  budget = WIDTH - np.asarray(PREFIXES)
  greedy, scores, stats = specdec_t5x.decode_decoder_only(
    target, draft, inputs, None, num_decodes=1, eos_id=1, gamma=3, sampling=GREEDY
  )
  kept = np.arange(WIDTH)[None] < budget[:, None]
  np.testing.assert_array_equal(greedy[:, 0], np.where(kept, reference.tokens, 0))
  np.testing.assert_array_equal(stats["length"][:, 0], np.minimum(reference.lengths, budget))
  np.testing.assert_array_equal(scores, 0.0)

  decodes, scores, stats = specdec_t5x.decode_decoder_only(
    target,
    draft,
    inputs,
    jax.random.PRNGKey(5),
    num_decodes=2,
    eos_id=1,
    gamma=3,
    sampling=SamplingConfig(1.0),
  )
  assert np.all(np.diff(np.asarray(scores), axis=1) >= 0)
  for j in range(2):
    tokens = np.asarray(decodes[:, j])
    lengths = np.asarray(stats["length"][:, j])
    assert np.all(lengths <= budget)
    assert np.all(tokens[np.arange(WIDTH)[None] >= lengths[:, None]] == 0)
    # Teacher-forced: the sequence is BOS, prompt, decode; decoded token i sits at
    # position P_b + 1 + i, predicted by the logits at P_b + i.
    x = np.asarray(specdec_t5x.with_prefix(inputs, decodes[:, j : j + 1]))[:, 0]
    x = np.concatenate([np.zeros((3, 1), np.int32), x], axis=1)
    log_probs = np.asarray(jax.nn.log_softmax(full_logits(target, x)))
    expected = [
      sum(log_probs[b, p + i, x[b, p + 1 + i]] for i in range(lengths[b]))
      for b, p in enumerate(PREFIXES)
    ]
    np.testing.assert_allclose(scores[:, j], expected, rtol=1e-4, atol=1e-4)


def test_with_prefix_gives_temperature_sample_layout():
  inputs = jnp.asarray([[0, 5, 6, 0, 0], [0, 0, 0, 0, 0]], jnp.int32)
  decodes = jnp.asarray([[[7, 8, 1, 0, 0]], [[9, 9, 9, 9, 9]]], jnp.int32)
  np.testing.assert_array_equal(
    specdec_t5x.with_prefix(inputs, decodes), [[[5, 6, 7, 8, 1]], [[9, 9, 9, 9, 9]]]
  )


# ------------------------------------------------------------------ with t5x
@pytest.fixture(scope="module")
def t5x_network():
  # Absent without t5x, and with a regular (non-editable) install of it: the example
  # has no __init__.py. Not on PyPI; docs/t5x.md says how to install it.
  return pytest.importorskip(
    "t5x.examples.decoder_only.network",
    reason="t5x.examples.decoder_only is not "
    "installed (t5x installed editable has it: docs/t5x.md)",
  )


@pytest.mark.t5x
@pytest.mark.parametrize("tied", [False, True])
def test_t5x_network_has_the_same_tree_and_logits(t5x_network, tied):
  model = tiny_model(logits_via_embedding=tied)
  theirs = t5x_module(t5x_network, model.config)
  ones = jnp.ones((1, 4), jnp.int32)
  variables = theirs.init(jax.random.PRNGKey(0), ones, ones, enable_dropout=False)
  ours = t5x_decoder.init_variables(model.config, jax.random.PRNGKey(0))
  assert jax.tree.map(jnp.shape, dict(variables["params"])) == jax.tree.map(
    jnp.shape, dict(ours["params"])
  )
  assert traverse_util.flatten_dict(dict(variables["params_axes"])) == traverse_util.flatten_dict(
    dict(ours["params_axes"])
  )
  x = jnp.asarray(sequences(10))
  targets = jnp.concatenate([x[:, 1:], jnp.ones((3, 1), jnp.int32)], 1).at[2, 7:].set(0)
  causal = (jnp.arange(10)[None] <= jnp.asarray(PREFIXES)[:, None]).astype(jnp.int32)
  for mask in (None, causal):
    expected = theirs.apply(
      {"params": model.params}, x, targets, decoder_causal_attention=mask, enable_dropout=False
    )
    got = model.module.apply(
      {"params": model.params}, x, targets, decoder_causal_attention=mask, enable_dropout=False
    )
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
