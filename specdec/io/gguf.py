"""GGUF checkpoints (llama.cpp's format) of the llama architecture -> specdec's Llama.

    cfg, params = specdec.io.gguf.load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")

The file is read with the `gguf` package (gguf-py, from llama.cpp): its metadata gives
the `LlamaConfig`, its tensors are dequantized to float32 (F32, F16, BF16, Q8_0, Q4_0,
Q4_1), renamed to Hugging Face's `LlamaForCausalLM` names, and handed to
`specdec.io.hf.llama_params_from_hf`, so a GGUF file and a safetensors file of
one model give one parameter tree.

The one layout difference: llama.cpp's RoPE rotates adjacent pairs (x[2i], x[2i+1]),
Hugging Face's rotates the two halves of a head (x[i], x[i + hd/2]), so llama.cpp's
converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the rows of every
head of `q_proj` and `k_proj`; `unpermute_rope_rows` undoes it (as transformers'
`LlamaTensorProcessor._reverse_permute_weights` does when it loads a GGUF file).
"""

from __future__ import annotations

from collections.abc import Mapping
import os
from typing import Any

import jax.numpy as jnp
import numpy as np

from specdec import _optional
from specdec.io._tree import DTypeLike
from specdec.io.hf import llama_config_from_hf, llama_params_from_hf

__all__ = [
  "ARCHITECTURE",
  "INSTALL_HINT",
  "GLOBAL_NAMES",
  "LAYER_NAMES",
  "CONFIG_KEYS",
  "REQUIRED_CONFIG_KEYS",
  "DEFAULT_ROPE_THETA",
  "DEFAULT_CONTEXT_LENGTH",
  "SUPPORTED_TYPES",
  "GGUF_MAGIC",
  "open_gguf",
  "metadata",
  "hf_config",
  "permute_rope_rows",
  "unpermute_rope_rows",
  "dequantize",
  "expected_shapes",
  "hf_name",
  "hf_tensors",
  "load_gguf",
  "load_gguf_reader",
  "save_gguf",
]

ARCHITECTURE = "llama"
INSTALL_HINT = _optional.install_command("lm")

# GGUF name -> Hugging Face LlamaForCausalLM name. `{i}` is the layer index.
GLOBAL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
  "attn_norm.weight": "input_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
# Metadata key (after `llama.`) -> Hugging Face config.json key.
CONFIG_KEYS = {
  "block_count": "num_hidden_layers",
  "embedding_length": "hidden_size",
  "feed_forward_length": "intermediate_size",
  "attention.head_count": "num_attention_heads",
  "attention.head_count_kv": "num_key_value_heads",
  "rope.freq_base": "rope_theta",
  "attention.layer_norm_rms_epsilon": "rms_norm_eps",
  "context_length": "max_position_embeddings",
}
REQUIRED_CONFIG_KEYS = (
  "block_count",
  "embedding_length",
  "feed_forward_length",
  "attention.head_count",
  "attention.layer_norm_rms_epsilon",
)
# llama.cpp's defaults where a file omits the key (llama-model.cpp / llama-hparams).
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_CONTEXT_LENGTH = 2048
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
GGUF_MAGIC = b"GGUF"


def _gguf():
  return _optional.require("gguf", "lm", purpose="reading GGUF files")


def open_gguf(path: str | os.PathLike):
  """A `gguf.GGUFReader` over `path`, checked to hold all of its tensors' bytes.

  Raises:
    ValueError (naming `path`): no such file, not a GGUF file (magic), a header the
      reader cannot parse, or tensor data cut short (a truncated download).
  """
  gguf = _gguf()
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f"path: no such GGUF file: {path}")
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != GGUF_MAGIC:
    raise ValueError(f"path: {path} is not a GGUF file (starts with {magic!r}, not {GGUF_MAGIC!r})")
  try:
    reader = gguf.GGUFReader(path)
  except Exception as e:  # The reader raises ValueError, IndexError, struct errors...
    raise ValueError(
      f"path: {path} is not a readable GGUF file (truncated or "
      f"corrupt header): {type(e).__name__}: {e}"
    ) from e
  size = os.path.getsize(path)
  for tensor in reader.tensors:
    end = int(tensor.data_offset) + int(tensor.n_bytes)
    if end > size or tensor.data.nbytes != int(tensor.n_bytes):
      raise ValueError(
        f"path: {path} is truncated: tensor {tensor.name!r} needs bytes "
        f"up to {end}, the file has {size}"
      )
  return reader


def metadata(reader, include_arrays: bool = True) -> dict[str, Any]:
  """The file's key-value metadata as Python values (strings, numbers, lists).

  `include_arrays=False` skips array-valued keys (the tokenizer's vocabulary and merges),
  which are slow to decode and not needed for the model's config.
  """
  gguf = _gguf()
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("GGUF."):
      continue
    if not include_arrays and field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
      continue
    out[key] = field.contents()
  return out


def hf_config(reader) -> dict[str, Any]:
  """A Hugging Face `LlamaConfig`-style dict (config.json keys) from the metadata.

  Raises:
    ValueError: an architecture other than llama, a missing required key, or RoPE
      scaling (not part of specdec's Llama).
  """
  meta = metadata(reader, include_arrays=False)
  arch = meta.get("general.architecture")
  if arch != ARCHITECTURE:
    raise ValueError(
      f"general.architecture: {arch!r} is not supported; load_gguf reads "
      f"the {ARCHITECTURE!r} architecture only"
    )
  missing = [f"llama.{k}" for k in REQUIRED_CONFIG_KEYS if f"llama.{k}" not in meta]
  if missing:
    raise ValueError(f"metadata: the file lacks {missing}")
  scaling = meta.get("llama.rope.scaling.type", "none")
  if scaling not in ("none", None) or meta.get("llama.rope.scaling.factor", 1.0) != 1.0:
    raise ValueError(f"llama.rope.scaling.type: RoPE scaling {scaling!r} is not supported")
  cfg: dict[str, Any] = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
  for key, hf_key in CONFIG_KEYS.items():
    if f"llama.{key}" in meta:
      cfg[hf_key] = meta[f"llama.{key}"]
  cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
  cfg.setdefault("rope_theta", DEFAULT_ROPE_THETA)
  cfg.setdefault("max_position_embeddings", DEFAULT_CONTEXT_LENGTH)
  for key in ("rope_theta", "rms_norm_eps"):
    # float32 in the file: 1e-5 is stored as 9.9999997e-06; the nearest short decimal
    # is what the published config says.
    cfg[key] = float(np.format_float_positional(np.float32(cfg[key]), unique=True))
  head_dim = meta.get(
    "llama.attention.key_length", cfg["hidden_size"] // cfg["num_attention_heads"]
  )
  for key in ("llama.attention.value_length", "llama.rope.dimension_count"):
    if meta.get(key, head_dim) != head_dim:
      raise ValueError(
        f"{key}: {meta[key]} differs from the head dimension {head_dim} "
        "(partial rotary or unequal key/value heads are not supported)"
      )
  cfg["head_dim"] = int(head_dim)
  names = {t.name: t for t in reader.tensors}
  if "llama.vocab_size" in meta:
    cfg["vocab_size"] = meta["llama.vocab_size"]
  elif "tokenizer.ggml.tokens" in reader.fields:
    cfg["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
  elif "token_embd.weight" in names:
    cfg["vocab_size"] = int(names["token_embd.weight"].shape[-1])
  else:
    raise ValueError(
      "metadata: no llama.vocab_size, tokenizer.ggml.tokens or "
      "token_embd.weight to give the vocabulary size"
    )
  cfg["tie_word_embeddings"] = "output.weight" not in names
  if "rope_freqs.weight" in names:
    raise ValueError(
      "tensor 'rope_freqs.weight': per-frequency RoPE scaling (Llama 3.1 style) is not supported"
    )
  return {
    k: (int(v) if isinstance(v, (np.integer, int)) and not isinstance(v, bool) else v)
    for k, v in cfg.items()
  }


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Hugging Face -> llama.cpp row order of a q/k projection [n_heads * hd, d].

  llama.cpp's `convert_hf_to_gguf.py` `LlamaModel.permute`: within each head, row
  j < hd/2 (first half) goes to 2j and row hd/2 + j (second half) to 2j + 1.
  """
  hd = w.shape[0] // n_heads
  return w.reshape(n_heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp -> Hugging Face row order of a q/k projection (inverse of the above)."""
  hd = w.shape[0] // n_heads
  return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(tensor) -> np.ndarray:
  """One `gguf.ReaderTensor` -> float32 numpy in row-major order ([out, in] for a matrix).

  GGUF lists dimensions innermost first (ggml's ne0 = in); numpy's shape is the reverse.

  Raises:
    ValueError: naming the tensor and its type when that type is not one of
      `SUPPORTED_TYPES`.
  """
  gguf = _gguf()
  kind = tensor.tensor_type.name
  if kind not in SUPPORTED_TYPES:
    raise ValueError(
      f"tensor {tensor.name!r}: quantization type {kind} is not supported "
      f"(supported: {', '.join(SUPPORTED_TYPES)})"
    )
  shape = tuple(int(n) for n in reversed(tensor.shape))
  array = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
  return np.asarray(array, dtype=np.float32).reshape(shape)


def expected_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  """{GGUF tensor name: numpy shape} the config implies (HF [out, in] layout)."""
  d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
  hd, h, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
  shapes = {"token_embd.weight": (v, d), "output_norm.weight": (d,)}
  if not cfg["tie_word_embeddings"]:
    shapes["output.weight"] = (v, d)
  layer = {
    "attn_norm.weight": (d,),
    "attn_q.weight": (h * hd, d),
    "attn_k.weight": (kv * hd, d),
    "attn_v.weight": (kv * hd, d),
    "attn_output.weight": (d, h * hd),
    "ffn_norm.weight": (d,),
    "ffn_gate.weight": (f, d),
    "ffn_up.weight": (f, d),
    "ffn_down.weight": (d, f),
  }
  for i in range(cfg["num_hidden_layers"]):
    shapes.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
  return shapes


def hf_name(name: str) -> str:
  """The Hugging Face name of a GGUF llama tensor name."""
  if name in GLOBAL_NAMES:
    return GLOBAL_NAMES[name]
  _, layer, rest = name.split(".", 2)
  return f"model.layers.{layer}.{LAYER_NAMES[rest]}"


def hf_tensors(
  reader, cfg: Mapping[str, Any], dtype: DTypeLike = np.float32
) -> dict[str, np.ndarray]:
  """{Hugging Face name: array} of every tensor, dequantized, q/k rows in HF order.

  Raises:
    ValueError: a missing tensor, an unexpected one, or a shape the config does not
      expect (each named, with both shapes), or an unsupported quantization type.
  """
  expected = expected_shapes(cfg)
  found = {t.name: t for t in reader.tensors}
  missing = [name for name in expected if name not in found]
  if missing:
    raise ValueError(
      f"tensor {missing[0]!r} (HF {hf_name(missing[0])!r}) is missing from "
      f"the file ({len(missing)} missing in all)"
    )
  unexpected = sorted(set(found) - set(expected))
  if unexpected:
    raise ValueError(
      f"tensor {unexpected[0]!r} is not a parameter of this llama config "
      f"({len(unexpected)} unexpected in all)"
    )
  for name, shape in expected.items():
    got = tuple(int(n) for n in reversed(found[name].shape))
    if got != shape:
      raise ValueError(
        f"tensor {name!r} (HF {hf_name(name)!r}): expected shape {list(shape)}, got {list(got)}"
      )
  out = {}
  for name in expected:
    w = dequantize(found[name])
    if name.endswith("attn_q.weight"):
      w = unpermute_rope_rows(w, cfg["num_attention_heads"])
    elif name.endswith("attn_k.weight"):
      w = unpermute_rope_rows(w, cfg["num_key_value_heads"])
    out[hf_name(name)] = w.astype(dtype, copy=False)
  return out


def load_gguf(path: str | os.PathLike, dtype: DTypeLike = jnp.float32):
  """A llama-architecture GGUF file -> `(LlamaConfig, params)`.

  Args:
    path: the `.gguf` file.
    dtype: the parameters' and the config's dtype: float32 (the default; numpy leaves)
      or e.g. `jnp.bfloat16` (ml_dtypes bfloat16 numpy leaves, `cfg.dtype` bfloat16).
      Quantized tensors are dequantized in float32 first, then cast.

  Returns:
    `(cfg, params)`: a `specdec.models.llama.LlamaConfig` and its parameter tree (see
    `specdec.io.hf.llama_params_from_hf`).

  Raises:
    ValueError: see `open_gguf`, `hf_config` and `hf_tensors`.
  """
  return load_gguf_reader(open_gguf(path), dtype)


def load_gguf_reader(reader, dtype: DTypeLike = jnp.float32):
  """`load_gguf` from an open `gguf.GGUFReader` (`open_gguf`), e.g. one that also gives
  the tokenizer (`specdec.io.tokenizer.Tokenizer.from_reader`)."""
  config = hf_config(reader)
  cfg = llama_config_from_hf(config, dtype=dtype)
  params = llama_params_from_hf(hf_tensors(reader, config, np.dtype(dtype)), cfg)
  return cfg, params


def save_gguf(
  path: str | os.PathLike,
  config: Mapping[str, Any],
  tensors: Mapping[str, np.ndarray],
  types: Mapping[str, str] | None = None,
  default_type: str = "F32",
  tokenizer: Mapping[str, Any] | None = None,
  architecture: str = ARCHITECTURE,
) -> None:
  """Write a llama GGUF file as llama.cpp's converter does (the inverse of `load_gguf`).

  Args:
    path: the file to write.
    config: a Hugging Face Llama config dict (`hf_config`'s keys).
    tensors: {Hugging Face name: float array}, q/k rows in Hugging Face order (they are
      permuted to llama.cpp's, `permute_rope_rows`).
    types: {GGUF tensor name: one of `SUPPORTED_TYPES`}; others get `default_type`.
      Quantized rows must be a multiple of the type's block (32 values).
    tokenizer: extra metadata, {key: value}, e.g. `tokenizer.ggml.tokens` (lists become
      GGUF arrays, str / bool / int / float the matching scalars).
    architecture: written as `general.architecture` (tests write others).
  """
  gguf = _gguf()
  types = dict(types or {})
  writer = gguf.GGUFWriter(os.fspath(path), architecture)
  writer.add_block_count(config["num_hidden_layers"])
  writer.add_context_length(config.get("max_position_embeddings", DEFAULT_CONTEXT_LENGTH))
  writer.add_embedding_length(config["hidden_size"])
  writer.add_feed_forward_length(config["intermediate_size"])
  writer.add_head_count(config["num_attention_heads"])
  writer.add_head_count_kv(config.get("num_key_value_heads", config["num_attention_heads"]))
  writer.add_rope_freq_base(config.get("rope_theta", DEFAULT_ROPE_THETA))
  writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
  writer.add_vocab_size(config["vocab_size"])
  head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
  writer.add_rope_dimension_count(head_dim)
  for key, value in (tokenizer or {}).items():
    if isinstance(value, bool):
      writer.add_bool(key, value)
    elif isinstance(value, (int, np.integer)):
      writer.add_uint32(key, int(value))
    elif isinstance(value, float):
      writer.add_float32(key, value)
    elif isinstance(value, str):
      writer.add_string(key, value)
    else:
      writer.add_array(key, list(value))
  theirs = {
    hf_name(name): name
    for name in expected_shapes(
      dict(
        config,
        head_dim=head_dim,
        tie_word_embeddings="lm_head.weight" not in tensors,
        num_key_value_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
      )
    )
  }
  for hf, array in tensors.items():
    if hf not in theirs:
      raise ValueError(f"tensors: {hf!r} is not a Hugging Face llama tensor of this config")
    name = theirs[hf]
    array = np.asarray(array, dtype=np.float32)
    if name.endswith("attn_q.weight"):
      array = permute_rope_rows(array, config["num_attention_heads"])
    elif name.endswith("attn_k.weight"):
      array = permute_rope_rows(
        array, config.get("num_key_value_heads", config["num_attention_heads"])
      )
    kind = types.get(name, default_type)
    if kind not in SUPPORTED_TYPES:
      raise ValueError(f"types: {name!r}: {kind} is not one of {SUPPORTED_TYPES}")
    qtype = gguf.GGMLQuantizationType[kind]
    data = gguf.quants.quantize(array, qtype)
    writer.add_tensor(name, data, raw_dtype=None if kind in ("F32", "F16") else qtype)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
