"""specdec.t5x: the shared decode, the decode_fn, the draft restore, and, with t5x
installed, the model under T5X's PjitPartitioner and `python -m t5x.infer` runs."""

import functools
import importlib
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec import data, pretrained, t5x as specdec_t5x
from specdec.distributions import SamplingConfig
from specdec.io.t5x import load_t5x
from specdec.models import t5
from specdec.sample import autoregressive_sample

from t5_helpers import (
  assert_trees_equal,
  t5x_decoder_module,
  tiny_decoder,
  tiny_model,
  tiny_pair_gin,
  write_t5x_legacy,
)

REPO = pathlib.Path(__file__).resolve().parent.parent
# What T5X users pass as --gin_search_paths: `python -m specdec.t5x` prints it.
SEARCH_PATH = specdec_t5x.gin_search_path()
GREEDY = SamplingConfig(temperature=0.0)
BATCH, INPUT_LENGTH, DECODE_LENGTH, GAMMA = 2, 6, 10, 3
# Every test decodes 2 x NUM_DECODES rows with gamma 3, so they share compilations.
NUM_DECODES = 2


@pytest.fixture(scope="module")
def pair():
  """(target, draft, inputs int32[2, 6]): tiny T5 v1.1 models, vocabulary 64.

  One layer each: the layers are unrolled, and compilation is most of the time here.
  """
  target = tiny_model("1.1", seed=1, num_encoder_layers=1, num_decoder_layers=1)
  draft = tiny_model("1.1", seed=2, num_encoder_layers=1, num_decoder_layers=1)
  inputs = jnp.asarray(np.random.default_rng(0).integers(2, 64, (BATCH, INPUT_LENGTH)), jnp.int32)
  return target, draft, inputs


@pytest.fixture(scope="module")
def draft_checkpoint(pair, tmp_path_factory):
  directory = tmp_path_factory.mktemp("draft")
  write_t5x_legacy(str(directory), pair[1].params)
  return str(directory)


def _greedy(target, inputs):
  return autoregressive_sample(
    target, inputs, jax.random.PRNGKey(0), max_new_tokens=DECODE_LENGTH, sampling=GREEDY, eos_id=1
  ).tokens


@jax.jit
def _cached_log_probs(model, inputs, tokens, lengths):
  """float32[N]: log p(tokens[n, :lengths[n]] | inputs[n]), teacher-forced through
  the decode cache (one chunk), a different path from `sequence_scores`' full pass."""
  state = model.init(inputs, tokens.shape[1])
  chunk = jnp.concatenate([model.start_tokens(inputs)[:, None], tokens[:, :-1]], axis=1)
  logits, _ = model.extend(state, chunk)
  log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], axis=-1)[..., 0]
  valid = jnp.arange(tokens.shape[1])[None] < lengths[:, None]
  return jnp.sum(jnp.where(valid, log_probs, 0.0), axis=1)


# ------------------------------------------------------------------ the shared decode
def test_greedy_decodes_are_the_targets_greedy_decode(pair):
  target, draft, inputs = pair
  decodes, scores, stats = specdec_t5x.decode(
    target,
    draft,
    inputs,
    jax.random.PRNGKey(3),
    max_decode_length=DECODE_LENGTH,
    num_decodes=NUM_DECODES,
    eos_id=1,
    gamma=GAMMA,
    sampling=GREEDY,
  )
  assert decodes.shape == (BATCH, NUM_DECODES, DECODE_LENGTH)
  assert scores.shape == (BATCH, NUM_DECODES)
  expected = np.asarray(_greedy(target, inputs))
  for j in range(NUM_DECODES):
    np.testing.assert_array_equal(decodes[:, j], expected)
  np.testing.assert_array_equal(scores, 0.0)  # T5X's rescaled greedy score
  assert set(stats) == {"length", "iterations", "drafted", "accepted", "alpha_hat"}
  assert all(v.shape == (BATCH, NUM_DECODES) for v in stats.values())
  np.testing.assert_array_equal(stats["drafted"], GAMMA * stats["iterations"])


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_sampled_decodes_are_sorted_by_their_log_probability(pair):
  target, draft, inputs = pair
  decodes, scores, stats = specdec_t5x.decode(
    target,
    draft,
    inputs,
    jax.random.PRNGKey(5),
    max_decode_length=DECODE_LENGTH,
    num_decodes=NUM_DECODES,
    eos_id=1,
    gamma=GAMMA,
    sampling=SamplingConfig(1.0),
  )
  assert np.all(np.diff(np.asarray(scores), axis=1) >= 0)
  flat = decodes.reshape(BATCH * NUM_DECODES, DECODE_LENGTH)
  lengths = stats["length"].reshape(-1)
  assert np.all(np.where(np.arange(DECODE_LENGTH)[None] >= lengths[:, None], flat, 0) == 0)
  np.testing.assert_allclose(
    scores.reshape(-1),
    _cached_log_probs(target, jnp.repeat(inputs, NUM_DECODES, axis=0), flat, lengths),
    rtol=1e-4,
    atol=1e-3,
  )
  assert len({tuple(np.asarray(decodes[0, j])) for j in range(NUM_DECODES)}) > 1


def test_speculative_decode_has_t5x_decode_fn_convention(pair, draft_checkpoint):
  target, draft, inputs = pair

  class StandIn:
    """The two things of T5X's EncoderDecoderModel the decode_fn reads."""

    module = t5.Transformer(target.config)

    def _compute_logits_from_slice(
      self, decoding_state, params, encoded_inputs, raw_inputs, max_decode_length
    ):
      raise AssertionError("the one-token callback is never called")

  callback = functools.partial(
    StandIn()._compute_logits_from_slice,
    params=target.params,
    encoded_inputs=None,
    raw_inputs=jnp.repeat(inputs, NUM_DECODES, axis=0),
    max_decode_length=DECODE_LENGTH,
  )
  decode_fn = functools.partial(
    specdec_t5x.speculative_decode,
    draft_module=t5.Transformer(draft.config),
    draft_checkpoint_path=draft_checkpoint,
    gamma=GAMMA,
    temperature=0.0,
  )
  # T5X calls it traced; called eagerly here it shares the sampler's compilation.
  decodes, scores = decode_fn(
    inputs=jnp.zeros((BATCH, DECODE_LENGTH), jnp.int32),
    cache={},
    tokens_to_logits=callback,
    eos_id=1,
    num_decodes=NUM_DECODES,
    decode_rng=jax.random.PRNGKey(0),
    cache_offset=0,
  )
  assert decodes.shape == (BATCH, NUM_DECODES, DECODE_LENGTH)
  assert scores.shape == (BATCH, NUM_DECODES)
  np.testing.assert_array_equal(decodes[:, 1], _greedy(target, inputs))

  kwargs = dict(
    inputs=jnp.zeros((BATCH, DECODE_LENGTH), jnp.int32),
    cache={},
    tokens_to_logits=callback,
    eos_id=1,
  )
  with pytest.raises(ValueError, match=r"unsupported decoder params \['max_decode_steps'\]"):
    decode_fn(**kwargs, max_decode_steps=4)
  with pytest.raises(ValueError, match="initial_index: an encoder-decoder decode"):
    decode_fn(**kwargs, initial_index=jnp.zeros((BATCH,), jnp.int32))
  with pytest.raises(ValueError, match="draft_checkpoint_path is unset"):
    decode_fn(**kwargs, draft_checkpoint_path=None)
  with pytest.raises(ValueError, match="draft_module is unset"):
    decode_fn(**kwargs, draft_module=None)
  with pytest.raises(ValueError, match="at most one may be non-zero"):
    decode_fn(**kwargs, topk=5, topp=0.9)
  with pytest.raises(TypeError, match="tokens_to_logits must be the callback"):
    decode_fn(**{**kwargs, "tokens_to_logits": lambda state: state})


# ------------------------------------------------------------------ the draft restore
def _shapes(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)


def test_insert_draft_checkpoint_adds_the_draft_to_the_state(pair, draft_checkpoint):
  target, draft, _ = pair
  model_state = {"target": {**_shapes(target.params), specdec_t5x.DRAFT_KEY: _shapes(draft.params)}}
  read = {"target": {"decoder": "spec of the target"}, "state": {"step": 1}}
  restored = specdec_t5x.insert_draft_checkpoint(read, model_state, path=draft_checkpoint)
  assert restored["state"] == {"step": 1}
  assert restored["target"]["decoder"] == "spec of the target"
  assert_trees_equal(restored["target"][specdec_t5x.DRAFT_KEY], load_t5x(draft_checkpoint))
  cast = specdec_t5x.insert_draft_checkpoint(
    read, model_state, path=draft_checkpoint, dtype="bfloat16"
  )
  assert {np.asarray(x).dtype for x in jax.tree.leaves(cast["target"][specdec_t5x.DRAFT_KEY])} == {
    jnp.dtype(jnp.bfloat16)
  }
  # A checkpoint that already carries its draft is left as it is.
  assert specdec_t5x.insert_draft_checkpoint(restored, model_state, path="/unused") == restored

  with pytest.raises(ValueError, match="path: the draft checkpoint is unset"):
    specdec_t5x.insert_draft_checkpoint(read, model_state)
  with pytest.raises(ValueError, match=r"has no .specdec_draft. parameters"):
    specdec_t5x.insert_draft_checkpoint(
      read, {"target": _shapes(target.params)}, path=draft_checkpoint
    )
  two_layers = t5.param_shapes(t5.tiny_config("1.1"))  # the checkpoint has one
  wrong = {"target": {specdec_t5x.DRAFT_KEY: two_layers}}
  with pytest.raises(ValueError, match=r"parameter 'decoder/layers_1/.* has shape None"):
    specdec_t5x.insert_draft_checkpoint(read, wrong, path=draft_checkpoint)


def test_parameter_tree_helpers(pair):
  target, draft, _ = pair
  both = specdec_t5x.with_draft(target.params, draft.params)
  assert specdec_t5x.split_params(both) == (target.params, draft.params)
  with pytest.raises(ValueError, match=r"has no .specdec_draft. subtree"):
    specdec_t5x.split_params(target.params)
  with pytest.raises(ValueError, match="already holds"):
    specdec_t5x.with_draft(both, draft.params)


def test_config_of_and_sampling_from_t5x():
  cfg = t5.tiny_config("1.1").replace(mlp_activations=["gelu", "linear"])
  assert specdec_t5x.config_of(t5.Transformer(cfg)).mlp_activations == ("gelu", "linear")
  with pytest.raises(TypeError, match="draft_module must be"):
    specdec_t5x.config_of(object(), "draft_module")
  assert specdec_t5x.sampling_from_t5x(0.5, topk=0, topp=0.9) == SamplingConfig(0.5, None, 0.9)
  assert specdec_t5x.sampling_from_t5x(1.0, topk=4) == SamplingConfig(1.0, 4, None)


def test_model_class_needs_t5x():
  try:
    importlib.import_module("t5x.models")
  except ImportError:
    with pytest.raises(ImportError, match="t5x is not on PyPI"):
      _ = specdec_t5x.SpeculativeEncoderDecoderModel
  else:
    pytest.skip("t5x is installed: the ImportError path cannot be taken")


SKIPPING_TESTS = """
import pytest

@pytest.mark.t5x
def test_marked():
  pytest.skip('t5x is not installed')

def test_unmarked():
  pytest.skip('for another reason')
"""


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_require_t5x_turns_skipped_t5x_tests_into_failures(tmp_path):
  """tests/conftest.py: with SPECDEC_REQUIRE_T5X=1 (CI, after installing t5x) a
  t5x-marked test that skips fails; other skips stay skips."""
  (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
  (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  t5x: needs t5x\n")
  (tmp_path / "test_skips.py").write_text(SKIPPING_TESTS)
  env = {k: v for k, v in os.environ.items() if k != "SPECDEC_REQUIRE_T5X"}

  def pytest_summary(**extra):
    proc = subprocess.run(
      [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
        str(tmp_path),
      ],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=300,
      env={**env, **extra},
    )
    return proc.returncode, proc.stdout.strip().splitlines()[-1]

  code, summary = pytest_summary()
  assert code == 0 and summary.startswith("2 skipped"), summary
  code, summary = pytest_summary(SPECDEC_REQUIRE_T5X="1")
  assert code == 1 and summary.startswith("1 failed, 1 skipped"), summary


# ------------------------------------------------------------------ with t5x
@pytest.fixture(scope="module")
def t5x_lib():
  pytest.importorskip(
    "t5x.models", reason="t5x is not installed (not on PyPI; see specdec.t5x for how to install it)"
  )
  import seqio
  from t5x import decoding, models, partitioning, utils
  from t5x.examples.t5 import network

  return dict(
    decoding=decoding,
    models=models,
    partitioning=partitioning,
    utils=utils,
    network=network,
    seqio=seqio,
  )


def _batch(inputs):
  decoder = jnp.zeros((inputs.shape[0], DECODE_LENGTH), jnp.int32)
  return {
    "encoder_input_tokens": inputs,
    "decoder_input_tokens": decoder,
    "decoder_target_tokens": decoder,
    "decoder_loss_weights": decoder,
  }


def _input_shapes(inputs):
  return {k: v.shape for k, v in _batch(inputs).items()}


def _t5x_network(lib, cfg):
  return lib["network"].Transformer(
    lib["network"].T5Config(
      vocab_size=cfg.vocab_size,
      dtype=jnp.float32,
      emb_dim=cfg.emb_dim,
      num_heads=cfg.num_heads,
      num_encoder_layers=cfg.num_encoder_layers,
      num_decoder_layers=cfg.num_decoder_layers,
      head_dim=cfg.head_dim,
      mlp_dim=cfg.mlp_dim,
      mlp_activations=cfg.mlp_activations,
      dropout_rate=0.0,
      logits_via_embedding=cfg.logits_via_embedding,
    )
  )


def _t5x_greedy(lib, params, module, inputs):
  """T5X's own greedy decode: EncoderDecoderModel + decoding.temperature_sample."""
  vocab = lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  stock = lib["models"].EncoderDecoderModel(
    module=module,
    input_vocabulary=vocab,
    output_vocabulary=vocab,
    optimizer_def=None,
    decode_fn=functools.partial(lib["decoding"].temperature_sample, temperature=0.0),
  )
  return jax.jit(stock.predict_batch)(params, _batch(inputs))


def _restored(lib, model, inputs, target_dir, draft_dir):
  """A PjitPartitioner, the train-state initializer and the state T5X restores."""
  partitioner = lib["partitioning"].PjitPartitioner(num_partitions=1)
  initializer = lib["utils"].TrainStateInitializer(
    optimizer_def=None,
    init_fn=model.get_initial_variables,
    input_shapes=_input_shapes(inputs),
    partitioner=partitioner,
  )
  restore = lib["utils"].RestoreCheckpointConfig(
    path=target_dir,
    mode="specific",
    dtype="float32",
    strict=False,
    state_transformation_fns=[
      functools.partial(specdec_t5x.insert_draft_checkpoint, path=draft_dir)
    ],
  )
  return partitioner, initializer, initializer.from_checkpoint([restore])


@pytest.mark.t5x
@pytest.mark.parametrize("network", ["specdec", "t5x"])
def test_model_under_pjit_partitioner(t5x_lib, pair, draft_checkpoint, tmp_path, network):
  target, draft, inputs = pair
  target_dir = str(tmp_path / "target")
  write_t5x_legacy(target_dir, target.params)
  vocab = t5x_lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  module = (
    t5.Transformer(target.config) if network == "specdec" else _t5x_network(t5x_lib, target.config)
  )
  model = specdec_t5x.SpeculativeEncoderDecoderModel(
    module=module,
    draft_module=t5.Transformer(draft.config),
    input_vocabulary=vocab,
    output_vocabulary=vocab,
    optimizer_def=None,
    gamma=GAMMA,
    sampling=GREEDY,
  )
  partitioner, initializer, state = _restored(t5x_lib, model, inputs, target_dir, draft_checkpoint)
  restored = jax.tree.map(np.asarray, dict(state.params))
  assert_trees_equal(restored[specdec_t5x.DRAFT_KEY], draft.params)
  assert_trees_equal(
    {k: v for k, v in restored.items() if k != specdec_t5x.DRAFT_KEY}, target.params
  )

  def predict(num_decodes, return_all_decodes):
    fn = functools.partial(
      model.predict_batch_with_aux, num_decodes=num_decodes, return_all_decodes=return_all_decodes
    )
    return partitioner.partition(
      fn,
      in_axis_resources=(
        initializer.train_state_axes.params,
        partitioner.data_partition_spec,
        None,
      ),
      out_axis_resources=None,
    )(state.params, _batch(inputs), jax.random.PRNGKey(0))

  expected = np.asarray(_t5x_greedy(t5x_lib, target.params, module, inputs))
  best, aux = predict(1, False)
  assert best.shape == (BATCH, DECODE_LENGTH) and aux["scores"].shape == (BATCH,)
  np.testing.assert_array_equal(best, expected)
  every, aux = predict(3, True)
  assert every.shape == (BATCH, 3, DECODE_LENGTH)
  assert all(v.shape == (BATCH, 3) for v in aux.values())
  for j in range(3):
    np.testing.assert_array_equal(every[:, j], expected)


@pytest.mark.t5x
def test_sampled_scores_are_t5x_score_batch(t5x_lib, pair, draft_checkpoint):
  target, draft, inputs = pair
  vocab = t5x_lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  model = specdec_t5x.SpeculativeEncoderDecoderModel(
    module=t5.Transformer(target.config),
    draft_module=t5.Transformer(draft.config),
    input_vocabulary=vocab,
    output_vocabulary=vocab,
    gamma=GAMMA,
    sampling=SamplingConfig(1.0),
  )
  params = specdec_t5x.with_draft(target.params, load_t5x(draft_checkpoint))
  decodes, aux = jax.jit(
    functools.partial(model.predict_batch_with_aux, num_decodes=3, return_all_decodes=True)
  )(params, _batch(inputs), jax.random.PRNGKey(7))
  assert np.all(np.diff(np.asarray(aux["scores"]), axis=1) >= 0)
  flat = np.asarray(decodes).reshape(BATCH * 3, DECODE_LENGTH)
  lengths = np.asarray(aux["length"]).reshape(-1)
  weights = (np.arange(DECODE_LENGTH)[None] < lengths[:, None]).astype(np.int32)
  scored = model.score_batch(
    params,
    {
      "encoder_input_tokens": jnp.repeat(inputs, 3, axis=0),
      "decoder_input_tokens": np.pad(flat[:, :-1], ((0, 0), (1, 0))),
      "decoder_target_tokens": np.maximum(flat, weights),  # no padding mask inside
      "decoder_loss_weights": weights,
    },
  )
  # score_batch masks targets of id 0; a generated 0 inside a decode is rare here.
  keep = ~np.any((flat == 0) & (weights == 1), axis=1)
  np.testing.assert_allclose(
    np.asarray(aux["scores"]).reshape(-1)[keep], np.asarray(scored)[keep], rtol=1e-4, atol=1e-3
  )


@pytest.mark.t5x
def test_decode_fn_in_a_stock_t5x_model(t5x_lib, pair, draft_checkpoint):
  target, draft, inputs = pair
  vocab = t5x_lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  stock = t5x_lib["models"].EncoderDecoderModel(
    module=t5.Transformer(target.config),
    input_vocabulary=vocab,
    output_vocabulary=vocab,
    optimizer_def=None,
    decode_fn=functools.partial(
      specdec_t5x.speculative_decode,
      draft_module=t5.Transformer(draft.config),
      draft_checkpoint_path=draft_checkpoint,
      gamma=GAMMA,
      temperature=0.0,
    ),
  )
  decodes, aux = jax.jit(
    functools.partial(stock.predict_batch_with_aux, num_decodes=2, return_all_decodes=True)
  )(target.params, _batch(inputs), jax.random.PRNGKey(0))
  assert decodes.shape == (BATCH, 2, DECODE_LENGTH) and aux["scores"].shape == (BATCH, 2)
  expected = np.asarray(_t5x_greedy(t5x_lib, target.params, t5.Transformer(target.config), inputs))
  np.testing.assert_array_equal(decodes[:, 0], expected)
  np.testing.assert_array_equal(decodes[:, 1], expected)


@pytest.mark.t5x
def test_model_rejects_bad_arguments(t5x_lib, pair):
  target, draft, inputs = pair
  vocab = t5x_lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  kwargs = dict(
    module=t5.Transformer(target.config),
    draft_module=t5.Transformer(draft.config),
    input_vocabulary=vocab,
    output_vocabulary=vocab,
    gamma=GAMMA,
  )
  cls = specdec_t5x.SpeculativeEncoderDecoderModel
  with pytest.raises(ValueError, match="gamma"):
    cls(**{**kwargs, "gamma": 0})
  with pytest.raises(ValueError, match="decode_fn"):
    cls(**kwargs, decode_fn=t5x_lib["decoding"].beam_search)
  other = t5.Transformer(draft.config.replace(vocab_size=128))
  with pytest.raises(ValueError, match="draft_module: vocab_size 128"):
    cls(**{**kwargs, "draft_module": other})
  model = cls(**kwargs)
  params = specdec_t5x.with_draft(target.params, draft.params)
  with pytest.raises(ValueError, match="prompt_with_targets"):
    model.predict_batch_with_aux(params, _batch(inputs), prompt_with_targets=True)
  with pytest.raises(ValueError, match=r"unsupported keys \['topk'\]"):
    model.predict_batch_with_aux(params, _batch(inputs), decoder_params={"topk": 3})
  with pytest.raises(ValueError, match=r"has no .specdec_draft. subtree"):
    model.predict_batch_with_aux(target.params, _batch(inputs))


TINY_TASK_MODULE = """
import seqio
import tensorflow as tf
from specdec import data, tasks
_EXAMPLES = data.TASKS[data.WMT_TASK].read()[:{n}]
tasks.add_task('specdec_tiny_wmt', seqio.FunctionDataSource(
    lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices(
        {{k: [e[k] for e in _EXAMPLES] for k in ('en', 'de')}}), splits=['test']),
    data.WMT_TASK)
"""
INFER_OVERRIDES = """
from __gin__ import dynamic_registration
import __main__ as infer_script
from t5x import utils
infer_script.infer.mode = 'predict_with_aux'
TASK = 'specdec_tiny_wmt'
MIXTURE_OR_TASK_MODULE = 'tiny_task'
"""


def _inferences(out: pathlib.Path, task: str, mode: str, shards: int = 1) -> list:
  """The lines of the one file `python -m t5x.infer` writes per task and shard (the
  first of `shards`), after checking that `out` holds it, its completion marker and
  T5X's two logs (the operative gin configuration and the parameter shapes), only."""
  name = f"{task}-{mode}.jsonl-00000-of-{shards:05}"
  assert sorted(p.name for p in out.iterdir()) == sorted(
    [name, f"{name}.COMPLETED", "config.gin", "model-info.txt"]
  )
  return [json.loads(line) for line in (out / name).read_text().splitlines()]


@pytest.mark.t5x
@pytest.mark.parametrize("infer_file", ["infer.gin", "infer_decode_fn.gin"])
def test_t5x_infer_runs_a_run_config(t5x_lib, tmp_path, infer_file):
  """`python -m t5x.infer` on a run file of configs/runs with a tiny pair."""
  del t5x_lib
  examples = 3
  tiny = tiny_pair_gin(tmp_path, "wmt_ende_t0_small.gin")
  (tmp_path / "tiny_task.py").write_text(TINY_TASK_MODULE.format(n=examples))
  (tmp_path / "overrides.gin").write_text(INFER_OVERRIDES)
  out = tmp_path / "out"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t5x.infer",
      f"--gin_search_paths={SEARCH_PATH}",
      f"--gin_file=configs/runs/{infer_file}",
      f"--gin_file={tiny}",
      f"--gin_file={tmp_path / 'overrides.gin'}",
      f"--gin.OUTPUT_DIR='{out}'",
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=600,
    env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO / 'tests'}", "JAX_PLATFORMS": "cpu"},
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = _inferences(out, "specdec_tiny_wmt", "predict_with_aux")
  assert len(lines) == examples
  assert all("prediction" in line for line in lines)
  # docs/t5x.md: specdec's model adds the decode's statistics to the scores; a stock
  # model with specdec's decode_fn has T5X's aux.
  expected_aux = (
    {"scores", "length", "iterations", "drafted", "accepted", "alpha_hat"}
    if infer_file == "infer.gin"
    else {"scores"}
  )
  assert all(set(line["aux"]) == expected_aux for line in lines)


# Every 125th caption of the 1000: T5X's shard 0 of 125 (infer.num_shards).
MULTI30K_SHARDS = 125


@pytest.mark.t5x
def test_t5x_infer_runs_the_shipped_pair_from_its_run_file_alone(t5x_lib, tmp_path):
  """configs/runs/multi30k_ende_infer.gin as documented (OUTPUT_DIR the only setting;
  the shard only to keep the test short): at temperature 0 T5X writes the target's
  own greedy translations, and in 'predict' mode no aux."""
  del t5x_lib
  out = tmp_path / "out"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t5x.infer",
      f"--gin_search_paths={SEARCH_PATH}",
      "--gin_file=configs/runs/multi30k_ende_infer.gin",
      f"--gin.OUTPUT_DIR='{out}'",
      f"--gin.infer.num_shards={MULTI30K_SHARDS}",
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=600,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = _inferences(out, "specdec_multi30k_ende", "predict", MULTI30K_SHARDS)
  english = [en for en, _ in pretrained.test_sentences("multi30k_ende")]
  inputs = [data.TRANSLATE_PREFIX + en for en in english[::MULTI30K_SHARDS]]
  assert [line["inputs"]["inputs_pretokenized"] for line in lines] == inputs
  assert all(set(line) == {"inputs", "prediction"} for line in lines)
  info = pretrained.pair_info("multi30k_ende")
  cfg = t5.T5Config(
    **{
      **info["target"]["config"],
      "dtype": jnp.float32,
      "mlp_activations": ("gelu", "linear"),
      "dropout_rate": 0.0,
    }
  )
  target = t5.T5(
    cfg, load_t5x(specdec_t5x.shipped_checkpoint("multi30k_ende", "target"), cfg, dtype=jnp.float32)
  )
  vocab = data.Vocabulary()
  encoded = jnp.asarray(np.stack([vocab.encode_padded(x, 64) for x in inputs]))
  greedy = autoregressive_sample(
    target, encoded, jax.random.PRNGKey(0), max_new_tokens=64, sampling=GREEDY, eos_id=1
  ).tokens
  assert [line["prediction"] for line in lines] == [vocab.decode(row) for row in np.asarray(greedy)]


# ------------------------------------------------------------ decoder-only, with t5x
# Prompt lengths of the decoder-only batch (T5X's initial_index), one empty; L tokens.
DO_PREFIXES, DO_LENGTH = (3, 0, 5), 10


@pytest.fixture(scope="module")
def decoder_pair():
  """(target, draft): tiny T5X decoder-only networks, vocabulary 64; the draft is the
  target with noise added, so that it is accepted often but not always."""
  target = tiny_decoder(seed=2)
  noise = tiny_decoder(seed=3).params
  draft = target.replace(params=jax.tree.map(lambda p, n: p + 0.3 * n, target.params, noise))
  return target, draft


def _decoder_batch():
  """T5X's decoder-only features (seqio.DecoderFeatureConverter) of 3 prompts with
  random targets: row b's prompt is its first DO_PREFIXES[b] tokens."""
  rng = np.random.default_rng(11)
  targets = rng.integers(2, 64, (len(DO_PREFIXES), DO_LENGTH)).astype(np.int32)
  inputs = np.pad(targets[:, :-1], ((0, 0), (1, 0)))
  prompt = np.arange(DO_LENGTH)[None] <= np.asarray(DO_PREFIXES)[:, None]
  weights = (~prompt).astype(np.int32)
  return {
    "decoder_input_tokens": jnp.asarray(inputs),
    "decoder_target_tokens": jnp.asarray(targets),
    "decoder_causal_attention": jnp.asarray(prompt.astype(np.int32)),
    "decoder_loss_weights": jnp.asarray(weights),
  }


def _t5x_decoder_network(lib, cfg):
  return t5x_decoder_module(lib["decoder_only_network"], cfg)


@pytest.fixture(scope="module")
def t5x_decoder_lib(t5x_lib):
  # A regular (non-editable) install of t5x leaves this example out: it has no
  # __init__.py. Skip then, as without t5x (SPECDEC_REQUIRE_T5X=1 makes it fail).
  network = pytest.importorskip(
    "t5x.examples.decoder_only.network",
    reason="t5x is installed without t5x/examples/decoder_only (install it editable: docs/t5x.md)",
  )
  return {**t5x_lib, "decoder_only_network": network}


def _t5x_decoder_greedy(lib, params, module, bidirectional):
  """T5X's own greedy decode: DecoderOnlyModel + decoding.temperature_sample."""
  vocab = lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  stock = lib["models"].DecoderOnlyModel(
    module=module,
    vocabulary=vocab,
    optimizer_def=None,
    inputs_bidirectional_attention=bidirectional,
    decode_fn=functools.partial(lib["decoding"].temperature_sample, temperature=0.0),
  )
  return np.asarray(jax.jit(stock.predict_batch)(params, _decoder_batch()))


@pytest.mark.t5x
@pytest.mark.parametrize(
  "network,bidirectional", [("specdec", False), ("t5x", False), ("t5x", True)]
)
def test_decoder_only_model_greedy_is_t5x_temperature_sample(
  t5x_decoder_lib, decoder_pair, tmp_path, network, bidirectional
):
  """Under T5X's PjitPartitioner, restored from T5X checkpoints: the greedy decodes
  equal T5X's DecoderOnlyModel + temperature_sample on T5X's own network."""
  lib = t5x_decoder_lib
  target, draft = decoder_pair
  target_dir, draft_dir = str(tmp_path / "target"), str(tmp_path / "draft")
  write_t5x_legacy(target_dir, target.params)
  write_t5x_legacy(draft_dir, draft.params)
  from specdec.models import t5x_decoder

  module = (
    t5x_decoder.Transformer(target.config)
    if network == "specdec"
    else _t5x_decoder_network(lib, target.config)
  )
  vocab = lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  model = specdec_t5x.SpeculativeDecoderOnlyModel(
    module=module,
    draft_module=t5x_decoder.Transformer(draft.config),
    vocabulary=vocab,
    optimizer_def=None,
    gamma=GAMMA,
    sampling=GREEDY,
    inputs_bidirectional_attention=bidirectional,
  )
  batch = _decoder_batch()
  partitioner = lib["partitioning"].PjitPartitioner(num_partitions=1)
  initializer = lib["utils"].TrainStateInitializer(
    optimizer_def=None,
    init_fn=model.get_initial_variables,
    input_shapes={k: v.shape for k, v in batch.items()},
    partitioner=partitioner,
  )
  state = initializer.from_checkpoint(
    [
      lib["utils"].RestoreCheckpointConfig(
        path=target_dir,
        mode="specific",
        dtype="float32",
        strict=False,
        state_transformation_fns=[
          functools.partial(specdec_t5x.insert_draft_checkpoint, path=draft_dir)
        ],
      )
    ]
  )
  restored = jax.tree.map(np.asarray, dict(state.params))
  assert_trees_equal(restored[specdec_t5x.DRAFT_KEY], draft.params)

  def predict(num_decodes, return_all_decodes):
    fn = functools.partial(
      model.predict_batch_with_aux, num_decodes=num_decodes, return_all_decodes=return_all_decodes
    )
    return partitioner.partition(
      fn,
      in_axis_resources=(
        initializer.train_state_axes.params,
        partitioner.data_partition_spec,
        None,
      ),
      out_axis_resources=None,
    )(state.params, batch, jax.random.PRNGKey(0))

  expected = _t5x_decoder_greedy(
    lib, target.params, _t5x_decoder_network(lib, target.config), bidirectional
  )
  budget = DO_LENGTH - np.asarray(DO_PREFIXES)
  # Not vacuous: every row decodes different tokens, up to T5X's limit.
  assert all(len(set(row[:n])) >= 2 for row, n in zip(expected.tolist(), budget))
  assert all(np.count_nonzero(row) == n for row, n in zip(expected, budget))
  best, aux = predict(1, False)
  np.testing.assert_array_equal(best, expected)
  np.testing.assert_array_equal(aux["scores"], 0.0)
  assert np.all(aux["length"] <= budget)
  every, aux = predict(2, True)
  assert every.shape == (3, 2, DO_LENGTH) and aux["accepted"].shape == (3, 2)
  for j in range(2):
    np.testing.assert_array_equal(every[:, j], expected)
  assert np.sum(aux["accepted"]) > 0


@pytest.mark.t5x
@pytest.mark.parametrize("temperature,topk,topp", [(1.0, 0, 0.0), (0.7, 5, 0.0), (1.3, 0, 0.8)])
def test_decoder_only_scores_are_t5x_rescaled_log_probs(
  t5x_decoder_lib, decoder_pair, temperature, topk, topp
):
  """The sampler's scores are T5X's temperature_sample scores (rescale_log_probs=True)
  of the same decodes: log_softmax of T5X's temperature-scaled, top-k / top-p masked
  (binary_search) logits of T5X's teacher-forced pass, summed over the kept tokens;
  at temperature 1 without masks, T5X's score_batch."""
  lib = t5x_decoder_lib
  from t5x import binary_search

  from specdec.models import t5x_decoder

  target, draft = decoder_pair
  vocab = lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  model = specdec_t5x.SpeculativeDecoderOnlyModel(
    module=_t5x_decoder_network(lib, target.config),
    draft_module=t5x_decoder.Transformer(draft.config),
    vocabulary=vocab,
    optimizer_def=None,
    gamma=GAMMA,
    sampling=specdec_t5x.sampling_from_t5x(temperature, topk, topp),
  )
  params = specdec_t5x.with_draft(target.params, draft.params)
  batch = _decoder_batch()
  decodes, aux = jax.jit(
    functools.partial(model.predict_batch_with_aux, num_decodes=3, return_all_decodes=True)
  )(params, batch, jax.random.PRNGKey(7))
  assert np.all(np.diff(np.asarray(aux["scores"]), axis=1) >= 0)
  # Teacher-force every decode after its prompt: T5X's layout, shifted right by one.
  flat = np.asarray(
    specdec_t5x.with_prefix(
      batch["decoder_input_tokens"] * batch["decoder_causal_attention"], decodes
    )
  )
  flat = flat.reshape(-1, DO_LENGTH)
  lengths = np.asarray(aux["length"]).reshape(-1)
  prefixes = np.repeat(DO_PREFIXES, 3)
  weights = (np.arange(DO_LENGTH)[None] >= prefixes[:, None]) & (
    np.arange(DO_LENGTH)[None] < (prefixes + lengths)[:, None]
  )
  # Targets only set the padding mask (ids 0): every position is real here, even a
  # 0 the model generated.
  forced = {
    "decoder_input_tokens": jnp.asarray(np.pad(flat[:, :-1], ((0, 0), (1, 0)))),
    "decoder_target_tokens": jnp.ones(flat.shape, jnp.int32),
    "decoder_loss_weights": jnp.asarray(weights.astype(np.int32)),
  }
  logits = model._compute_logits(params, forced)
  scaled = logits / temperature
  if topk:
    scaled = binary_search.topk_mask(scaled, topk, -1e10)
  if topp:
    scaled = binary_search.topp_mask(scaled, topp, -1e10)
  log_probs = np.take_along_axis(np.asarray(jax.nn.log_softmax(scaled)), flat[..., None], axis=-1)[
    ..., 0
  ]
  expected = np.sum(np.where(weights, log_probs, 0.0), axis=1)
  np.testing.assert_allclose(np.asarray(aux["scores"]).reshape(-1), expected, rtol=1e-4, atol=1e-4)
  if (temperature, topk, topp) == (1.0, 0, 0.0):
    # score_batch reads its targets from decoder_target_tokens, whose 0s it also
    # masks as padding: compare the decodes without a generated 0.
    scored = model.score_batch(params, {**forced, "decoder_target_tokens": flat})
    keep = ~np.any((flat == 0) & weights, axis=1)
    assert np.sum(keep) >= 6
    np.testing.assert_allclose(
      np.asarray(aux["scores"]).reshape(-1)[keep], np.asarray(scored)[keep], rtol=1e-4, atol=1e-4
    )


@pytest.mark.t5x
def test_decode_fn_in_a_stock_t5x_decoder_only_model(t5x_decoder_lib, decoder_pair, tmp_path):
  lib = t5x_decoder_lib
  from specdec.models import t5x_decoder

  target, draft = decoder_pair
  write_t5x_legacy(str(tmp_path), draft.params)
  module = _t5x_decoder_network(lib, target.config)
  vocab = lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  stock = lib["models"].DecoderOnlyModel(
    module=module,
    vocabulary=vocab,
    optimizer_def=None,
    decode_fn=functools.partial(
      specdec_t5x.speculative_decode,
      draft_module=t5x_decoder.Transformer(draft.config),
      draft_checkpoint_path=str(tmp_path),
      gamma=GAMMA,
      temperature=0.0,
    ),
  )
  decodes, aux = jax.jit(
    functools.partial(stock.predict_batch_with_aux, num_decodes=2, return_all_decodes=True)
  )(target.params, _decoder_batch(), jax.random.PRNGKey(0))
  assert decodes.shape == (3, 2, DO_LENGTH) and aux["scores"].shape == (3, 2)
  expected = _t5x_decoder_greedy(lib, target.params, module, False)
  np.testing.assert_array_equal(decodes[:, 0], expected)
  np.testing.assert_array_equal(decodes[:, 1], expected)


@pytest.mark.t5x
def test_decoder_only_model_rejects_bad_arguments(t5x_decoder_lib, decoder_pair):
  lib = t5x_decoder_lib
  from specdec.models import t5x_decoder

  target, draft = decoder_pair
  vocab = lib["seqio"].PassThroughVocabulary(size=64, eos_id=1)
  kwargs = dict(
    module=t5x_decoder.Transformer(target.config),
    draft_module=t5x_decoder.Transformer(draft.config),
    vocabulary=vocab,
    gamma=GAMMA,
  )
  cls = specdec_t5x.SpeculativeDecoderOnlyModel
  with pytest.raises(ValueError, match="gamma must be >= 1"):
    cls(**{**kwargs, "gamma": 0})
  with pytest.raises(ValueError, match="decode_fn"):
    cls(**kwargs, decode_fn=lib["decoding"].temperature_sample)
  with pytest.raises(TypeError, match=r"draft_module must be specdec.models.t5x_dec"):
    cls(**{**kwargs, "draft_module": t5.Transformer(t5.tiny_config())})
  other = t5x_decoder.Transformer(draft.config.replace(vocab_size=128))
  with pytest.raises(ValueError, match="draft_module: vocab_size 128"):
    cls(**{**kwargs, "draft_module": other})
  model = cls(**kwargs)
  params = specdec_t5x.with_draft(target.params, draft.params)
  batch = _decoder_batch()
  with pytest.raises(ValueError, match="no decoder_causal_attention"):
    model.predict_batch_with_aux(
      params, {k: v for k, v in batch.items() if k != "decoder_causal_attention"}
    )
  with pytest.raises(ValueError, match=r"unsupported keys \['topk'\]"):
    model.predict_batch_with_aux(params, batch, decoder_params={"topk": 3})
  with pytest.raises(ValueError, match=r"has no .specdec_draft. subtree"):
    model.predict_batch_with_aux(target.params, batch)


def _tiny_decoder_only_gin(directory: pathlib.Path) -> str:
  """A gin file that takes configs/runs/decoder_only_wmt_ende_t0.gin with a tiny
  random decoder-only pair (T5's full vocabulary, which the shipped SentencePiece
  model needs) in place of XXL and Base, and short sequences."""
  from specdec.models import t5x_decoder

  lines = [
    "from __gin__ import dynamic_registration",
    "from specdec.models import t5x_decoder",
    "include 'configs/runs/decoder_only_wmt_ende_t0.gin'",
  ]
  for seed, role in enumerate(("target", "draft")):
    cfg = t5x_decoder.tiny_config(vocab_size=t5.T5_VOCAB_SIZE, num_layers=1)
    step_dir = directory / role / "checkpoint_1000"
    write_t5x_legacy(str(step_dir), t5x_decoder.random_params(cfg, seed=seed + 1))
    scope = f"tiny_{role}/t5x_decoder"
    lines += [
      f"{role.upper()}_MODULE = @{scope}.Transformer()",
      f"{scope}.Transformer.config = @{scope}.DecoderOnlyConfig()",
      f"{role.upper()}_CHECKPOINT_PATH = '{step_dir}'",
    ]
    lines += [
      f"{scope}.DecoderOnlyConfig.{field} = {getattr(cfg, field)!r}"
      for field in (
        "vocab_size",
        "emb_dim",
        "num_heads",
        "num_layers",
        "head_dim",
        "mlp_dim",
        "mlp_activations",
        "dropout_rate",
        "logits_via_embedding",
      )
    ]
    lines.append(f"{scope}.DecoderOnlyConfig.dtype = 'float32'")
  lines += ["TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 8}", "GAMMA = 3"]
  path = directory / "tiny_decoder_only.gin"
  path.write_text("\n".join(lines) + "\n")
  return str(path)


@pytest.mark.t5x
def test_t5x_infer_runs_the_decoder_only_config(t5x_lib, tmp_path):
  """`python -m t5x.infer` on configs/runs/infer_decoder_only.gin with a tiny pair."""
  del t5x_lib
  examples = 3
  tiny = _tiny_decoder_only_gin(tmp_path)
  (tmp_path / "tiny_task.py").write_text(TINY_TASK_MODULE.format(n=examples))
  (tmp_path / "overrides.gin").write_text(INFER_OVERRIDES)
  out = tmp_path / "out"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t5x.infer",
      f"--gin_search_paths={SEARCH_PATH}",
      "--gin_file=configs/runs/infer_decoder_only.gin",
      f"--gin_file={tiny}",
      f"--gin_file={tmp_path / 'overrides.gin'}",
      f"--gin.OUTPUT_DIR='{out}'",
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=600,
    env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO / 'tests'}", "JAX_PLATFORMS": "cpu"},
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = _inferences(out, "specdec_tiny_wmt", "predict_with_aux")
  assert len(lines) == examples
  assert all("prediction" in line for line in lines)
  assert all(
    set(line["aux"]) == {"scores", "length", "iterations", "drafted", "accepted", "alpha_hat"}
    for line in lines
  )
