"""Shared helpers of the T5 tests: tiny models and a T5X legacy checkpoint writer."""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import os
import pathlib
import re
from typing import Any

from flax import serialization, traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from specdec.models import t5, t5x_decoder

# T5X's checkpoint version (t5x/checkpoints.py `VERSION`).
T5X_CHECKPOINT_VERSION = 3


# Query kernels of the test models are scaled up: at T5's initial scale a random
# model's attention is nearly uniform, every context looks alike and greedy decodes
# repeat one token, which would make decoding comparisons vacuous.
QUERY_GAIN = 4.0


def tiny_model(version: str = "1.1", seed: int = 1, **overrides) -> t5.T5:
  """A random tiny float32 T5 as a DecodeModel (see QUERY_GAIN)."""
  cfg = t5.tiny_config(version, **overrides)
  params = jax.tree_util.tree_map_with_path(
    lambda path, x: x * QUERY_GAIN if path[-2].key == "query" else x, t5.random_params(cfg, seed)
  )
  return t5.T5(cfg, params)


def random_inputs(
  batch: int, length: int, vocab: int, seed: int = 0, pad_from: Mapping[int, int] | None = None
) -> jax.Array:
  """int32[batch, length] of ids in [2, vocab); row b padded (id 0) from pad_from[b]."""
  tokens = np.random.default_rng(seed).integers(2, vocab, (batch, length))
  for row, start in (pad_from or {}).items():
    tokens[row, start:] = 0
  return jnp.asarray(tokens, jnp.int32)


@jax.jit
def full_logits(model: t5.T5, inputs: jax.Array, decoder_inputs: jax.Array) -> jax.Array:
  """The non-cached forward pass: logits [B, L, V] of `decoder_inputs` [B, L]."""
  # Targets only matter for the padding mask; nonzero ones mask nothing.
  targets = jnp.ones_like(decoder_inputs)
  return model.module.apply(
    {"params": model.params}, inputs, decoder_inputs, targets, enable_dropout=False
  )


# One batch shape, one cache size and chunk sizes 1, 3, 5 for all the T5 tests, so
# that the compiled programs below are shared between tests and test modules.
BATCH, INPUT_LENGTH, DECODE_LENGTH, MAX_LENGTH = 3, 9, 8, 12


def standard_batch(model: t5.T5) -> tuple[jax.Array, jax.Array]:
  """Inputs [3, 9] with rows 1, 2 padded from 4, 7; decoder inputs [3, 8]
  [0, y_1, ..., y_7]."""
  inputs = random_inputs(BATCH, INPUT_LENGTH, model.vocab_size, seed=4, pad_from={1: 4, 2: 7})
  targets = random_inputs(BATCH, DECODE_LENGTH, model.vocab_size, seed=5)
  decoder_inputs = jnp.concatenate([jnp.zeros((BATCH, 1), jnp.int32), targets[:, :-1]], axis=1)
  return inputs, decoder_inputs


# Everything the tests run is compiled: op-by-op execution of even a tiny T5 costs
# more in per-op compilation than one program does.
encode = jax.jit(lambda model, inputs: model.encode(inputs))
init = jax.jit(lambda model, inputs, max_length: model.init(inputs, max_length), static_argnums=2)
extend = jax.jit(lambda model, state, tokens: model.extend(state, tokens))
rewind = jax.jit(lambda model, state, lengths: model.rewind(state, lengths))


def _hlo_computations(hlo_text: str) -> dict[str, list[str]]:
  """{computation name: its instruction lines} of a compiled module's `as_text()`."""
  computations, current = {}, None
  for line in hlo_text.splitlines():
    header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if header:
      current = computations.setdefault(header.group(1), [])
    elif current is not None and line.startswith(" "):
      current.append(line)
  return computations


def while_body_instructions(hlo_text: str) -> list[tuple[str, tuple[int, ...], str]]:
  """(opcode, shape, line) of every instruction run inside a `while` body of the
  compiled HLO `hlo_text`: the bodies and everything they call (fusions, nested
  loops, reductions), found by name. Tuple-shaped instructions are left out."""
  computations = _hlo_computations(hlo_text)
  callee = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
  pending = [
    name
    for lines in computations.values()
    for line in lines
    if " while(" in line
    for name in re.findall(r"body=%?([\w.\-]+)", line)
  ]
  reached = set()
  while pending:
    name = pending.pop()
    if name in reached or name not in computations:
      continue
    reached.add(name)
    for line in computations[name]:
      pending += callee.findall(line)
      for branches in re.findall(r"branch_computations=\{([^}]*)\}", line):
        pending += [b.strip().lstrip("%") for b in branches.split(",")]
  instruction = re.compile(
    r"\s*(?:ROOT )?%?[\w.\-]+ = \w+\[([\d,]*)\](?:\{[\d,:A-Z()]*\})? ([\w\-]+)\("
  )
  found = []
  for name in reached:
    for line in computations[name]:
      match = instruction.match(line)
      if match:
        dims = tuple(int(d) for d in match.group(1).split(",") if d)
        found.append((match.group(2), dims, line))
  return found


def write_t5x_legacy(
  ckpt_dir: str,
  params: Mapping[str, Any],
  step: int = 1000,
  extra_target: Mapping[str, np.ndarray] | None = None,
) -> str:
  """Writes `params` as T5X's legacy Checkpointer does; returns the msgpack path.

  Layout (t5x/checkpoints.py): `ckpt_dir/checkpoint`, a msgpack of
  {'version': 3, 'optimizer': {'target': ..., 'state': ...}} whose array leaves are
  TensorStore specs (as `ts.Spec.to_json()` writes them) of gzip zarr arrays at the
  checkpoint-relative paths `target.<dotted name>`. The optimizer state holds the
  step inline and one factored second moment per kernel, as Adafactor's does.
  """
  os.makedirs(ckpt_dir, exist_ok=True)

  def write(name: str, array: np.ndarray) -> dict[str, Any]:
    spec = {
      "driver": "zarr",
      "dtype": jnp.dtype(array.dtype).name,
      "kvstore": {"driver": "file", "path": name},
      "metadata": {
        "compressor": {"id": "gzip"},
        "shape": list(array.shape),
        "chunks": list(array.shape),
      },
    }
    absolute = dict(spec, kvstore={"driver": "file", "path": os.path.join(ckpt_dir, name)})
    store = ts.open(absolute, create=True, open=True).result()
    store.write(array).result()
    return ts.Spec(spec).to_json()

  flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}
  flat.update({tuple(k.split("/")): v for k, v in (extra_target or {}).items()})
  target = {k: write("target." + ".".join(k), v) for k, v in flat.items()}
  param_states = {
    k + ("v_row",): write(
      "state.param_states." + ".".join(k) + ".v_row", np.ones(v.shape[:1], np.float32)
    )
    for k, v in flat.items()
    if v.ndim == 2
  }
  contents = {
    "version": T5X_CHECKPOINT_VERSION,
    "optimizer": {
      "target": traverse_util.unflatten_dict(target),
      "state": {"step": np.int32(step), "param_states": traverse_util.unflatten_dict(param_states)},
    },
  }
  path = os.path.join(ckpt_dir, "checkpoint")
  with open(path, "wb") as f:
    f.write(serialization.msgpack_serialize(contents))
  return path


def write_t5x_orbax(model_dir: str, params: Mapping[str, Any], step: int = 1000) -> str:
  """Writes `params` as T5X's Orbax checkpointer does; returns the step directory.

  Layout: `model_dir/checkpoint_<step>/state`, a `PyTreeCheckpointHandler(use_ocdbt=
  True)` item of {'target': params, 'state': {'step': ...}} under a CheckpointManager
  with T5X's step prefix 'checkpoint'.
  """
  import orbax.checkpoint as ocp

  manager = ocp.CheckpointManager(
    model_dir,
    item_handlers={"state": ocp.PyTreeCheckpointHandler(use_ocdbt=True)},
    options=ocp.CheckpointManagerOptions(
      step_prefix="checkpoint", enable_async_checkpointing=False
    ),
  )
  tree = {"target": jax.tree.map(np.asarray, params), "state": {"step": np.int32(step)}}
  manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(tree)))
  manager.wait_until_finished()
  manager.close()
  return os.path.join(model_dir, f"checkpoint_{step}")


def assert_trees_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
  """Same keys, shapes, dtypes and values."""
  fa, fb = traverse_util.flatten_dict(a), traverse_util.flatten_dict(b)
  assert set(fa) == set(fb), set(fa) ^ set(fb)
  for key in fa:
    x, y = np.asarray(fa[key]), np.asarray(fb[key])
    assert x.shape == y.shape and x.dtype == y.dtype, (key, x.shape, x.dtype, y.shape, y.dtype)
    np.testing.assert_array_equal(x, y, err_msg="/".join(key))


TINY = dict(emb_dim=32, num_heads=2, head_dim=8, mlp_dim=64)
# A tiny target and draft (different random weights) on T5's full vocabulary, which
# the shipped SentencePiece model needs. One layer each: compilation dominates.
TINY_LAYERS = {"target": 1, "draft": 1}


def tiny_config(role: str) -> t5.T5Config:
  """The config of the tiny pair's 'target' or 'draft' (`tiny_pair_gin`)."""
  layers = TINY_LAYERS[role]
  return t5.tiny_config(
    "1.1", vocab_size=t5.T5_VOCAB_SIZE, num_encoder_layers=layers, num_decoder_layers=layers, **TINY
  )


def tiny_pair_gin(directory: pathlib.Path, run_file: str, examples: int = 3) -> str:
  """Writes random tiny target/draft T5X checkpoints under `directory`; returns a gin
  file that takes `run_file` (of configs/runs) with the tiny pair in place of T5-XXL
  and its draft, short sequences and `examples` examples."""
  lines = [
    "from __gin__ import dynamic_registration",
    "from specdec.models import t5",
    "from specdec import run",
    f"include 'configs/runs/{run_file}'",
  ]
  for seed, role in enumerate(TINY_LAYERS):
    cfg = tiny_config(role)
    # A step directory, as T5X's own checkpoints (and its Orbax restore) have them.
    step_dir = directory / role / "checkpoint_1000"
    write_t5x_legacy(str(step_dir), t5.random_params(cfg, seed=seed + 1))
    lines += [
      f"{role.upper()}_MODULE = @tiny_{role}/t5.Transformer()",
      f"tiny_{role}/t5.Transformer.config = @tiny_{role}/t5.T5Config()",
      f"{role.upper()}_CHECKPOINT_PATH = '{step_dir}'",
    ]
    lines += [
      f"tiny_{role}/t5.T5Config.{field} = {getattr(cfg, field)!r}"
      for field in (
        "vocab_size",
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
    ]
    lines.append(f"tiny_{role}/t5.T5Config.dtype = 'float32'")
  lines += [
    "TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 8}",
    f"run.evaluate.max_examples = {examples}",
  ]
  path = directory / "tiny.gin"
  path.write_text("\n".join(lines) + "\n")
  return str(path)


def tiny_decoder(seed=1, bidirectional=False, **overrides):
  """A random tiny T5X decoder-only network as a DecodeModel (see QUERY_GAIN)."""
  cfg = t5x_decoder.tiny_config(**overrides)
  params = jax.tree_util.tree_map_with_path(
    lambda path, x: x * QUERY_GAIN if path[-2].key == "query" else x,
    t5x_decoder.random_params(cfg, seed),
  )
  return t5x_decoder.T5XDecoder(cfg, params, bidirectional_prefix=bidirectional)


def t5x_decoder_module(network, cfg):
  """T5X's own decoder-only module (`network`: t5x.examples.decoder_only.network)
  with the config of a `t5x_decoder.T5XDecoderConfig`."""
  return network.DecoderWrapper(
    network.TransformerConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
  )
