"""T5 parameters from the checkpoints users have: T5X (legacy and Orbax) and Hugging Face.

Every loader returns the parameter tree of `specdec.models.t5.Transformer`, which is
T5X's: nested dicts keyed like `decoder/layers_0/self_attention/key/kernel`, numpy
leaves. Given a config, a loader checks the tree before reading any array: a missing
key, an unexpected key, or a shape the config does not expect is a `ValueError` that
names the key and both shapes.

* `load_t5x(path)`: a T5X checkpoint as published. The legacy format is a msgpack file
  `checkpoint` (read with flax's msgpack serialization) whose `target` leaves are
  TensorStore specs of zarr arrays named by dotted path, e.g.
  `target.decoder.layers_0.self_attention.key.kernel` (read with `tensorstore`). The
  Orbax format is a `state` directory written by `orbax-checkpoint`'s
  `PyTreeCheckpointHandler` (read with it, restoring `target` only).
* `load_hf(path, cfg)`: Hugging Face `T5ForConditionalGeneration` safetensors
  (`safetensors` package), mapped onto the same tree; `export_hf` / `save_hf` are the
  inverse mapping.
"""

from __future__ import annotations

import copy
import json
import os
import re
from typing import Any, Callable, Iterable, Mapping

from flax import serialization, traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec.models import t5

Params = dict[str, Any]
DTypeLike = Any

# T5X layouts (t5x/checkpoints.py, t5x/checkpoint_utils.py).
T5X_LEGACY_FILE = 'checkpoint'
T5X_STEP_DIR = re.compile(r'^checkpoint_(\d+)$')
ORBAX_STATE_DIR = 'state'
ORBAX_METADATA_FILE = '_METADATA'
TARGET_KEY = 'target'
# Hugging Face layouts (transformers' `save_pretrained`).
HF_WEIGHTS_FILE = 'model.safetensors'
HF_INDEX_FILE = 'model.safetensors.index.json'
HF_CONFIG_FILE = 'config.json'
HF_SHARED = 'shared.weight'
# Names under which transformers may also store the shared embedding (T5 always ties
# its input embeddings; v1.0 also ties the output layer).
HF_INPUT_EMBEDDING_ALIASES = ('encoder.embed_tokens.weight',
                              'decoder.embed_tokens.weight')
HF_LM_HEAD = 'lm_head.weight'
# In old transformers checkpoints, never used by the model (transformers itself
# ignores it on load: `_keys_to_ignore_on_load_unexpected`).
HF_IGNORED = ('decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight',)
# `T5Config.mlp_activations` <-> transformers' `feed_forward_proj`. flax's `gelu` is
# the tanh approximation, which is transformers' `gelu_new`, its gated-gelu.
HF_FEED_FORWARD = {('relu',): 'relu', ('gelu', 'linear'): 'gated-gelu'}
HF_EOS_ID = 1


def _key(path: Iterable[str]) -> str:
  return '/'.join(path)


def _flatten(tree: Mapping[str, Any]) -> dict[str, Any]:
  return {_key(k): v for k, v in traverse_util.flatten_dict(tree).items()}


def _unflatten(flat: Mapping[str, Any]) -> Params:
  return traverse_util.unflatten_dict({tuple(k.split('/')): v for k, v in flat.items()})


def _dtype(dtype: DTypeLike | None) -> np.dtype | None:
  if dtype is None:
    return None
  try:
    result = jnp.dtype(dtype)
  except TypeError as e:
    raise TypeError(f'dtype: {dtype!r} is not a dtype') from e
  if not jnp.issubdtype(result, jnp.floating):
    raise ValueError(f'dtype must be a float dtype, got {result}')
  return result


def expected_shapes(cfg: t5.T5Config) -> dict[str, tuple[int, ...]]:
  """{'decoder/layers_0/self_attention/key/kernel': shape, ...} of `cfg`."""
  return {k: tuple(v.shape) for k, v in _flatten(t5.param_shapes(cfg)).items()}


def check_shapes(found: Mapping[str, tuple[int, ...]], cfg: t5.T5Config,
                 describe: Callable[[str], str] = repr) -> None:
  """Checks flat {key: shape} against `cfg`; `describe(key)` names a key in errors.

  Raises:
    ValueError: naming the first missing key, unexpected key or mismatched shape,
      with both shapes.
  """
  _check_flat(found, expected_shapes(cfg), describe)


def _check_flat(found: Mapping[str, tuple[int, ...]],
                expected: Mapping[str, tuple[int, ...]],
                describe: Callable[[str], str]) -> None:
  for key in sorted(expected):
    if key not in found:
      raise ValueError(f'missing key {describe(key)}: the config expects shape '
                       f'{expected[key]}')
  for key in sorted(found):
    if key not in expected:
      raise ValueError(f'unexpected key {describe(key)} with shape '
                       f'{tuple(found[key])}: not a parameter of this config')
    if tuple(found[key]) != expected[key]:
      raise ValueError(f'shape mismatch for {describe(key)}: the checkpoint has '
                       f'{tuple(found[key])}, the config expects {expected[key]}')


def check_params(params: Mapping[str, Any], cfg: t5.T5Config) -> None:
  """Checks that `params` is exactly `cfg`'s parameter tree (keys and shapes)."""
  if not isinstance(params, Mapping):
    raise TypeError(f'params must be a nested dict, got {type(params).__name__}')
  check_shapes({k: np.shape(v) for k, v in _flatten(params).items()}, cfg)


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
    return 'legacy', path
  if not os.path.isdir(path):
    raise ValueError(f'path: no such file or directory: {path}')
  if os.path.isfile(os.path.join(path, ORBAX_METADATA_FILE)):
    return 'orbax', path
  for directory in (path, os.path.join(path, ORBAX_STATE_DIR)):
    if os.path.isfile(os.path.join(directory, T5X_LEGACY_FILE)):
      return 'legacy', os.path.join(directory, T5X_LEGACY_FILE)
  state = os.path.join(path, ORBAX_STATE_DIR)
  if os.path.isfile(os.path.join(state, ORBAX_METADATA_FILE)):
    return 'orbax', state
  steps = [int(m.group(1)) for m in map(T5X_STEP_DIR.match, os.listdir(path)) if m]
  if steps:
    return _find_t5x(os.path.join(path, f'checkpoint_{max(steps)}'))
  raise ValueError(
      f'path: {path} holds no T5X checkpoint (a {T5X_LEGACY_FILE!r} msgpack file, an '
      f'Orbax {ORBAX_STATE_DIR!r} directory, or checkpoint_<step> directories)')


def _is_ts_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and 'driver' in value


def _absolute_ts_spec(spec: Mapping[str, Any], ckpt_dir: str, key: str) -> dict:
  """The spec with its checkpoint-relative path made absolute (T5X writes relative
  paths so that checkpoints can move), minus the creation-only metadata."""
  spec = copy.deepcopy(dict(spec))
  metadata = spec.get('metadata', {})
  metadata.pop('chunks', None)
  metadata.pop('compressor', None)
  kvstore = spec.get('kvstore')
  if isinstance(kvstore, Mapping) and 'path' in kvstore:
    if kvstore.get('driver') not in ('file', 'gfile'):
      raise ValueError(f'{key}: only local checkpoints are supported, this array is '
                       f'on kvstore driver {kvstore.get("driver")!r}')
    spec['kvstore'] = {'driver': 'file', 'path': os.path.join(ckpt_dir, kvstore['path'])}
  elif 'path' in spec:  # tensorstore < 0.1.14 wrote the path at the top level.
    spec['kvstore'] = {'driver': 'file',
                       'path': os.path.join(ckpt_dir, spec.pop('path'))}
  else:
    raise ValueError(f'{key}: malformed TensorStore spec (no path): {spec}')
  return spec


class _ArraySource:
  """A parameter whose shape is known before its data is read."""

  def __init__(self, shape: tuple[int, ...],
               read: Callable[[np.dtype | None], np.ndarray]):
    self.shape = tuple(shape)
    self.read = read


def _tensorstore_source(spec: Mapping[str, Any], ckpt_dir: str, key: str) -> _ArraySource:
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  spec = _absolute_ts_spec(spec, ckpt_dir, key)
  try:
    # TensorStore checks the zarr metadata against the shape the msgpack records.
    store = ts.open(spec, open=True, read=True).result()
  except ValueError as e:
    raise ValueError(f'{key}: cannot open TensorStore array at '
                     f'{spec["kvstore"]["path"]}: {e}') from e

  def read(dtype: np.dtype | None) -> np.ndarray:
    source = store if dtype is None else ts.cast(store, dtype.name)
    try:
      return np.asarray(source.read().result())
    except ValueError as e:
      raise ValueError(f'{key}: cannot read {spec["kvstore"]["path"]}: {e}') from e

  return _ArraySource(store.shape, read)


def _inline_source(value: Any) -> _ArraySource:
  array = np.asarray(value)
  return _ArraySource(array.shape,
                      lambda dtype: array if dtype is None else array.astype(dtype))


def _legacy_sources(ckpt_file: str) -> dict[str, _ArraySource]:
  with open(ckpt_file, 'rb') as f:
    raw = f.read()
  try:
    contents = serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several unrelated types on bad input.
    raise ValueError(f'path: {ckpt_file} is not a T5X msgpack checkpoint: '
                     f'{type(e).__name__}: {e}') from e
  # T5X >= version 1 nests the train state under 'optimizer'; older flax ones do not.
  state = contents.get('optimizer', contents) if isinstance(contents, Mapping) else None
  if not isinstance(state, Mapping) or not isinstance(state.get(TARGET_KEY), Mapping):
    raise ValueError(f'path: {ckpt_file} has no {TARGET_KEY!r} parameter tree')
  flat = traverse_util.flatten_dict(state[TARGET_KEY],
                                    is_leaf=lambda _, v: _is_ts_spec(v))
  ckpt_dir = os.path.dirname(ckpt_file)
  return {_key(k): (_tensorstore_source(v, ckpt_dir, '.'.join((TARGET_KEY,) + k))
                    if _is_ts_spec(v) else _inline_source(v))
          for k, v in flat.items()}


def _orbax_sources(state_dir: str) -> dict[str, _ArraySource]:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    metadata = checkpointer.metadata(state_dir).item_metadata.tree
  except (ValueError, OSError, KeyError) as e:
    raise ValueError(f'path: cannot read the Orbax metadata of {state_dir}: {e}') from e
  if not isinstance(metadata, Mapping) or TARGET_KEY not in metadata:
    raise ValueError(f'path: the Orbax checkpoint {state_dir} has no {TARGET_KEY!r}')
  target_meta = metadata[TARGET_KEY]
  cache: dict[np.dtype | None, dict[str, np.ndarray]] = {}

  def restore_all(dtype: np.dtype | None) -> dict[str, np.ndarray]:
    # Orbax restores a tree in one call; every source shares that one read.
    if dtype not in cache:
      args = ocp.args.PyTreeRestore(
          item={TARGET_KEY: jax.tree.map(lambda m: np.zeros((), m.dtype), target_meta)},
          restore_args={TARGET_KEY: jax.tree.map(
              lambda _: ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype),
              target_meta)},
          partial_restore=True)
      try:
        cache[dtype] = _flatten(checkpointer.restore(state_dir, args=args)[TARGET_KEY])
      except (ValueError, OSError) as e:
        raise ValueError(f'path: cannot restore {state_dir}: {e}') from e
    return cache[dtype]

  return {k: _ArraySource(m.shape, lambda dtype, k=k: restore_all(dtype)[k])
          for k, m in _flatten(target_meta).items()}


def load_t5x(path: str | os.PathLike, cfg: t5.T5Config | None = None, *,
             dtype: DTypeLike | None = None) -> Params:
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
  dtype = _dtype(dtype)
  kind, location = _find_t5x(path)
  sources = _legacy_sources(location) if kind == 'legacy' else _orbax_sources(location)
  if cfg is not None:
    check_shapes({k: s.shape for k, s in sources.items()}, cfg,
                 describe=lambda k: f"{k!r} ({TARGET_KEY}.{k.replace('/', '.')})")
  return _unflatten({k: s.read(dtype) for k, s in sources.items()})


# ------------------------------------------------------------------------------
# Hugging Face.
# ------------------------------------------------------------------------------
def hf_names(cfg: t5.T5Config) -> dict[str, tuple[str, bool]]:
  """{T5X key: (transformers state-dict name, transposed)} for every parameter.

  transformers stores `nn.Linear` weights as [out, in] where T5X kernels are
  [in, out], and the relative attention table as [buckets, heads] where T5X has
  [heads, buckets]: those are transposed. transformers keeps the relative bias in
  the first layer of each stack only; T5X shares one per stack, the same table.
  """
  t5.check_config(cfg)
  names = {
      'token_embedder/embedding': (HF_SHARED, False),
      'encoder/relpos_bias/rel_embedding':
          ('encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight', True),
      'decoder/relpos_bias/rel_embedding':
          ('decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight', True),
      'encoder/encoder_norm/scale': ('encoder.final_layer_norm.weight', False),
      'decoder/decoder_norm/scale': ('decoder.final_layer_norm.weight', False),
  }
  if not cfg.logits_via_embedding:
    names['decoder/logits_dense/kernel'] = (HF_LM_HEAD, True)
  wi = (['wi'] if len(cfg.mlp_activations) == 1
        else [f'wi_{i}' for i in range(len(cfg.mlp_activations))])

  def attention(ours: str, theirs: str) -> None:
    for t5x_name, hf_name in zip(('query', 'key', 'value', 'out'), 'qkvo'):
      names[f'{ours}/{t5x_name}/kernel'] = (f'{theirs}.{hf_name}.weight', True)

  def mlp(ours: str, theirs: str) -> None:
    for name in wi + ['wo']:
      names[f'{ours}/{name}/kernel'] = (f'{theirs}.DenseReluDense.{name}.weight', True)

  for i in range(cfg.num_encoder_layers):
    ours, theirs = f'encoder/layers_{i}', f'encoder.block.{i}.layer'
    attention(f'{ours}/attention', f'{theirs}.0.SelfAttention')
    names[f'{ours}/pre_attention_layer_norm/scale'] = (f'{theirs}.0.layer_norm.weight',
                                                       False)
    mlp(f'{ours}/mlp', f'{theirs}.1')
    names[f'{ours}/pre_mlp_layer_norm/scale'] = (f'{theirs}.1.layer_norm.weight', False)
  for i in range(cfg.num_decoder_layers):
    ours, theirs = f'decoder/layers_{i}', f'decoder.block.{i}.layer'
    attention(f'{ours}/self_attention', f'{theirs}.0.SelfAttention')
    names[f'{ours}/pre_self_attention_layer_norm/scale'] = (
        f'{theirs}.0.layer_norm.weight', False)
    attention(f'{ours}/encoder_decoder_attention', f'{theirs}.1.EncDecAttention')
    names[f'{ours}/pre_cross_attention_layer_norm/scale'] = (
        f'{theirs}.1.layer_norm.weight', False)
    mlp(f'{ours}/mlp', f'{theirs}.2')
    names[f'{ours}/pre_mlp_layer_norm/scale'] = (f'{theirs}.2.layer_norm.weight', False)
  return names


def hf_config(cfg: t5.T5Config) -> dict[str, Any]:
  """transformers `T5Config` keyword arguments (a `config.json`) for `cfg`."""
  t5.check_config(cfg)
  if cfg.mlp_activations not in HF_FEED_FORWARD:
    raise ValueError(f'config.mlp_activations {cfg.mlp_activations!r} has no '
                     f'transformers equivalent (one of {list(HF_FEED_FORWARD)})')
  return {
      'architectures': ['T5ForConditionalGeneration'],
      'model_type': 't5',
      'is_encoder_decoder': True,
      'vocab_size': cfg.vocab_size,
      'd_model': cfg.emb_dim,
      'd_kv': cfg.head_dim,
      'd_ff': cfg.mlp_dim,
      'num_layers': cfg.num_encoder_layers,
      'num_decoder_layers': cfg.num_decoder_layers,
      'num_heads': cfg.num_heads,
      'relative_attention_num_buckets': t5.NUM_BUCKETS,
      'relative_attention_max_distance': t5.MAX_DISTANCE,
      'dropout_rate': cfg.dropout_rate,
      'layer_norm_epsilon': t5.LAYER_NORM_EPSILON,
      'feed_forward_proj': HF_FEED_FORWARD[cfg.mlp_activations],
      'tie_word_embeddings': cfg.logits_via_embedding,
      'decoder_start_token_id': t5.DECODER_START_ID,
      'pad_token_id': t5.PAD_ID,
      'eos_token_id': HF_EOS_ID,
  }


def config_from_hf(hf: Mapping[str, Any], dtype: DTypeLike = jnp.float32) -> t5.T5Config:
  """The `T5Config` of a transformers T5 `config.json` dict."""
  proj = hf.get('feed_forward_proj', 'relu')
  activations = {v: k for k, v in HF_FEED_FORWARD.items()}.get(proj)
  if activations is None:
    raise ValueError(f'feed_forward_proj {proj!r} is not supported (one of '
                     f'{list(HF_FEED_FORWARD.values())})')
  for name, value in (('relative_attention_num_buckets', t5.NUM_BUCKETS),
                      ('relative_attention_max_distance', t5.MAX_DISTANCE)):
    if hf.get(name, value) != value:
      raise ValueError(f'{name}={hf[name]} is not supported (T5 uses {value})')
  try:
    return t5.T5Config(
        vocab_size=hf['vocab_size'], dtype=_dtype(dtype), emb_dim=hf['d_model'],
        num_heads=hf['num_heads'], num_encoder_layers=hf['num_layers'],
        num_decoder_layers=hf.get('num_decoder_layers') or hf['num_layers'],
        head_dim=hf['d_kv'], mlp_dim=hf['d_ff'], mlp_activations=activations,
        dropout_rate=0.0, logits_via_embedding=hf.get('tie_word_embeddings', True))
  except KeyError as e:
    raise ValueError(f'the transformers config lacks {e.args[0]!r}') from e


def _hf_files(path: str) -> list[str]:
  if os.path.isfile(path):
    return [path]
  if not os.path.isdir(path):
    raise ValueError(f'path: no such file or directory: {path}')
  index = os.path.join(path, HF_INDEX_FILE)
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f).get('weight_map', {})
    return [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
  weights = os.path.join(path, HF_WEIGHTS_FILE)
  if os.path.isfile(weights):
    return [weights]
  raise ValueError(f'path: {path} holds neither {HF_WEIGHTS_FILE} nor {HF_INDEX_FILE}')


def load_hf(path: str | os.PathLike, cfg: t5.T5Config | None = None, *,
            dtype: DTypeLike | None = None) -> Params:
  """Hugging Face T5 safetensors -> the parameter tree of `t5.Transformer(cfg)`.

  Args:
    path: a `.safetensors` file, or a directory with `model.safetensors` or a sharded
      `model.safetensors.index.json`.
    cfg: the config the file must match; None reads the directory's `config.json`
      (float32 activations).
    dtype: cast every parameter to this dtype.

  Raises:
    ValueError: a missing key, an unexpected key, or a shape the config does not
      expect (named with both shapes), or tied copies of the embedding that differ.
  """
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  dtype = _dtype(dtype)
  if cfg is None:
    config_file = os.path.join(path if os.path.isdir(path) else os.path.dirname(path),
                               HF_CONFIG_FILE)
    if not os.path.isfile(config_file):
      raise ValueError(f'cfg: none given and no {HF_CONFIG_FILE} next to {path}')
    with open(config_file) as f:
      cfg = config_from_hf(json.load(f))
  names = hf_names(cfg)
  ours = {theirs: (key, transposed) for key, (theirs, transposed) in names.items()}
  aliases = set(HF_INPUT_EMBEDDING_ALIASES)
  if cfg.logits_via_embedding:
    aliases.add(HF_LM_HEAD)
  expected = expected_shapes(cfg)

  handles, shapes = {}, {}
  for file in _hf_files(path):
    try:
      handle = safe_open(file, framework='np')
    except Exception as e:  # safetensors raises its own error types.
      raise ValueError(f'path: {file} is not a safetensors file: {e}') from e
    for name in handle.keys():
      handles[name] = handle
      shapes[name] = tuple(handle.get_slice(name).get_shape())

  if HF_SHARED not in shapes:
    present = [a for a in HF_INPUT_EMBEDDING_ALIASES if a in shapes]
    if present:
      ours[present[0]] = ours.pop(HF_SHARED)
      aliases.discard(present[0])
  for name in sorted(shapes):
    if name in ours or name in aliases or name in HF_IGNORED:
      continue
    raise ValueError(f'unexpected key {name!r} with shape {shapes[name]}: not a '
                     'parameter of this config')
  # Checked in the file's own layout: its names, its [out, in] shapes.
  expected_hf = {name: expected[key][::-1] if transposed else expected[key]
                 for name, (key, transposed) in ours.items()}
  _check_flat({name: shapes[name] for name in ours if name in shapes}, expected_hf,
              describe=lambda name: f'{name!r} (T5X {ours[name][0]!r})')

  def read(name: str) -> np.ndarray:
    array = handles[name].get_tensor(name)
    return array if dtype is None else array.astype(dtype)

  flat = {}
  for name, (key, transposed) in ours.items():
    array = read(name)
    flat[key] = np.ascontiguousarray(array.T) if transposed else array
  for alias in sorted(aliases & set(shapes)):
    if shapes[alias] != expected['token_embedder/embedding'] or not np.array_equal(
        read(alias), flat['token_embedder/embedding']):
      raise ValueError(f'{alias!r} should be a tied copy of the shared embedding '
                       f'{expected["token_embedder/embedding"]}, but differs from it')
  return _unflatten(flat)


def export_hf(params: Mapping[str, Any], cfg: t5.T5Config) -> dict[str, np.ndarray]:
  """The inverse of `load_hf`: {transformers state-dict name: numpy array}.

  The shared embedding appears once, as `shared.weight`; transformers ties
  `encoder.embed_tokens`, `decoder.embed_tokens` (and for v1.0 `lm_head`) to it.
  """
  check_params(params, cfg)
  flat = _flatten(params)
  out = {}
  for key, (theirs, transposed) in hf_names(cfg).items():
    array = np.asarray(flat[key])
    out[theirs] = np.ascontiguousarray(array.T) if transposed else array
  return out


def save_hf(directory: str | os.PathLike, params: Mapping[str, Any],
            cfg: t5.T5Config) -> None:
  """Writes `model.safetensors` and `config.json` for transformers into `directory`."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  directory = os.fspath(directory)
  os.makedirs(directory, exist_ok=True)
  # transformers loads only files whose metadata says they hold PyTorch tensors.
  save_file(export_hf(params, cfg), os.path.join(directory, HF_WEIGHTS_FILE),
            metadata={'format': 'pt'})
  with open(os.path.join(directory, HF_CONFIG_FILE), 'w') as f:
    json.dump(hf_config(cfg), f, indent=2)


# ------------------------------------------------------------------------------
# Writing T5X checkpoints.
# ------------------------------------------------------------------------------
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
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  if isinstance(step, bool) or not isinstance(step, int) or step < 0:
    raise ValueError(f'step must be an int >= 0, got {step!r}')
  ckpt_dir = os.path.join(os.fspath(model_dir), f'checkpoint_{step}')
  os.makedirs(ckpt_dir, exist_ok=True)

  def write(path: tuple[str, ...], array: Any) -> dict[str, Any]:
    array = np.asarray(array)
    name = '.'.join((TARGET_KEY,) + path)
    spec = {'driver': 'zarr', 'dtype': jnp.dtype(array.dtype).name,
            'kvstore': {'driver': 'file', 'path': name},
            'metadata': {'compressor': {'id': 'gzip'}, 'shape': list(array.shape),
                         'chunks': list(array.shape)}}
    store = ts.open(dict(spec, kvstore={'driver': 'file',
                                        'path': os.path.join(ckpt_dir, name)}),
                    create=True, delete_existing=True).result()
    store.write(array).result()
    return ts.Spec(spec).to_json()

  flat = traverse_util.flatten_dict(dict(params))
  target = traverse_util.unflatten_dict({k: write(k, v) for k, v in flat.items()})
  contents = {'version': T5X_CHECKPOINT_VERSION,
              'optimizer': {TARGET_KEY: target, 'state': {'step': np.int64(step)}}}
  with open(os.path.join(ckpt_dir, T5X_LEGACY_FILE), 'wb') as f:
    f.write(serialization.msgpack_serialize(contents))
  return ckpt_dir


# ------------------------------------------------------------------------------
# Hugging Face Llama (`LlamaForCausalLM`): safetensors + config.json, both ways.
# ------------------------------------------------------------------------------
# Kept beside the functions that use it: the T5 loaders above need no Llama.
from specdec.models import llama  # pylint: disable=wrong-import-position

HF_LLAMA_ARCHITECTURE = 'LlamaForCausalLM'
HF_LLAMA_EMBEDDING = 'model.embed_tokens.weight'
# Buffers of old transformers versions, recomputed from the config (never weights).
HF_LLAMA_IGNORED = re.compile(r'^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$')
# transformers' `LlamaConfig` defaults, for keys a config.json may omit.
HF_LLAMA_DEFAULTS = {'rope_theta': 10000.0, 'rms_norm_eps': 1e-6,
                     'max_position_embeddings': 2048, 'tie_word_embeddings': False,
                     'hidden_act': 'silu'}


def llama_hf_names(cfg: llama.LlamaConfig) -> dict[str, tuple[str, bool]]:
  """{our flat key: (transformers state-dict name, transposed)} for every parameter.

  transformers' `nn.Linear` weights are [out, in], our kernels [in, out]: transposed.
  The query/key rows need no permutation: both sides use the `rotate_half` layout.
  """
  llama._check_config(cfg)  # pylint: disable=protected-access
  names = {'token_embedder/embedding': (HF_LLAMA_EMBEDDING, False),
           'final_norm/scale': ('model.norm.weight', False)}
  if not cfg.tie_word_embeddings:
    names['logits_dense/kernel'] = (HF_LM_HEAD, True)
  for i in range(cfg.num_layers):
    ours, theirs = f'layers_{i}', f'model.layers.{i}'
    names[f'{ours}/pre_attention_norm/scale'] = (f'{theirs}.input_layernorm.weight',
                                                 False)
    names[f'{ours}/pre_mlp_norm/scale'] = (f'{theirs}.post_attention_layernorm.weight',
                                           False)
    for name, hf in (('query', 'q_proj'), ('key', 'k_proj'), ('value', 'v_proj'),
                     ('out', 'o_proj')):
      names[f'{ours}/attention/{name}/kernel'] = (f'{theirs}.self_attn.{hf}.weight',
                                                  True)
    for name, hf in (('wi_0', 'gate_proj'), ('wi_1', 'up_proj'), ('wo', 'down_proj')):
      names[f'{ours}/mlp/{name}/kernel'] = (f'{theirs}.mlp.{hf}.weight', True)
  return names


def llama_expected_shapes(cfg: llama.LlamaConfig) -> dict[str, tuple[int, ...]]:
  """{'layers_0/attention/key/kernel': shape, ...} of `cfg`."""
  return {k: tuple(v.shape) for k, v in _flatten(llama.param_shapes(cfg)).items()}


def llama_params_from_hf(tensors: Mapping[str, Any], cfg: llama.LlamaConfig, *,
                         dtype: DTypeLike | None = None) -> Params:
  """transformers `LlamaForCausalLM` state dict (numpy arrays) -> our parameter tree.

  Args:
    tensors: {name: array}, e.g. `model.layers.0.self_attn.q_proj.weight` [H hd, d].
    cfg: the config they must match.
    dtype: cast every parameter to this dtype (None keeps the stored dtypes).

  Raises:
    ValueError: naming the first missing tensor, unexpected tensor, or tensor whose
      shape the config does not expect (both shapes, in transformers' layout); or a
      tied config's `lm_head.weight` that is not a copy of the embedding.
  """
  dtype = _dtype(dtype)
  names = llama_hf_names(cfg)
  ours = {theirs: (key, transposed) for key, (theirs, transposed) in names.items()}
  expected = llama_expected_shapes(cfg)
  expected_hf = {theirs: expected[key][::-1] if transposed else expected[key]
                 for theirs, (key, transposed) in ours.items()}
  tied_head = cfg.tie_word_embeddings and HF_LM_HEAD in tensors
  found = {name: tuple(np.shape(array)) for name, array in tensors.items()
           if not HF_LLAMA_IGNORED.match(name)
           and not (tied_head and name == HF_LM_HEAD)}
  _check_flat(found, expected_hf,
              describe=lambda name: f'{name!r} (ours {ours[name][0]!r})' if name in ours
              else repr(name))

  def read(name: str) -> np.ndarray:
    array = np.asarray(tensors[name])
    return array if dtype is None else array.astype(dtype)

  flat = {}
  for name, (key, transposed) in ours.items():
    array = read(name)
    flat[key] = np.ascontiguousarray(array.T) if transposed else array
  if tied_head:
    head = np.asarray(tensors[HF_LM_HEAD])
    if head.shape != expected_hf[HF_LLAMA_EMBEDDING] or not np.array_equal(
        head, np.asarray(tensors[HF_LLAMA_EMBEDDING])):
      raise ValueError(f'{HF_LM_HEAD!r} with shape {head.shape}: the config ties the '
                       f'output layer to {HF_LLAMA_EMBEDDING!r} '
                       f'{expected_hf[HF_LLAMA_EMBEDDING]}, but it differs from it')
  return _unflatten(flat)


def llama_params_to_hf(params: Mapping[str, Any],
                       cfg: llama.LlamaConfig) -> dict[str, np.ndarray]:
  """The inverse of `llama_params_from_hf`: {transformers name: numpy array}.

  A tied config has no `lm_head.weight`, as transformers' `save_pretrained` writes it.
  """
  _check_flat({k: tuple(np.shape(v)) for k, v in _flatten(params).items()},
              llama_expected_shapes(cfg), describe=repr)
  flat = _flatten(params)
  out = {}
  for key, (theirs, transposed) in llama_hf_names(cfg).items():
    array = np.asarray(flat[key])
    out[theirs] = np.ascontiguousarray(array.T) if transposed else array
  return out


def llama_config_from_hf(config_json: Mapping[str, Any],
                         dtype: DTypeLike = jnp.float32) -> llama.LlamaConfig:
  """The `LlamaConfig` of a transformers Llama `config.json` dict.

  Reads both transformers 4 (`rope_theta`, `rope_scaling`) and 5 (`rope_parameters`)
  layouts; missing keys take transformers' `LlamaConfig` defaults. `dtype` is the
  activation dtype of the result.

  Raises:
    ValueError: naming the key of anything this model does not implement (another
      architecture, an activation other than SiLU, biases, RoPE scaling) or a
      missing required key.
  """
  hf = dict(config_json)
  model_type = hf.get('model_type', 'llama')
  if model_type != 'llama':
    raise ValueError(f"model_type {model_type!r} is not supported (only 'llama')")
  architectures = hf.get('architectures') or [HF_LLAMA_ARCHITECTURE]
  if HF_LLAMA_ARCHITECTURE not in architectures:
    raise ValueError(f'architectures {architectures!r}: only '
                     f'{HF_LLAMA_ARCHITECTURE!r} is supported')
  act = hf.get('hidden_act', HF_LLAMA_DEFAULTS['hidden_act'])
  if act != 'silu':
    raise ValueError(f"hidden_act {act!r} is not supported (Llama's SwiGLU uses 'silu')")
  for name in ('attention_bias', 'mlp_bias'):
    if hf.get(name):
      raise ValueError(f'{name}=True is not supported (the model has no biases)')
  rope = dict(hf.get('rope_parameters') or {})
  for key in ('rope_parameters', 'rope_scaling'):
    value = dict(hf.get(key) or {})
    rope_type = value.get('rope_type', value.get('type', 'default'))
    if rope_type != 'default':
      raise ValueError(f"{key}: rope_type {rope_type!r} is not supported (only "
                       "'default', unscaled RoPE)")
  theta = rope.get('rope_theta', hf.get('rope_theta', HF_LLAMA_DEFAULTS['rope_theta']))
  try:
    heads = hf['num_attention_heads']
    return llama.LlamaConfig(
        vocab_size=hf['vocab_size'], hidden_size=hf['hidden_size'],
        intermediate_size=hf['intermediate_size'],
        num_layers=hf['num_hidden_layers'], num_heads=heads,
        num_kv_heads=hf.get('num_key_value_heads') or heads,
        head_dim=hf.get('head_dim'), rope_theta=float(theta),
        rms_norm_eps=float(hf.get('rms_norm_eps', HF_LLAMA_DEFAULTS['rms_norm_eps'])),
        tie_word_embeddings=bool(hf.get('tie_word_embeddings',
                                        HF_LLAMA_DEFAULTS['tie_word_embeddings'])),
        max_position_embeddings=hf.get('max_position_embeddings',
                                       HF_LLAMA_DEFAULTS['max_position_embeddings']),
        dtype=_dtype(dtype))
  except KeyError as e:
    raise ValueError(f'the transformers config lacks {e.args[0]!r}') from e


def llama_config_to_hf(cfg: llama.LlamaConfig) -> dict[str, Any]:
  """A `config.json` dict for transformers' `LlamaForCausalLM`, as transformers 5
  writes one (`rope_parameters`), with `rope_theta` also at the top level for
  transformers 4. Token ids are left None: the config does not know them."""
  llama._check_config(cfg)  # pylint: disable=protected-access
  return {
      'architectures': [HF_LLAMA_ARCHITECTURE],
      'model_type': 'llama',
      'vocab_size': cfg.vocab_size,
      'hidden_size': cfg.hidden_size,
      'intermediate_size': cfg.intermediate_size,
      'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads,
      'num_key_value_heads': cfg.num_kv_heads,
      'head_dim': cfg.head_dim,
      'hidden_act': 'silu',
      'max_position_embeddings': cfg.max_position_embeddings,
      'rms_norm_eps': cfg.rms_norm_eps,
      'rope_parameters': {'rope_theta': cfg.rope_theta, 'rope_type': 'default'},
      'rope_theta': cfg.rope_theta,
      'tie_word_embeddings': cfg.tie_word_embeddings,
      'attention_bias': False,
      'attention_dropout': 0.0,
      'mlp_bias': False,
      'pretraining_tp': 1,
      'use_cache': True,
      'bos_token_id': None,
      'eos_token_id': None,
      'pad_token_id': None,
      'dtype': jnp.dtype(cfg.dtype).name,
  }


def load_hf_llama(path: str | os.PathLike, *, dtype: DTypeLike | None = None
                  ) -> tuple[llama.LlamaConfig, Params]:
  """A transformers `LlamaForCausalLM` directory -> (config, parameter tree).

  Args:
    path: a directory with `config.json` and `model.safetensors` (or a sharded
      `model.safetensors.index.json`), as `save_pretrained` writes them.
    dtype: cast every parameter to this dtype and use it for activations; None keeps
      the stored dtypes (float32, bfloat16, ...) with float32 activations.

  Raises:
    ValueError: see `llama_config_from_hf` and `llama_params_from_hf`; or a path
      without those files.
  """
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  config_file = os.path.join(path, HF_CONFIG_FILE)
  if not os.path.isfile(config_file):
    raise ValueError(f'path: no {HF_CONFIG_FILE} in {path}')
  with open(config_file) as f:
    cfg = llama_config_from_hf(json.load(f), dtype=jnp.float32 if dtype is None
                               else dtype)
  tensors = {}
  for file in _hf_files(path):
    try:
      with safe_open(file, framework='np') as handle:
        for name in handle.keys():
          tensors[name] = handle.get_tensor(name)
    except Exception as e:  # safetensors raises its own error types.
      raise ValueError(f'path: {file} is not a safetensors file: {e}') from e
  return cfg, llama_params_from_hf(tensors, cfg, dtype=dtype)


def save_hf_llama(path: str | os.PathLike, cfg: llama.LlamaConfig,
                  params: Mapping[str, Any]) -> None:
  """Writes `model.safetensors` and `config.json` that transformers' `LlamaForCausalLM
  .from_pretrained` loads (and `load_hf_llama` reads back) into directory `path`."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  tensors = llama_params_to_hf(params, cfg)
  os.makedirs(path, exist_ok=True)
  # transformers loads only files whose metadata says they hold PyTorch tensors.
  save_file(tensors, os.path.join(path, HF_WEIGHTS_FILE), metadata={'format': 'pt'})
  with open(os.path.join(path, HF_CONFIG_FILE), 'w') as f:
    json.dump(llama_config_to_hf(cfg), f, indent=2)


from specdec.checkpoints_gguf import load_gguf  # noqa: E402,F401  (contract name)
