"""specdec.models.t5: the network, its chunked per-row cache, presets, and decoding."""

import dataclasses

from flax import traverse_util
from helpers import first_in_default
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.models import t5
from specdec.models.base import DecodeModel

from t5_helpers import (
  MAX_LENGTH,
  extend,
  full_logits,
  init,
  random_inputs,
  rewind,
  standard_batch,
  tiny_model,
  while_body_instructions,
)

TOL = dict(atol=2e-5, rtol=2e-5)
GREEDY = specdec.SamplingConfig(temperature=0.0)


# What differs between v1.0 and v1.1 (MLP, logits) is tested on both (`versioned`);
# the rest on v1.1 only (`model`): compilation is most of the time these tests take.
@pytest.fixture(scope="module", params=["1.0", "1.1"])
def versioned(request):
  return tiny_model(request.param)


@pytest.fixture(scope="module")
def model():
  return tiny_model("1.1")


def _batch(model):
  """`standard_batch` and its full-forward logits."""
  inputs, decoder_inputs = standard_batch(model)
  return inputs, decoder_inputs, full_logits(model, inputs, decoder_inputs)


@pytest.fixture(scope="module")
def versioned_batch(versioned):
  return _batch(versioned)


@pytest.fixture(scope="module")
def batch(model):
  return _batch(model)


def _feed(model, state, tokens, chunks):
  """Feeds `tokens` [B, L] in chunks of the given sizes; returns logits [B, L, V]."""
  logits, start = [], 0
  for k in chunks:
    chunk_logits, state = extend(model, state, tokens[:, start : start + k])
    logits.append(chunk_logits)
    start += k
  return jnp.concatenate(logits, axis=1), state


# ----------------------------------------------------------------- cache semantics


def test_is_a_decode_model(model, batch):
  inputs = batch[0]
  assert isinstance(model, DecodeModel)
  np.testing.assert_array_equal(model.start_tokens(inputs), [0, 0, 0])
  state = init(model, inputs, MAX_LENGTH)
  np.testing.assert_array_equal(model.lengths(state), [0, 0, 0])
  cfg = model.config
  assert len(state.cross) == cfg.num_decoder_layers
  assert state.cross[0][0].shape == (3, 9, cfg.num_heads, cfg.head_dim)
  assert state.caches[0][0].shape == (3, MAX_LENGTH, cfg.num_heads, cfg.head_dim)


def test_chunked_equals_single_token_equals_full_forward(versioned, versioned_batch):
  model, (inputs, decoder_inputs, full) = versioned, versioned_batch
  state = init(model, inputs, MAX_LENGTH)
  single, _ = _feed(model, state, decoder_inputs, [1] * 8)
  chunked, state = _feed(model, state, decoder_inputs, [3, 5])
  assert chunked.dtype == jnp.float32 and chunked.shape == full.shape
  np.testing.assert_allclose(single, full, **TOL)
  np.testing.assert_allclose(chunked, full, **TOL)
  np.testing.assert_allclose(chunked, single, **TOL)
  np.testing.assert_array_equal(model.lengths(state), [8, 8, 8])
  # The caches hold the same keys and values; the slots never fed stay zero.
  _, single_state = _feed(model, init(model, inputs, MAX_LENGTH), decoder_inputs, [1] * 8)
  for chunked_kv, single_kv in zip(state.caches, single_state.caches):
    for a, b in zip(chunked_kv, single_kv):
      np.testing.assert_allclose(a, b, **TOL)
      np.testing.assert_array_equal(a[:, 8:], 0.0)


def test_per_position_logits_are_the_same_logits(versioned, versioned_batch):
  """`per_position_logits` changes how the output layer is computed, not what: a
  chunk's logits equal the full forward pass (v1.0's tied embedding and v1.1's
  separate kernel), and it is static (a different compiled function)."""
  model, (inputs, decoder_inputs, full) = versioned, versioned_batch
  rows = model.replace(per_position_logits=8)
  state = init(rows, inputs, MAX_LENGTH)
  chunked, _ = _feed(rows, state, decoder_inputs, [3, 5])
  np.testing.assert_allclose(chunked, full, **TOL)
  single, _ = _feed(rows, state, decoder_inputs, [1] * 8)
  np.testing.assert_allclose(single, full, **TOL)
  for bad in (-1, True, 2.0):
    with pytest.raises(ValueError, match="per_position_logits"):
      model.replace(per_position_logits=bad)


def test_rows_at_different_positions_after_rewind(versioned, versioned_batch):
  """Rows rewound to different lengths, over stale slots holding other tokens, then
  one chunk: each row's logits are the full forward pass at its own positions."""
  model, (inputs, decoder_inputs, full) = versioned, versioned_batch
  garbage = random_inputs(3, 5, model.vocab_size, seed=9)
  state = init(model, inputs, MAX_LENGTH)
  _, state = extend(model, state, decoder_inputs[:, :3])
  _, state = extend(model, state, garbage)  # stale slots 3..7 of every row.
  lengths = jnp.array([3, 1, 2], jnp.int32)
  state = rewind(model, state, lengths)
  np.testing.assert_array_equal(model.lengths(state), lengths)
  k = 5
  chunk = jnp.stack([decoder_inputs[b, n : n + k] for b, n in enumerate([3, 1, 2])])
  logits, state = extend(model, state, chunk)
  for b, n in enumerate([3, 1, 2]):
    np.testing.assert_allclose(logits[b], full[b, n : n + k], **TOL)
  np.testing.assert_array_equal(model.lengths(state), lengths + k)
  # Rewind never moves a row forward.
  state = rewind(model, state, jnp.array([99, 0, 5], jnp.int32))
  np.testing.assert_array_equal(model.lengths(state), [8, 0, 5])


def test_cache_write_sets_only_the_chunk_slots_and_drops_past_capacity():
  """`write_cache`: row b's slots positions[b] get the new keys exactly, every other
  slot keeps its value, and slots past the capacity are dropped (a full row)."""
  rng = np.random.default_rng(0)
  cache = rng.standard_normal((3, 7, 2, 4)).astype(np.float32)
  new = rng.standard_normal((3, 3, 2, 4)).astype(np.float32)
  starts = np.array([0, 2, 5])  # Row 2's last slot, 7, is past the capacity.
  positions = starts[:, None] + np.arange(3)
  expected = cache.copy()
  for b in range(3):
    for j in range(3):
      if positions[b, j] < 7:
        expected[b, positions[b, j]] = new[b, j]
  written = jax.jit(t5.write_cache)(cache, new, positions)
  np.testing.assert_array_equal(written, expected)
  bf16 = jax.jit(t5.write_cache)(jnp.asarray(cache, jnp.bfloat16), new, positions)
  assert bf16.dtype == jnp.bfloat16
  np.testing.assert_array_equal(bf16, jnp.asarray(expected, jnp.bfloat16))


# A capacity no other dimension of the compiled decode has, so that the cache's shape
# identifies cache-sized arrays in the HLO: max_new_tokens + gamma + 1 = 37.
HLO_GAMMA, HLO_MAX_NEW_TOKENS, HLO_CAPACITY = 4, 32, 37
# Ops that, at the cache's size, mean a whole-cache pass per call: T5X's one-hot
# write (a dot, or a broadcast multiply for a 1-token chunk, then a select).
WHOLE_CACHE_OPS = ("dot", "convolution", "select", "multiply", "add", "broadcast")


def cache_sized_ops_in_decode_loop(target, draft):
  """{opcode: count} of the instructions inside the while bodies of a compiled greedy
  `speculative_sample` of target and draft (their caches [3, 37, H, D]) whose output
  has the cache's number of elements (any reshape or transpose of it), plus the
  key 'copy_of_cache' for copies of exactly the cache's shape."""
  cfg = target.config
  inputs = random_inputs(3, 8, target.vocab_size, seed=11)
  decode = jax.jit(
    lambda t, d, x: (
      specdec.speculative_sample(
        t,
        d,
        x,
        jax.random.key(0),
        gamma=HLO_GAMMA,
        max_new_tokens=HLO_MAX_NEW_TOKENS,
        sampling=GREEDY,
      ).tokens
    )
  )
  text = decode.lower(target, draft, inputs).compile().as_text()
  shape = (3, HLO_CAPACITY, cfg.num_heads, cfg.head_dim)
  ops = {}
  for op, dims, _ in while_body_instructions(text):
    if dims == shape and op == "copy":
      op = "copy_of_cache"
    if np.prod(dims) == np.prod(shape) and HLO_CAPACITY in dims:
      ops[op] = ops.get(op, 0) + 1
  return ops


def test_decode_loop_writes_only_the_new_cache_slots(model):
  """Issue 11 section 3: in the compiled decode loop each extend writes its k slots
  with a scatter, in place: no dot, multiply or select with the cache's size (T5X's
  one-hot write, an O(T) pass per layer per call), and no copy of the cache."""
  target = _one_layer(model)
  ops = cache_sized_ops_in_decode_loop(target, _noisy(target))
  # Keys and values of the draft's steps and of the target's verification chunk.
  assert ops.get("scatter", 0) >= 4, ops
  assert not set(ops) & set(WHOLE_CACHE_OPS + ("copy_of_cache",)), ops


def test_out_of_range_ids_raise_when_concrete(model, batch):
  """Issue 11 section 2: ids >= V or < 0 raise naming `inputs` / `tokens` (they would
  read NaN rows of the embedding, or wrap while the mask counts them as padding)."""
  inputs = np.asarray(batch[0])
  vocab = model.vocab_size
  state = init(model, batch[0], MAX_LENGTH)
  for bad_id in (vocab, -1):
    bad = inputs.copy()
    bad[0, 2] = bad_id
    on_device = jnp.asarray(bad)
    for call in (
      lambda bad=bad: model.init(bad, MAX_LENGTH),
      lambda bad=bad: model.encode(bad),
      lambda on_device=on_device: model.init(on_device, MAX_LENGTH),
      # Concrete ids closed over by a traced function are still checked.
      lambda on_device=on_device: jax.eval_shape(lambda: model.init(on_device, 4)),
    ):
      with pytest.raises(ValueError, match=rf"inputs.*\[{min(bad_id, 0)}, "):
        call()
    tokens = jnp.full((3, 1), bad_id, jnp.int32)
    with pytest.raises(ValueError, match="tokens"):
      jax.eval_shape(lambda tokens=tokens: model.extend(state, tokens))
  largest = jnp.full((3, 1), vocab - 1, jnp.int32)
  jax.eval_shape(lambda: model.extend(state, largest))


def test_traced_out_of_range_ids_are_clipped_not_nan(model, batch):
  """Under jit the ids cannot raise: they are clipped into [0, V), so the logits are
  finite and equal those of the clipped ids (V + 36 reads row V - 1, -5 row 0)."""
  inputs, decoder_inputs, _ = batch
  vocab = model.vocab_size
  bad_inputs = inputs.at[0, 1].set(vocab + 36).at[2, 3].set(-5)
  clipped_inputs = inputs.at[0, 1].set(vocab - 1).at[2, 3].set(0)
  chunk = decoder_inputs[:, :3].at[1, 2].set(vocab).at[2, 0].set(-1)
  clipped_chunk = decoder_inputs[:, :3].at[1, 2].set(vocab - 1).at[2, 0].set(0)
  logits, _ = extend(model, init(model, bad_inputs, MAX_LENGTH), chunk)
  expected, _ = extend(model, init(model, clipped_inputs, MAX_LENGTH), clipped_chunk)
  assert np.isfinite(logits).all()
  np.testing.assert_array_equal(logits, expected)


def test_t5x_decode_mode_takes_chunks(model, batch):
  """`Transformer.decode(decode=True)` with T5X's 'cache' protocol
  (`EncoderDecoderModel.predict_batch`): allocate, then feed 1- and 2-token steps."""
  inputs, decoder_inputs, full = batch
  module = model.module

  @jax.jit
  def allocate(params):
    ones = jnp.ones_like(decoder_inputs)
    _, variables = module.apply(
      {"params": params},
      jnp.ones_like(inputs),
      ones,
      ones,
      decode=True,
      enable_dropout=False,
      mutable=["cache"],
    )
    return variables["cache"], module.apply(
      {"params": params}, inputs, enable_dropout=False, method=module.encode
    )

  @jax.jit
  def step(params, cache, encoded, tokens):
    logits, variables = module.apply(
      {"params": params, "cache": cache},
      encoded,
      inputs,
      tokens,
      tokens,
      enable_dropout=False,
      decode=True,
      max_decode_length=8,
      mutable=["cache"],
      method=module.decode,
    )
    return logits, variables["cache"]

  cache, encoded = allocate(model.params)
  logits, start = [], 0
  for k in [1, 2, 2, 1, 2]:
    chunk_logits, cache = step(model.params, cache, encoded, decoder_inputs[:, start : start + k])
    logits.append(chunk_logits)
    start += k
  np.testing.assert_allclose(jnp.concatenate(logits, axis=1), full, **TOL)


def test_packed_segments_are_independent(model, batch):
  """T5X's training call with packing: each of two packed examples gets the logits it
  has alone (alone = the same length, the other segment's place padded)."""
  inputs, decoder_inputs, _ = batch
  logits = jax.jit(
    lambda params, x, y, targets, x_segments, y_segments: model.module.apply(
      {"params": params},
      x,
      y,
      targets,
      encoder_segment_ids=x_segments,
      decoder_segment_ids=y_segments,
      enable_dropout=False,
    )
  )
  x, y = inputs[:1, :3], decoder_inputs[:1, :4]
  ones_x, ones_y = jnp.ones((1, 3), jnp.int32), jnp.ones((1, 4), jnp.int32)
  pad = lambda a: jnp.pad(a, ((0, 0), (0, a.shape[1])))
  packed = logits(
    model.params,
    jnp.tile(x, (1, 2)),
    jnp.tile(y, (1, 2)),
    jnp.ones((1, 8), jnp.int32),
    jnp.concatenate([ones_x, 2 * ones_x], 1),
    jnp.concatenate([ones_y, 2 * ones_y], 1),
  )
  alone = logits(model.params, pad(x), pad(y), pad(ones_y), pad(ones_x), pad(ones_y))
  np.testing.assert_allclose(packed[:, :4], alone[:, :4], **TOL)
  np.testing.assert_allclose(packed[:, 4:], alone[:, :4], **TOL)


def test_bfloat16_parameters_and_activations(model, batch):
  inputs, decoder_inputs, full = batch
  cfg = dataclasses.replace(model.config, dtype=jnp.bfloat16)
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model.params)
  bf16 = t5.T5(cfg, params)
  state = init(bf16, inputs, MAX_LENGTH)
  assert state.caches[0][0].dtype == jnp.bfloat16
  logits, _ = extend(bf16, state, decoder_inputs)
  assert logits.dtype == jnp.float32
  scale = float(jnp.abs(full).max())
  np.testing.assert_allclose(logits, full, atol=0.1 * scale)


@pytest.mark.t5x
def test_same_tree_and_logits_as_t5x_network(request):
  """T5X's own `t5x/examples/t5/network.py`: the same parameter tree (names, shapes,
  logical axes, and even initial values) and, float32, the same logits."""
  network = pytest.importorskip("t5x.examples.t5.network")
  model = request.getfixturevalue("model")
  cfg = model.config
  fields = (
    "vocab_size",
    "dtype",
    "emb_dim",
    "num_heads",
    "num_encoder_layers",
    "num_decoder_layers",
    "head_dim",
    "mlp_dim",
    "mlp_activations",
    "dropout_rate",
    "logits_via_embedding",
  )
  theirs = network.Transformer(network.T5Config(**{f: getattr(cfg, f) for f in fields}))
  ones = jnp.ones((1, 1), jnp.int32)
  their_vars = jax.jit(lambda r: theirs.init(r, ones, ones, ones, enable_dropout=False))(
    jax.random.key(0)
  )
  our_vars = t5.init_variables(cfg, jax.random.key(0))
  assert jax.tree.structure(their_vars) == jax.tree.structure(our_vars)
  for a, b in zip(jax.tree.leaves(their_vars), jax.tree.leaves(our_vars)):
    np.testing.assert_array_equal(a, b)
  inputs, decoder_inputs, full = request.getfixturevalue("batch")
  their_logits = jax.jit(
    lambda p: theirs.apply(
      {"params": p}, inputs, decoder_inputs, jnp.ones_like(decoder_inputs), enable_dropout=False
    )
  )(model.params)
  np.testing.assert_allclose(their_logits, full, **TOL)


# ------------------------------------------------------- relative position buckets


def test_relative_position_bucket_known_values():
  rel = np.array([0, -1, -7, -8, -15, -16, -127, -128, -1000, 1, 8, 129])
  # Bidirectional: 16 buckets per direction, 8 exact; keys after the query
  # (rel > 0) in buckets 16..31.
  np.testing.assert_array_equal(
    t5.relative_position_bucket(rel, bidirectional=True),
    [0, 1, 7, 8, 9, 10, 15, 15, 15, 17, 24, 31],
  )
  # Unidirectional: 32 buckets, 16 exact; future keys map to bucket 0.
  np.testing.assert_array_equal(
    t5.relative_position_bucket(rel, bidirectional=False), [0, 1, 7, 8, 15, 16, 31, 31, 31, 0, 0, 0]
  )


@pytest.mark.parametrize("bidirectional", [True, False])
def test_traced_bucket_lookup_matches_formula(bidirectional):
  rel = np.arange(-1500, 1501)
  np.testing.assert_array_equal(
    jax.jit(t5.bucket_lookup, static_argnums=1)(jnp.asarray(rel), bidirectional),
    t5.relative_position_bucket(rel, bidirectional),
  )


# ------------------------------------------------------------------------ presets

V1_1_COUNTS = {
  "t5_1_1_small": 76_961_152,
  "t5_1_1_base": 247_577_856,
  "t5_1_1_large": 783_150_080,
  "t5_1_1_xl": 2_849_757_184,
  "t5_1_1_xxl": 11_135_332_352,
}
# T5 v1.0 with T5X's 32128-row vocabulary (transformers reports the same sizes for
# t5-small ... t5-11b).
V1_0_COUNTS = {
  "t5_small": 60_506_624,
  "t5_base": 222_903_552,
  "t5_large": 737_668_096,
  "t5_3b": 2_851_598_336,
  "t5_11b": 11_307_321_344,
}


@pytest.mark.parametrize("name", first_in_default(2, sorted({**V1_1_COUNTS, **V1_0_COUNTS})))
def test_preset_parameter_counts_without_allocating(name):
  cfg = t5.CONFIGS[name]
  shapes = t5.param_shapes(cfg)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(shapes))
  assert t5.param_count(cfg) == {**V1_1_COUNTS, **V1_0_COUNTS}[name]
  attention = shapes["encoder"]["layers_0"]["attention"]
  assert attention["query"]["kernel"].shape == (cfg.emb_dim, cfg.num_heads * cfg.head_dim)
  assert shapes["encoder"]["relpos_bias"]["rel_embedding"].shape == (cfg.num_heads, 32)
  assert ("logits_dense" in shapes["decoder"]) != cfg.logits_via_embedding
  mlp = shapes["decoder"][f"layers_{cfg.num_decoder_layers - 1}"]["mlp"]
  assert sorted(mlp) == (["wi", "wo"] if cfg.logits_via_embedding else ["wi_0", "wi_1", "wo"])


def test_published_dimensions():
  dims = {
    name: (c.emb_dim, c.num_heads, c.num_encoder_layers, c.mlp_dim, c.head_dim)
    for name, c in t5.CONFIGS.items()
  }
  assert dims["t5_1_1_small"] == (512, 6, 8, 1024, 64)
  assert dims["t5_1_1_xxl"] == (4096, 64, 24, 10240, 64)
  assert dims["t5_11b"] == (1024, 128, 24, 65536, 128)
  assert all(c.vocab_size == 32128 and c.dtype == jnp.bfloat16 for c in t5.CONFIGS.values())


def test_random_params_have_the_init_tree(model):
  cfg = model.config
  expected = jax.tree.map(lambda x: (x.shape, x.dtype), t5.param_shapes(cfg))
  assert jax.tree.map(lambda x: (x.shape, x.dtype), model.params) == expected


@pytest.mark.slow  # the default suite stays under 6 minutes; CI runs this after it
def test_device_random_params_match_random_params_scales():
  """device_random_params: the init tree in the config's dtype, with numpy's
  random_params' scales (layer-norm scales ones, per-leaf std alike)."""
  cfg = t5.tiny_config("1.1").replace(dtype=jnp.bfloat16)
  drawn = t5.device_random_params(cfg, seed=0)
  expected = jax.tree.map(lambda x: x.shape, t5.param_shapes(cfg))
  assert jax.tree.map(lambda x: x.shape, drawn) == expected
  assert {x.dtype for x in jax.tree.leaves(drawn)} == {jnp.dtype(jnp.bfloat16)}
  reference = t5.random_params(cfg, seed=0)
  flat = traverse_util.flatten_dict(drawn, sep="/")
  for name, ref in traverse_util.flatten_dict(reference, sep="/").items():
    got = np.asarray(flat[name], np.float32)
    if name.endswith("/scale"):
      assert np.all(got == 1.0), name
    else:
      # Two std estimates of n draws differ by ~1/sqrt(n) relative: 5 sigma, so a
      # false alarm has probability < 1e-6 per leaf (and the seed is fixed).
      assert np.std(got) == pytest.approx(np.std(ref), rel=5 / np.sqrt(ref.size)), name
  again = t5.device_random_params(cfg, seed=0)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(drawn), jax.tree.leaves(again)))


# ------------------------------------------------------------------------ decoding


def _one_layer(model):
  """A 1-layer version of a tiny model: compiling the samplers around it is cheaper;
  depth, and v1.0, are what the cache tests above exercise."""
  version = "1.0" if model.config.logits_via_embedding else "1.1"
  return tiny_model(version, num_encoder_layers=1, num_decoder_layers=1)


def _noisy(model, scale=0.3, seed=3):
  """`model` with Gaussian noise of `scale` x each parameter's std: a draft that
  agrees with it often, not always."""
  rng = np.random.default_rng(seed)
  return model.replace(
    params=jax.tree.map(
      lambda x: x + scale * np.std(x) * rng.standard_normal(x.shape, np.float32), model.params
    )
  )


def _greedy_pair(target, draft):
  inputs = random_inputs(3, 8, target.vocab_size, seed=11, pad_from={2: 5})
  out = specdec.speculative_sample(
    target, draft, inputs, jax.random.key(0), gamma=4, max_new_tokens=10, sampling=GREEDY, eos_id=1
  )
  base = specdec.autoregressive_sample(
    target, inputs, jax.random.key(0), max_new_tokens=10, sampling=GREEDY, eos_id=1
  )
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  return out, base


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_speculative_at_temperature_zero_is_greedy(model):
  """Section 2.3 / Appendix A.1: at temperature 0 speculative decoding outputs
  exactly the target's greedy decode, whatever the draft. (A draft of another size
  is run by test_sharding.)"""
  target = _one_layer(model)
  out, base = _greedy_pair(target, _noisy(target))
  assert len(np.unique(base.tokens)) > 5  # a decode worth comparing,
  assert 0 < int(out.stats.accepted.sum()) < int(out.stats.drafted.sum())  # and mixed.
  # A target computing its verification logits position by position: the same.
  _greedy_pair(target.replace(per_position_logits=8), _noisy(target))
  # The draft is the target (same shapes: no new compilation): all accepted.
  out, _ = _greedy_pair(target, target)
  np.testing.assert_array_equal(out.stats.accepted, out.stats.drafted)


# ------------------------------------------------------------------------- errors


def test_errors_name_the_bad_argument(model, batch):
  inputs = batch[0]
  with pytest.raises(ValueError, match="max_length"):
    t5.T5(model.config, model.params, max_decode_length=8).init(inputs, 9)
  for bad in (0, 2.5, True):
    with pytest.raises(ValueError, match="max_length"):
      model.init(inputs, bad)
  with pytest.raises(ValueError, match="inputs"):
    model.init(inputs[0], 4)
  with pytest.raises(TypeError, match="inputs"):
    model.init(inputs.astype(jnp.float32), 4)
  state = jax.eval_shape(lambda: model.init(inputs, 4))
  with pytest.raises(ValueError, match="tokens"):
    jax.eval_shape(lambda: model.extend(state, jnp.zeros((2, 1), jnp.int32)))
  with pytest.raises(ValueError, match="tokens"):
    jax.eval_shape(lambda: model.extend(state, jnp.zeros((3, 5), jnp.int32)))
  with pytest.raises(ValueError, match="lengths"):
    jax.eval_shape(lambda: model.rewind(state, jnp.zeros((2,), jnp.int32)))
  with pytest.raises(ValueError, match="params"):
    t5.T5(model.config, {"params": model.params}).init(inputs, 4)
  with pytest.raises(ValueError, match="max_decode_length"):
    t5.T5(model.config, model.params, max_decode_length=0)


@pytest.mark.parametrize(
  "field, value, error",
  [
    ("num_heads", 0, ValueError),
    ("emb_dim", 2.0, ValueError),
    ("mlp_activations", ["relu"], TypeError),
    ("mlp_activations", ("nope",), ValueError),
    ("dropout_rate", 1.0, ValueError),
    ("dtype", jnp.int32, ValueError),
  ],
)
def test_bad_config_field_is_named(field, value, error):
  cfg = dataclasses.replace(t5.tiny_config(), **{field: value})
  with pytest.raises(error, match=field):
    t5.check_config(cfg)


# ------------------------------------------------------------ packed weights (CPU)


def _chunk_logits(a, b):
  """(a's logits, b's logits) for chunks of 1, 3 and 8 tokens fed in turn to both
  models (batch 2, the same 9-token inputs)."""
  x = jnp.asarray(np.random.default_rng(0).integers(1, 300, (2, 9)), jnp.int32)
  a_state, b_state = a.init(x, 24), b.init(x, 24)
  for k in (1, 3, 8):
    tokens = jnp.asarray(np.random.default_rng(k).integers(1, 300, (2, k)), jnp.int32)
    a_logits, a_state = a.extend(a_state, tokens)
    b_logits, b_state = b.extend(b_state, tokens)
    yield a_logits, b_logits


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_packed_decoder_weights_give_the_unpacked_logits_for_every_chunk_length(version):
  """The decoder weights' tile-major copy (`t5.pack_params`, read by
  `specdec.backends.cpu`) changes only the order of float32 sums: chunks of 1, 3 and 8
  tokens over a batch of 2 (up to 16 rows) agree with the unpacked model within 1e-5,
  v1.0 (tied output layer) and v1.1 (`logits_dense`) alike."""
  from specdec.backends import cpu

  cfg = t5.tiny_config(version, vocab_size=300)
  model = t5.T5(cfg, t5.random_params(cfg, 0))
  packed = model.with_packed_weights()
  assert cpu.enabled() and packed.packed is not None
  assert packed.per_position_logits == 0
  for got, want in _chunk_logits(packed, model):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  packed_state = packed.init(jnp.ones((2, 9), jnp.int32), 12)
  hlo = (
    jax.jit(lambda s, t: packed.extend(s, t)[0])
    .lower(packed_state, jnp.ones((2, 4), jnp.int32))
    .as_text()
  )
  assert "specdec_packed_matmul" in hlo


@pytest.mark.parametrize(
  "version", [pytest.param(v, marks=pytest.mark.slow) for v in ("1.0", "1.1")]
)
def test_a_bfloat16_t5_checkpoint_packs_in_half_the_bytes_with_the_same_logits(version):
  """Decoder weights that are bfloat16 values upcast pack in bfloat16 by themselves,
  with every chunk's logits those of the float32 pack bit for bit."""
  cfg = t5.tiny_config(version, vocab_size=300)
  params = jax.tree.map(
    lambda p: jnp.asarray(p).astype(jnp.bfloat16).astype(jnp.float32), t5.random_params(cfg, 0)
  )
  model = t5.T5(cfg, params)
  half = model.with_packed_weights()
  full = half.replace(packed=t5.pack_params(cfg, params, dtype=jnp.float32))
  assert {str(p.dtype) for p in jax.tree.leaves(half.packed)} == {"bfloat16"}
  for got, want in _chunk_logits(half, full):
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow  # the default suite keeps the packed Llama case; CI runs this after it
def test_greedy_speculative_with_packed_t5_equals_the_targets_greedy_decode():
  tcfg = t5.tiny_config("1.1", vocab_size=300)
  dcfg = t5.tiny_config("1.1", vocab_size=300, emb_dim=16, num_decoder_layers=1)
  target = t5.T5(tcfg, t5.random_params(tcfg, 0))
  draft = t5.T5(dcfg, t5.random_params(dcfg, 1))
  x = jnp.asarray(np.random.default_rng(3).integers(2, 300, (1, 8)), jnp.int32)
  base = specdec.autoregressive_sample(
    target, x, jax.random.key(0), max_new_tokens=20, sampling=GREEDY, eos_id=None
  )
  spec = specdec.speculative_sample(
    target.with_packed_weights(),
    draft.with_packed_weights(),
    x,
    jax.random.key(1),
    gamma=4,
    max_new_tokens=20,
    sampling=GREEDY,
    eos_id=None,
  )
  np.testing.assert_array_equal(spec.tokens, base.tokens)


def test_bfloat16_t5_is_left_unpacked():
  cfg = t5.tiny_config("1.1", dtype=jnp.bfloat16)
  assert t5.T5(cfg, t5.random_params(cfg, 0)).with_packed_weights().packed is None
