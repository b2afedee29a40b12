"""Hugging Face safetensors checkpoints <-> specdec's T5 and Llama parameter trees.

* `load_hf(path, cfg)`: transformers' `T5ForConditionalGeneration` safetensors
  (`safetensors` package), mapped onto `specdec.models.t5.Transformer`'s tree (T5X's);
  `export_hf` / `save_hf` are the inverse mapping.
* `load_hf_llama(path)` / `save_hf_llama(path, cfg, params)`: a `LlamaForCausalLM`
  directory (config.json + model.safetensors) <-> `specdec.models.llama`'s
  (config, tree); `llama_params_from_hf` maps a state dict alone (GGUF files use it).

Every reader checks names and shapes before reading an array: a missing key, an
unexpected key, or a shape the config does not expect is a `ValueError` that names the
key and both shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
import json
import os
import re
from typing import Any

import jax.numpy as jnp
import numpy as np

from specdec import _optional
from specdec.io import _tree
from specdec.io._tree import DTypeLike, Params
from specdec.io.t5x import check_params, expected_shapes
from specdec.models import llama, t5

__all__ = [
  "HF_WEIGHTS_FILE",
  "HF_INDEX_FILE",
  "HF_CONFIG_FILE",
  "HF_SHARED",
  "HF_INPUT_EMBEDDING_ALIASES",
  "HF_LM_HEAD",
  "HF_IGNORED",
  "HF_FEED_FORWARD",
  "HF_EOS_ID",
  "hf_names",
  "hf_config",
  "config_from_hf",
  "load_hf",
  "export_hf",
  "save_hf",
  "HF_LLAMA_ARCHITECTURE",
  "HF_LLAMA_EMBEDDING",
  "HF_LLAMA_IGNORED",
  "HF_LLAMA_DEFAULTS",
  "llama_hf_names",
  "llama_expected_shapes",
  "llama_params_from_hf",
  "llama_params_to_hf",
  "llama_config_from_hf",
  "llama_config_to_hf",
  "load_hf_llama",
  "save_hf_llama",
]

# Hugging Face layouts (transformers' `save_pretrained`).
HF_WEIGHTS_FILE = "model.safetensors"
HF_INDEX_FILE = "model.safetensors.index.json"
HF_CONFIG_FILE = "config.json"
HF_SHARED = "shared.weight"
# Names under which transformers may also store the shared embedding (T5 always ties
# its input embeddings; v1.0 also ties the output layer).
HF_INPUT_EMBEDDING_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
HF_LM_HEAD = "lm_head.weight"
# In old transformers checkpoints, never used by the model (transformers itself
# ignores it on load: `_keys_to_ignore_on_load_unexpected`).
HF_IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)
# `T5Config.mlp_activations` <-> transformers' `feed_forward_proj`. flax's `gelu` is
# the tanh approximation, which is transformers' `gelu_new`, its gated-gelu.
HF_FEED_FORWARD = {("relu",): "relu", ("gelu", "linear"): "gated-gelu"}
HF_EOS_ID = 1


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
    "token_embedder/embedding": (HF_SHARED, False),
    "encoder/relpos_bias/rel_embedding": (
      "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
      True,
    ),
    "decoder/relpos_bias/rel_embedding": (
      "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
      True,
    ),
    "encoder/encoder_norm/scale": ("encoder.final_layer_norm.weight", False),
    "decoder/decoder_norm/scale": ("decoder.final_layer_norm.weight", False),
  }
  if not cfg.logits_via_embedding:
    names["decoder/logits_dense/kernel"] = (HF_LM_HEAD, True)
  wi = (
    ["wi"]
    if len(cfg.mlp_activations) == 1
    else [f"wi_{i}" for i in range(len(cfg.mlp_activations))]
  )

  def attention(ours: str, theirs: str) -> None:
    for t5x_name, hf_name in zip(("query", "key", "value", "out"), "qkvo"):
      names[f"{ours}/{t5x_name}/kernel"] = (f"{theirs}.{hf_name}.weight", True)

  def mlp(ours: str, theirs: str) -> None:
    for name in wi + ["wo"]:
      names[f"{ours}/{name}/kernel"] = (f"{theirs}.DenseReluDense.{name}.weight", True)

  for i in range(cfg.num_encoder_layers):
    ours, theirs = f"encoder/layers_{i}", f"encoder.block.{i}.layer"
    attention(f"{ours}/attention", f"{theirs}.0.SelfAttention")
    names[f"{ours}/pre_attention_layer_norm/scale"] = (f"{theirs}.0.layer_norm.weight", False)
    mlp(f"{ours}/mlp", f"{theirs}.1")
    names[f"{ours}/pre_mlp_layer_norm/scale"] = (f"{theirs}.1.layer_norm.weight", False)
  for i in range(cfg.num_decoder_layers):
    ours, theirs = f"decoder/layers_{i}", f"decoder.block.{i}.layer"
    attention(f"{ours}/self_attention", f"{theirs}.0.SelfAttention")
    names[f"{ours}/pre_self_attention_layer_norm/scale"] = (f"{theirs}.0.layer_norm.weight", False)
    attention(f"{ours}/encoder_decoder_attention", f"{theirs}.1.EncDecAttention")
    names[f"{ours}/pre_cross_attention_layer_norm/scale"] = (f"{theirs}.1.layer_norm.weight", False)
    mlp(f"{ours}/mlp", f"{theirs}.2")
    names[f"{ours}/pre_mlp_layer_norm/scale"] = (f"{theirs}.2.layer_norm.weight", False)
  return names


def hf_config(cfg: t5.T5Config) -> dict[str, Any]:
  """transformers `T5Config` keyword arguments (a `config.json`) for `cfg`."""
  t5.check_config(cfg)
  if cfg.mlp_activations not in HF_FEED_FORWARD:
    raise ValueError(
      f"config.mlp_activations {cfg.mlp_activations!r} has no "
      f"transformers equivalent (one of {list(HF_FEED_FORWARD)})"
    )
  return {
    "architectures": ["T5ForConditionalGeneration"],
    "model_type": "t5",
    "is_encoder_decoder": True,
    "vocab_size": cfg.vocab_size,
    "d_model": cfg.emb_dim,
    "d_kv": cfg.head_dim,
    "d_ff": cfg.mlp_dim,
    "num_layers": cfg.num_encoder_layers,
    "num_decoder_layers": cfg.num_decoder_layers,
    "num_heads": cfg.num_heads,
    "relative_attention_num_buckets": t5.NUM_BUCKETS,
    "relative_attention_max_distance": t5.MAX_DISTANCE,
    "dropout_rate": cfg.dropout_rate,
    "layer_norm_epsilon": t5.LAYER_NORM_EPSILON,
    "feed_forward_proj": HF_FEED_FORWARD[cfg.mlp_activations],
    "tie_word_embeddings": cfg.logits_via_embedding,
    "decoder_start_token_id": t5.DECODER_START_ID,
    "pad_token_id": t5.PAD_ID,
    "eos_token_id": HF_EOS_ID,
  }


def config_from_hf(hf: Mapping[str, Any], dtype: DTypeLike = jnp.float32) -> t5.T5Config:
  """The `T5Config` of a transformers T5 `config.json` dict."""
  proj = hf.get("feed_forward_proj", "relu")
  activations = {v: k for k, v in HF_FEED_FORWARD.items()}.get(proj)
  if activations is None:
    raise ValueError(
      f"feed_forward_proj {proj!r} is not supported (one of {list(HF_FEED_FORWARD.values())})"
    )
  for name, value in (
    ("relative_attention_num_buckets", t5.NUM_BUCKETS),
    ("relative_attention_max_distance", t5.MAX_DISTANCE),
  ):
    if hf.get(name, value) != value:
      raise ValueError(f"{name}={hf[name]} is not supported (T5 uses {value})")
  try:
    return t5.T5Config(
      vocab_size=hf["vocab_size"],
      dtype=_tree.float_dtype(dtype),
      emb_dim=hf["d_model"],
      num_heads=hf["num_heads"],
      num_encoder_layers=hf["num_layers"],
      num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
      head_dim=hf["d_kv"],
      mlp_dim=hf["d_ff"],
      mlp_activations=activations,
      dropout_rate=0.0,
      logits_via_embedding=hf.get("tie_word_embeddings", True),
    )
  except KeyError as e:
    raise ValueError(f"the transformers config lacks {e.args[0]!r}") from e


def _hf_files(path: str) -> list[str]:
  if os.path.isfile(path):
    return [path]
  if not os.path.isdir(path):
    raise ValueError(f"path: no such file or directory: {path}")
  index = os.path.join(path, HF_INDEX_FILE)
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f).get("weight_map", {})
    return [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
  weights = os.path.join(path, HF_WEIGHTS_FILE)
  if os.path.isfile(weights):
    return [weights]
  raise ValueError(f"path: {path} holds neither {HF_WEIGHTS_FILE} nor {HF_INDEX_FILE}")


def load_hf(
  path: str | os.PathLike, cfg: t5.T5Config | None = None, *, dtype: DTypeLike | None = None
) -> Params:
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
  safe_open = _optional.require(
    "safetensors", "checkpoints", purpose="reading a Hugging Face checkpoint"
  ).safe_open
  path = os.fspath(path)
  dtype = _tree.float_dtype(dtype)
  if cfg is None:
    config_file = os.path.join(
      path if os.path.isdir(path) else os.path.dirname(path), HF_CONFIG_FILE
    )
    if not os.path.isfile(config_file):
      raise ValueError(f"cfg: none given and no {HF_CONFIG_FILE} next to {path}")
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
      handle = safe_open(file, framework="np")
    except Exception as e:  # safetensors raises its own error types.
      raise ValueError(f"path: {file} is not a safetensors file: {e}") from e
    for name in handle.keys():  # noqa: SIM118 - safe_open has keys() but no __iter__
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
    raise ValueError(
      f"unexpected key {name!r} with shape {shapes[name]}: not a parameter of this config"
    )
  # Checked in the file's own layout: its names, its [out, in] shapes.
  expected_hf = {
    name: expected[key][::-1] if transposed else expected[key]
    for name, (key, transposed) in ours.items()
  }
  _tree.check_flat(
    {name: shapes[name] for name in ours if name in shapes},
    expected_hf,
    describe=lambda name: f"{name!r} (T5X {ours[name][0]!r})",
  )

  def read(name: str) -> np.ndarray:
    array = handles[name].get_tensor(name)
    return array if dtype is None else array.astype(dtype)

  flat = {}
  for name, (key, transposed) in ours.items():
    array = read(name)
    flat[key] = np.ascontiguousarray(array.T) if transposed else array
  for alias in sorted(aliases & set(shapes)):
    if shapes[alias] != expected["token_embedder/embedding"] or not np.array_equal(
      read(alias), flat["token_embedder/embedding"]
    ):
      raise ValueError(
        f"{alias!r} should be a tied copy of the shared embedding "
        f"{expected['token_embedder/embedding']}, but differs from it"
      )
  return _tree.unflatten(flat)


def export_hf(params: Mapping[str, Any], cfg: t5.T5Config) -> dict[str, np.ndarray]:
  """The inverse of `load_hf`: {transformers state-dict name: numpy array}.

  The shared embedding appears once, as `shared.weight`; transformers ties
  `encoder.embed_tokens`, `decoder.embed_tokens` (and for v1.0 `lm_head`) to it.
  """
  check_params(params, cfg)
  flat = _tree.flatten(params)
  out = {}
  for key, (theirs, transposed) in hf_names(cfg).items():
    array = np.asarray(flat[key])
    out[theirs] = np.ascontiguousarray(array.T) if transposed else array
  return out


def save_hf(directory: str | os.PathLike, params: Mapping[str, Any], cfg: t5.T5Config) -> None:
  """Writes `model.safetensors` and `config.json` for transformers into `directory`."""
  save_file = _optional.require(
    "safetensors.numpy", "checkpoints", purpose="writing a Hugging Face checkpoint"
  ).save_file
  directory = os.fspath(directory)
  os.makedirs(directory, exist_ok=True)
  # transformers loads only files whose metadata says they hold PyTorch tensors.
  save_file(
    export_hf(params, cfg), os.path.join(directory, HF_WEIGHTS_FILE), metadata={"format": "pt"}
  )
  with open(os.path.join(directory, HF_CONFIG_FILE), "w") as f:
    json.dump(hf_config(cfg), f, indent=2)


# ------------------------------------------------------------------------------
# Hugging Face Llama (`LlamaForCausalLM`): safetensors + config.json, both ways.
# ------------------------------------------------------------------------------
HF_LLAMA_ARCHITECTURE = "LlamaForCausalLM"
HF_LLAMA_EMBEDDING = "model.embed_tokens.weight"
# Buffers of old transformers versions, recomputed from the config (never weights).
HF_LLAMA_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")
# transformers' `LlamaConfig` defaults, for keys a config.json may omit.
HF_LLAMA_DEFAULTS = {
  "rope_theta": 10000.0,
  "rms_norm_eps": 1e-6,
  "max_position_embeddings": 2048,
  "tie_word_embeddings": False,
  "hidden_act": "silu",
}


def llama_hf_names(cfg: llama.LlamaConfig) -> dict[str, tuple[str, bool]]:
  """{our flat key: (transformers state-dict name, transposed)} for every parameter.

  transformers' `nn.Linear` weights are [out, in], our kernels [in, out]: transposed.
  The query/key rows need no permutation: both sides use the `rotate_half` layout.
  """
  llama._check_config(cfg)
  names = {
    "token_embedder/embedding": (HF_LLAMA_EMBEDDING, False),
    "final_norm/scale": ("model.norm.weight", False),
  }
  if not cfg.tie_word_embeddings:
    names["logits_dense/kernel"] = (HF_LM_HEAD, True)
  for i in range(cfg.num_layers):
    ours, theirs = f"layers_{i}", f"model.layers.{i}"
    names[f"{ours}/pre_attention_norm/scale"] = (f"{theirs}.input_layernorm.weight", False)
    names[f"{ours}/pre_mlp_norm/scale"] = (f"{theirs}.post_attention_layernorm.weight", False)
    for name, hf in (
      ("query", "q_proj"),
      ("key", "k_proj"),
      ("value", "v_proj"),
      ("out", "o_proj"),
    ):
      names[f"{ours}/attention/{name}/kernel"] = (f"{theirs}.self_attn.{hf}.weight", True)
    for name, hf in (("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj")):
      names[f"{ours}/mlp/{name}/kernel"] = (f"{theirs}.mlp.{hf}.weight", True)
  return names


def llama_expected_shapes(cfg: llama.LlamaConfig) -> dict[str, tuple[int, ...]]:
  """{'layers_0/attention/key/kernel': shape, ...} of `cfg`."""
  return {k: tuple(v.shape) for k, v in _tree.flatten(llama.param_shapes(cfg)).items()}


def llama_params_from_hf(
  tensors: Mapping[str, Any], cfg: llama.LlamaConfig, *, dtype: DTypeLike | None = None
) -> Params:
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
  dtype = _tree.float_dtype(dtype)
  names = llama_hf_names(cfg)
  ours = {theirs: (key, transposed) for key, (theirs, transposed) in names.items()}
  expected = llama_expected_shapes(cfg)
  expected_hf = {
    theirs: expected[key][::-1] if transposed else expected[key]
    for theirs, (key, transposed) in ours.items()
  }
  tied_head = cfg.tie_word_embeddings and HF_LM_HEAD in tensors
  found = {
    name: tuple(np.shape(array))
    for name, array in tensors.items()
    if not HF_LLAMA_IGNORED.match(name) and not (tied_head and name == HF_LM_HEAD)
  }
  _tree.check_flat(
    found,
    expected_hf,
    describe=lambda name: f"{name!r} (ours {ours[name][0]!r})" if name in ours else repr(name),
  )

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
      head, np.asarray(tensors[HF_LLAMA_EMBEDDING])
    ):
      raise ValueError(
        f"{HF_LM_HEAD!r} with shape {head.shape}: the config ties the "
        f"output layer to {HF_LLAMA_EMBEDDING!r} "
        f"{expected_hf[HF_LLAMA_EMBEDDING]}, but it differs from it"
      )
  return _tree.unflatten(flat)


def llama_params_to_hf(params: Mapping[str, Any], cfg: llama.LlamaConfig) -> dict[str, np.ndarray]:
  """The inverse of `llama_params_from_hf`: {transformers name: numpy array}.

  A tied config has no `lm_head.weight`, as transformers' `save_pretrained` writes it.
  """
  _tree.check_flat(
    {k: tuple(np.shape(v)) for k, v in _tree.flatten(params).items()},
    llama_expected_shapes(cfg),
    describe=repr,
  )
  flat = _tree.flatten(params)
  out = {}
  for key, (theirs, transposed) in llama_hf_names(cfg).items():
    array = np.asarray(flat[key])
    out[theirs] = np.ascontiguousarray(array.T) if transposed else array
  return out


def llama_config_from_hf(
  config_json: Mapping[str, Any], dtype: DTypeLike = jnp.float32
) -> llama.LlamaConfig:
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
  model_type = hf.get("model_type", "llama")
  if model_type != "llama":
    raise ValueError(f"model_type {model_type!r} is not supported (only 'llama')")
  architectures = hf.get("architectures") or [HF_LLAMA_ARCHITECTURE]
  if HF_LLAMA_ARCHITECTURE not in architectures:
    raise ValueError(
      f"architectures {architectures!r}: only {HF_LLAMA_ARCHITECTURE!r} is supported"
    )
  act = hf.get("hidden_act", HF_LLAMA_DEFAULTS["hidden_act"])
  if act != "silu":
    raise ValueError(f"hidden_act {act!r} is not supported (Llama's SwiGLU uses 'silu')")
  for name in ("attention_bias", "mlp_bias"):
    if hf.get(name):
      raise ValueError(f"{name}=True is not supported (the model has no biases)")
  rope = dict(hf.get("rope_parameters") or {})
  for key in ("rope_parameters", "rope_scaling"):
    value = dict(hf.get(key) or {})
    rope_type = value.get("rope_type", value.get("type", "default"))
    if rope_type != "default":
      raise ValueError(
        f"{key}: rope_type {rope_type!r} is not supported (only 'default', unscaled RoPE)"
      )
  theta = rope.get("rope_theta", hf.get("rope_theta", HF_LLAMA_DEFAULTS["rope_theta"]))
  try:
    heads = hf["num_attention_heads"]
    return llama.LlamaConfig(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim"),
      rope_theta=float(theta),
      rms_norm_eps=float(hf.get("rms_norm_eps", HF_LLAMA_DEFAULTS["rms_norm_eps"])),
      tie_word_embeddings=bool(
        hf.get("tie_word_embeddings", HF_LLAMA_DEFAULTS["tie_word_embeddings"])
      ),
      max_position_embeddings=hf.get(
        "max_position_embeddings", HF_LLAMA_DEFAULTS["max_position_embeddings"]
      ),
      dtype=_tree.float_dtype(dtype),
    )
  except KeyError as e:
    raise ValueError(f"the transformers config lacks {e.args[0]!r}") from e


def llama_config_to_hf(cfg: llama.LlamaConfig) -> dict[str, Any]:
  """A `config.json` dict for transformers' `LlamaForCausalLM`, as transformers 5
  writes one (`rope_parameters`), with `rope_theta` also at the top level for
  transformers 4. Token ids are left None: the config does not know them."""
  llama._check_config(cfg)
  return {
    "architectures": [HF_LLAMA_ARCHITECTURE],
    "model_type": "llama",
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.hidden_size,
    "intermediate_size": cfg.intermediate_size,
    "num_hidden_layers": cfg.num_layers,
    "num_attention_heads": cfg.num_heads,
    "num_key_value_heads": cfg.num_kv_heads,
    "head_dim": cfg.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": cfg.max_position_embeddings,
    "rms_norm_eps": cfg.rms_norm_eps,
    "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
    "rope_theta": cfg.rope_theta,
    "tie_word_embeddings": cfg.tie_word_embeddings,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "use_cache": True,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "dtype": jnp.dtype(cfg.dtype).name,
  }


def load_hf_llama(
  path: str | os.PathLike, *, dtype: DTypeLike | None = None
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
  safe_open = _optional.require(
    "safetensors", "lm", "checkpoints", purpose="reading a Hugging Face Llama checkpoint"
  ).safe_open
  path = os.fspath(path)
  config_file = os.path.join(path, HF_CONFIG_FILE)
  if not os.path.isfile(config_file):
    raise ValueError(f"path: no {HF_CONFIG_FILE} in {path}")
  with open(config_file) as f:
    cfg = llama_config_from_hf(json.load(f), dtype=jnp.float32 if dtype is None else dtype)
  tensors = {}
  for file in _hf_files(path):
    try:
      with safe_open(file, framework="np") as handle:
        for name in handle.keys():  # noqa: SIM118 - safe_open has keys() but no __iter__
          tensors[name] = handle.get_tensor(name)
    except Exception as e:  # safetensors raises its own error types.
      raise ValueError(f"path: {file} is not a safetensors file: {e}") from e
  return cfg, llama_params_from_hf(tensors, cfg, dtype=dtype)


def save_hf_llama(
  path: str | os.PathLike, cfg: llama.LlamaConfig, params: Mapping[str, Any]
) -> None:
  """Writes `model.safetensors` and `config.json` that transformers' `LlamaForCausalLM
  .from_pretrained` loads (and `load_hf_llama` reads back) into directory `path`."""
  save_file = _optional.require(
    "safetensors.numpy", "lm", "checkpoints", purpose="writing a Hugging Face Llama checkpoint"
  ).save_file
  path = os.fspath(path)
  tensors = llama_params_to_hf(params, cfg)
  os.makedirs(path, exist_ok=True)
  # transformers loads only files whose metadata says they hold PyTorch tensors.
  save_file(tensors, os.path.join(path, HF_WEIGHTS_FILE), metadata={"format": "pt"})
  with open(os.path.join(path, HF_CONFIG_FILE), "w") as f:
    json.dump(llama_config_to_hf(cfg), f, indent=2)
