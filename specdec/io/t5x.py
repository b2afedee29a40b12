"""T5X checkpoints (legacy msgpack + TensorStore zarr, and Orbax) <-> T5's parameter tree.

* `load_t5x(path)`: a T5X checkpoint as published. The legacy format is a msgpack file
  `checkpoint` (read with flax's msgpack serialization) whose `target` leaves are
  TensorStore specs of zarr arrays named by dotted path, e.g.
  `target.decoder.layers_0.self_attention.key.kernel` (read with `tensorstore`). The
  Orbax format is a `state` directory written by `orbax-checkpoint`'s
  `PyTreeCheckpointHandler` (read with it, restoring `target` only).
* `save_t5x(model_dir, params, step)`: the legacy layout, which T5X and `load_t5x` read.

The tree is `specdec.models.t5.Transformer`'s, which is T5X's. Given a config, the
reader checks the tree (`check_shapes`) before reading any array.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import copy
import os
import re
from typing import Any

from flax import serialization, traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec import _optional
from specdec.io import _tree
from specdec.io._tree import DTypeLike, Params
from specdec.models import t5

__all__ = [
  "T5X_LEGACY_FILE",
  "T5X_STEP_DIR",
  "ORBAX_STATE_DIR",
  "ORBAX_METADATA_FILE",
  "TARGET_KEY",
  "T5X_CHECKPOINT_VERSION",
  "expected_shapes",
  "check_shapes",
  "check_params",
  "load_t5x",
  "save_t5x",
]

# T5X layouts (t5x/checkpoints.py, t5x/checkpoint_utils.py).
T5X_LEGACY_FILE = "checkpoint"
T5X_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
ORBAX_STATE_DIR = "state"
ORBAX_METADATA_FILE = "_METADATA"
TARGET_KEY = "target"


def expected_shapes(cfg: t5.T5Config) -> dict[str, tuple[int, ...]]:
  """{'decoder/layers_0/self_attention/key/kernel': shape, ...} of `cfg`."""
  return {k: tuple(v.shape) for k, v in _tree.flatten(t5.param_shapes(cfg)).items()}


def check_shapes(
  found: Mapping[str, tuple[int, ...]], cfg: t5.T5Config, describe: Callable[[str], str] = repr
) -> None:
  """Checks flat {key: shape} against `cfg`; `describe(key)` names a key in errors.

  Raises:
    ValueError: naming the first missing key, unexpected key or mismatched shape,
      with both shapes.
  """
  _tree.check_flat(found, expected_shapes(cfg), describe)


def check_params(params: Mapping[str, Any], cfg: t5.T5Config) -> None:
  """Checks that `params` is exactly `cfg`'s parameter tree (keys and shapes)."""
  if not isinstance(params, Mapping):
    raise TypeError(f"params must be a nested dict, got {type(params).__name__}")
  check_shapes({k: np.shape(v) for k, v in _tree.flatten(params).items()}, cfg)


# ------------------------------------------------------------------------------
# T5X.
# ------------------------------------------------------------------------------
def _find_t5x(path: str | os.PathLike) -> tuple[str, str]:
  """('legacy', msgpack file) or ('orbax', state dir) for a T5X checkpoint `path`.

  `path` may be the msgpack file, a step directory `checkpoint_<step>` (either
  format), its Orbax `state` directory, or a model directory, whose latest step is
  taken.
  """
  path = os.fspath(path)
  if os.path.isfile(path):
    return "legacy", path
  if not os.path.isdir(path):
    raise ValueError(f"path: no such file or directory: {path}")
  if os.path.isfile(os.path.join(path, ORBAX_METADATA_FILE)):
    return "orbax", path
  for directory in (path, os.path.join(path, ORBAX_STATE_DIR)):
    if os.path.isfile(os.path.join(directory, T5X_LEGACY_FILE)):
      return "legacy", os.path.join(directory, T5X_LEGACY_FILE)
  state = os.path.join(path, ORBAX_STATE_DIR)
  if os.path.isfile(os.path.join(state, ORBAX_METADATA_FILE)):
    return "orbax", state
  steps = [int(m.group(1)) for m in map(T5X_STEP_DIR.match, os.listdir(path)) if m]
  if steps:
    return _find_t5x(os.path.join(path, f"checkpoint_{max(steps)}"))
  raise ValueError(
    f"path: {path} holds no T5X checkpoint (a {T5X_LEGACY_FILE!r} msgpack file, an "
    f"Orbax {ORBAX_STATE_DIR!r} directory, or checkpoint_<step> directories)"
  )


def _is_ts_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and "driver" in value


def _absolute_ts_spec(spec: Mapping[str, Any], ckpt_dir: str, key: str) -> dict:
  """The spec with its checkpoint-relative path made absolute (T5X writes relative
  paths so that checkpoints can move), minus the creation-only metadata."""
  out = copy.deepcopy(dict(spec))
  metadata = out.get("metadata", {})
  metadata.pop("chunks", None)
  metadata.pop("compressor", None)
  kvstore = out.get("kvstore")
  if isinstance(kvstore, Mapping) and "path" in kvstore:
    if kvstore.get("driver") not in ("file", "gfile"):
      raise ValueError(
        f"{key}: only local checkpoints are supported, this array is "
        f"on kvstore driver {kvstore.get('driver')!r}"
      )
    out["kvstore"] = {"driver": "file", "path": os.path.join(ckpt_dir, kvstore["path"])}
  elif "path" in out:  # tensorstore < 0.1.14 wrote the path at the top level.
    out["kvstore"] = {"driver": "file", "path": os.path.join(ckpt_dir, out.pop("path"))}
  else:
    raise ValueError(f"{key}: malformed TensorStore spec (no path): {out}")
  return out


class _ArraySource:
  """A parameter whose shape is known before its data is read."""

  def __init__(self, shape: tuple[int, ...], read: Callable[[np.dtype | None], np.ndarray]):
    self.shape = tuple(shape)
    self.read = read


def _tensorstore_source(spec: Mapping[str, Any], ckpt_dir: str, key: str) -> _ArraySource:
  import tensorstore as ts

  spec = _absolute_ts_spec(spec, ckpt_dir, key)
  try:
    # TensorStore checks the zarr metadata against the shape the msgpack records.
    store = ts.open(spec, open=True, read=True).result()
  except ValueError as e:
    raise ValueError(
      f"{key}: cannot open TensorStore array at {spec['kvstore']['path']}: {e}"
    ) from e

  def read(dtype: np.dtype | None) -> np.ndarray:
    source = store if dtype is None else ts.cast(store, dtype.name)
    try:
      return np.asarray(source.read().result())
    except ValueError as e:
      raise ValueError(f"{key}: cannot read {spec['kvstore']['path']}: {e}") from e

  return _ArraySource(store.shape, read)


def _inline_source(value: Any) -> _ArraySource:
  array = np.asarray(value)
  return _ArraySource(array.shape, lambda dtype: array if dtype is None else array.astype(dtype))


def _legacy_sources(ckpt_file: str) -> dict[str, _ArraySource]:
  with open(ckpt_file, "rb") as f:
    raw = f.read()
  try:
    contents = serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several unrelated types on bad input.
    raise ValueError(
      f"path: {ckpt_file} is not a T5X msgpack checkpoint: {type(e).__name__}: {e}"
    ) from e
  # T5X >= version 1 nests the train state under 'optimizer'; older flax ones do not.
  state = contents.get("optimizer", contents) if isinstance(contents, Mapping) else None
  if not isinstance(state, Mapping) or not isinstance(state.get(TARGET_KEY), Mapping):
    raise ValueError(f"path: {ckpt_file} has no {TARGET_KEY!r} parameter tree")
  flat = traverse_util.flatten_dict(state[TARGET_KEY], is_leaf=lambda _, v: _is_ts_spec(v))
  ckpt_dir = os.path.dirname(ckpt_file)
  return {
    _tree.join_key(k): (
      _tensorstore_source(v, ckpt_dir, ".".join((TARGET_KEY,) + k))
      if _is_ts_spec(v)
      else _inline_source(v)
    )
    for k, v in flat.items()
  }


def _orbax_sources(state_dir: str) -> dict[str, _ArraySource]:
  ocp = _optional.require(
    "orbax.checkpoint", "checkpoints", purpose="reading an Orbax T5X checkpoint"
  )
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    metadata = checkpointer.metadata(state_dir).item_metadata.tree
  except (ValueError, OSError, KeyError) as e:
    raise ValueError(f"path: cannot read the Orbax metadata of {state_dir}: {e}") from e
  if not isinstance(metadata, Mapping) or TARGET_KEY not in metadata:
    raise ValueError(f"path: the Orbax checkpoint {state_dir} has no {TARGET_KEY!r}")
  target_meta = metadata[TARGET_KEY]
  cache: dict[np.dtype | None, dict[str, np.ndarray]] = {}

  def restore_all(dtype: np.dtype | None) -> dict[str, np.ndarray]:
    # Orbax restores a tree in one call; every source shares that one read.
    if dtype not in cache:
      args = ocp.args.PyTreeRestore(
        item={TARGET_KEY: jax.tree.map(lambda m: np.zeros((), m.dtype), target_meta)},
        restore_args={
          TARGET_KEY: jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype), target_meta
          )
        },
        partial_restore=True,
      )
      try:
        cache[dtype] = _tree.flatten(checkpointer.restore(state_dir, args=args)[TARGET_KEY])
      except (ValueError, OSError) as e:
        raise ValueError(f"path: cannot restore {state_dir}: {e}") from e
    return cache[dtype]

  def reader(k: str) -> Callable[[np.dtype | None], np.ndarray]:
    return lambda dtype: restore_all(dtype)[k]

  return {k: _ArraySource(m.shape, reader(k)) for k, m in _tree.flatten(target_meta).items()}


def load_t5x(
  path: str | os.PathLike, cfg: t5.T5Config | None = None, *, dtype: DTypeLike | None = None
) -> Params:
  """The `target` parameter tree of a T5X checkpoint (legacy msgpack+zarr or Orbax).

  Args:
    path: the checkpoint: its msgpack `checkpoint` file, a `checkpoint_<step>`
      directory, an Orbax `state` directory, or a model directory (latest step).
    cfg: if given, the tree is checked against it before any array is read.
    dtype: cast every parameter to this dtype (e.g. jnp.bfloat16) while reading.

  Returns:
    Nested dicts of numpy arrays, as `t5.Transformer` names them.

  Raises:
    ValueError: no checkpoint at `path`, an unreadable file, or (with `cfg`) a
      missing key, unexpected key or shape mismatch, named with both shapes.
  """
  dtype = _tree.float_dtype(dtype)
  kind, location = _find_t5x(path)
  sources = _legacy_sources(location) if kind == "legacy" else _orbax_sources(location)
  if cfg is not None:
    check_shapes(
      {k: s.shape for k, s in sources.items()},
      cfg,
      describe=lambda k: f"{k!r} ({TARGET_KEY}.{k.replace('/', '.')})",
    )
  return _tree.unflatten({k: s.read(dtype) for k, s in sources.items()})


# T5X's checkpoint format version (t5x/checkpoints.py `VERSION`).
T5X_CHECKPOINT_VERSION = 3


def save_t5x(model_dir: str | os.PathLike, params: Mapping[str, Any], step: int) -> str:
  """Writes `params` as a T5X legacy checkpoint; returns its `checkpoint_<step>` dir.

  The published layout that `load_t5x` (and T5X) read: `checkpoint_<step>/checkpoint`,
  a msgpack of {'version': 3, 'optimizer': {'target': ..., 'state': {'step': ...}}}
  whose array leaves are TensorStore specs of gzip zarr arrays stored beside it at the
  relative paths `target.<dotted name>`. Arrays keep their dtype (bfloat16 included).
  Only the parameters are written: the result serves inference, not resumed training.
  """
  import tensorstore as ts

  if isinstance(step, bool) or not isinstance(step, int) or step < 0:
    raise ValueError(f"step must be an int >= 0, got {step!r}")
  ckpt_dir = os.path.join(os.fspath(model_dir), f"checkpoint_{step}")
  os.makedirs(ckpt_dir, exist_ok=True)

  def write(path: tuple[str, ...], array: Any) -> dict[str, Any]:
    array = np.asarray(array)
    name = ".".join((TARGET_KEY,) + path)
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
    store = ts.open(
      dict(spec, kvstore={"driver": "file", "path": os.path.join(ckpt_dir, name)}),
      create=True,
      delete_existing=True,
    ).result()
    store.write(array).result()
    return ts.Spec(spec).to_json()

  flat = traverse_util.flatten_dict(dict(params))
  target = traverse_util.unflatten_dict({k: write(k, v) for k, v in flat.items()})
  contents = {
    "version": T5X_CHECKPOINT_VERSION,
    "optimizer": {TARGET_KEY: target, "state": {"step": np.int64(step)}},
  }
  with open(os.path.join(ckpt_dir, T5X_LEGACY_FILE), "wb") as f:
    f.write(serialization.msgpack_serialize(contents))
  return ckpt_dir
