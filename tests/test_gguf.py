"""specdec.io.gguf: llama GGUF files written here with gguf.GGUFWriter."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from specdec.io import gguf as G  # noqa: E402 - after importorskip
from specdec.io.hf import llama_params_from_hf  # noqa: E402 - after importorskip
from specdec.models import llama  # noqa: E402 - after importorskip

# A tiny llama: rows of 64 values (two 32-value quantization blocks), grouped-query
# attention (4 heads over 2 key/value heads of 16), untied output layer.
CONFIG = dict(
  model_type="llama",
  vocab_size=96,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=16,
  rope_theta=10000.0,
  rms_norm_eps=1e-5,
  max_position_embeddings=128,
  tie_word_embeddings=False,
)
# Every supported type on some tensor, q/k among them (their rows are permuted first).
TYPES = {
  "token_embd.weight": "Q8_0",
  "output.weight": "Q4_1",
  "blk.0.attn_q.weight": "Q4_1",
  "blk.0.attn_k.weight": "Q8_0",
  "blk.0.attn_v.weight": "Q4_0",
  "blk.0.ffn_up.weight": "F16",
  "blk.1.attn_q.weight": "BF16",
  "blk.1.attn_k.weight": "Q4_1",
  "blk.1.ffn_down.weight": "Q8_0",
}


def llama_cpp_permute(weights, n_head, n_head_kv):
  """llama.cpp's `convert_hf_to_gguf.py` `LlamaModel.permute`, as published."""
  if n_head_kv is not None and n_head != n_head_kv:
    n_head = n_head_kv
  return (
    weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
    .swapaxes(1, 2)
    .reshape(weights.shape)
  )


def hf_shapes(cfg):
  d, f, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], 16
  h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  if not cfg["tie_word_embeddings"]:
    shapes["lm_head.weight"] = (v, d)
  for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    shapes.update(
      {
        p + "input_layernorm.weight": (d,),
        p + "post_attention_layernorm.weight": (d,),
        p + "self_attn.q_proj.weight": (h * hd, d),
        p + "self_attn.k_proj.weight": (kv * hd, d),
        p + "self_attn.v_proj.weight": (kv * hd, d),
        p + "self_attn.o_proj.weight": (d, h * hd),
        p + "mlp.gate_proj.weight": (f, d),
        p + "mlp.up_proj.weight": (f, d),
        p + "mlp.down_proj.weight": (d, f),
      }
    )
  return shapes


def random_hf_tensors(cfg, seed=0):
  rng = np.random.default_rng(seed)
  return {
    name: (
      1.0 + 0.1 * rng.standard_normal(shape)
      if len(shape) == 1
      else rng.standard_normal(shape) / np.sqrt(shape[-1])
    ).astype(np.float32)
    for name, shape in hf_shapes(cfg).items()
  }


GGUF_OF_HF = {
  hf: g
  for g, hf in [
    (n, G.hf_name(n)) for n in G.expected_shapes(dict(CONFIG, tie_word_embeddings=False))
  ]
}


def write_gguf(
  path, cfg, tensors, types, architecture="llama", drop=(), reshape=None, raw_types=None
):
  """A GGUF file as llama.cpp's converter writes one, straight from gguf.GGUFWriter:
  metadata under `llama.*`, q/k rows permuted, each tensor quantized to its type.
  `drop` leaves tensors out, `reshape` {GGUF name: shape} stores others, `raw_types`
  {GGUF name: type name} writes any ggml type."""
  w = gguf.GGUFWriter(str(path), architecture)
  w.add_block_count(cfg["num_hidden_layers"])
  w.add_context_length(cfg["max_position_embeddings"])
  w.add_embedding_length(cfg["hidden_size"])
  w.add_feed_forward_length(cfg["intermediate_size"])
  w.add_head_count(cfg["num_attention_heads"])
  w.add_head_count_kv(cfg["num_key_value_heads"])
  w.add_rope_freq_base(cfg["rope_theta"])
  w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
  w.add_vocab_size(cfg["vocab_size"])
  w.add_rope_dimension_count(16)
  for hf, array in tensors.items():
    name = GGUF_OF_HF[hf]
    if name in drop:
      continue
    if name.endswith("attn_q.weight"):
      array = llama_cpp_permute(array, cfg["num_attention_heads"], cfg["num_attention_heads"])
    elif name.endswith("attn_k.weight"):
      array = llama_cpp_permute(array, cfg["num_attention_heads"], cfg["num_key_value_heads"])
    if reshape and name in reshape:
      array = np.resize(array, reshape[name])
    kind = (raw_types or {}).get(name, types.get(name, "F32"))
    qtype = gguf.GGMLQuantizationType[kind]
    data = gguf.quants.quantize(np.ascontiguousarray(array, np.float32), qtype)
    w.add_tensor(name, data, raw_dtype=None if kind in ("F32", "F16") else qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


@pytest.fixture(scope="module")
def original():
  return random_hf_tensors(CONFIG)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory, original):
  return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", CONFIG, original, TYPES)


def test_unpermute_inverts_llama_cpps_permutation_for_query_and_grouped_key_rows():
  w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
  for heads, kv in ((8, 8), (8, 2)):
    rows = w[: kv * 16]
    permuted = llama_cpp_permute(rows, heads, kv)
    assert not np.array_equal(permuted, rows)
    np.testing.assert_array_equal(G.permute_rope_rows(rows, kv), permuted)
    np.testing.assert_array_equal(G.unpermute_rope_rows(permuted, kv), rows)


def test_config_comes_from_the_llama_metadata_and_ties_when_output_is_absent(tmp_path, original):
  reader = G.open_gguf(write_gguf(tmp_path / "a.gguf", CONFIG, original, TYPES))
  got = G.hf_config(reader)
  for key in (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rope_theta",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
  ):
    assert got[key] == CONFIG[key], key
  tied = {k: v for k, v in original.items() if k != "lm_head.weight"}
  reader = G.open_gguf(write_gguf(tmp_path / "b.gguf", CONFIG, tied, TYPES))
  assert G.hf_config(reader)["tie_word_embeddings"] is True


def test_tensors_equal_the_dequantized_reference_in_hugging_face_layout(tiny_file, original):
  reader = G.open_gguf(tiny_file)
  got = G.hf_tensors(reader, G.hf_config(reader))
  assert set(got) == set(original)
  for hf, w in original.items():
    name = GGUF_OF_HF[hf]
    kind = TYPES.get(name, "F32")
    qtype = gguf.GGMLQuantizationType[kind]
    stored = w
    if name.endswith("attn_q.weight"):
      stored = llama_cpp_permute(w, 4, 4)
    elif name.endswith("attn_k.weight"):
      stored = llama_cpp_permute(w, 4, 2)
    reference = gguf.quants.dequantize(gguf.quants.quantize(stored, qtype), qtype)
    reference = reference.reshape(w.shape)
    if name.endswith("attn_q.weight"):
      reference = G.unpermute_rope_rows(reference, 4)
    elif name.endswith("attn_k.weight"):
      reference = G.unpermute_rope_rows(reference, 2)
    assert got[hf].dtype == np.float32
    np.testing.assert_array_equal(got[hf], reference, err_msg=hf)


def quantization_bound(w, kind):
  """The largest error each type's rounding allows, per 32-value block (ggml-quants.c):
  Q8_0 half a step of amax/127, Q4_0 one step of amax/8 (its top code clips), Q4_1
  half a step of (max - min)/15; F16 / BF16 half an ulp; plus float16 scales."""
  blocks = w.reshape(-1, 32)
  amax = np.abs(blocks).max(axis=1, keepdims=True)
  if kind == "Q8_0":
    bound = amax / 127 * 0.5
  elif kind == "Q4_0":
    bound = amax / 8
  elif kind == "Q4_1":
    bound = (blocks.max(axis=1, keepdims=True) - blocks.min(axis=1, keepdims=True)) / 30
  elif kind == "F16":
    bound = np.abs(blocks) * 2.0**-11
  elif kind == "BF16":
    bound = np.abs(blocks) * 2.0**-8
  else:
    bound = np.zeros_like(blocks)
  bound = bound * (1 + 2.0**-9) + 1e-3 * amax * kind.startswith("Q")
  return np.broadcast_to(bound, blocks.shape).reshape(w.shape)


def test_tensors_match_the_original_weights_within_each_types_quantization_error(
  tiny_file, original
):
  reader = G.open_gguf(tiny_file)
  got = G.hf_tensors(reader, G.hf_config(reader))
  for hf, w in original.items():
    kind = TYPES.get(GGUF_OF_HF[hf], "F32")
    err = np.abs(got[hf] - w)
    assert np.all(err <= quantization_bound(w, kind)), (hf, kind, err.max())
    if kind == "F32":
      np.testing.assert_array_equal(got[hf], w)
    elif kind.startswith("Q"):
      assert err.max() > 0  # really quantized


def test_tensors_equal_those_transformers_loads_from_the_same_file(tiny_file):
  pytest.importorskip("accelerate")
  transformers = pytest.importorskip("transformers")
  model = transformers.LlamaForCausalLM.from_pretrained(
    os.path.dirname(tiny_file), gguf_file=os.path.basename(tiny_file)
  )
  theirs = {k: v.numpy() for k, v in model.state_dict().items()}
  reader = G.open_gguf(tiny_file)
  ours = G.hf_tensors(reader, G.hf_config(reader))
  assert set(ours) == set(theirs)
  for name in ours:
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def test_load_gguf_gives_the_llama_config_and_parameter_tree(tiny_file):
  cfg, params = G.load_gguf(tiny_file)
  assert cfg == llama.LlamaConfig(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    max_position_embeddings=128,
  )
  reader = G.open_gguf(tiny_file)
  expected = llama_params_from_hf(G.hf_tensors(reader, G.hf_config(reader)), cfg)
  flat = lambda t: {"/".join(k): v for k, v in _flatten(t)}
  assert flat(params).keys() == flat(expected).keys()
  for key, value in flat(params).items():
    assert isinstance(value, np.ndarray) and value.dtype == np.float32, key
    np.testing.assert_array_equal(value, flat(expected)[key], err_msg=key)


def _flatten(tree, prefix=()):
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _flatten(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def test_load_gguf_in_bfloat16_casts_params_and_config(tiny_file):
  _, params32 = G.load_gguf(tiny_file)
  cfg, params = G.load_gguf(tiny_file, dtype=jnp.bfloat16)
  assert cfg.dtype == jnp.bfloat16
  for (key, v), (_, v32) in zip(_flatten(params), _flatten(params32)):
    assert v.dtype == jnp.bfloat16, key
    np.testing.assert_array_equal(v, v32.astype(jnp.bfloat16))


def test_logits_equal_transformers_on_the_same_file(tiny_file):
  pytest.importorskip("accelerate")
  transformers = pytest.importorskip("transformers")
  import torch

  cfg, params = G.load_gguf(tiny_file)
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
  ours = np.asarray(llama.Llama(cfg, params).forward(jnp.asarray(tokens)))
  model = transformers.LlamaForCausalLM.from_pretrained(
    os.path.dirname(tiny_file), gguf_file=os.path.basename(tiny_file)
  )
  with torch.no_grad():
    theirs = model(torch.from_numpy(tokens).long()).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)


def test_save_gguf_writes_what_llama_cpps_converter_writes(tmp_path, original):
  ours = tmp_path / "ours.gguf"
  G.save_gguf(ours, CONFIG, original, TYPES)
  ref = G.open_gguf(write_gguf(tmp_path / "ref.gguf", CONFIG, original, TYPES))
  got = G.open_gguf(ours)
  assert G.hf_config(got) == G.hf_config(ref)
  ref_tensors = {t.name: t for t in ref.tensors}
  assert [t.name for t in got.tensors] == list(ref_tensors)
  for t in got.tensors:
    assert t.tensor_type == ref_tensors[t.name].tensor_type, t.name
    np.testing.assert_array_equal(np.asarray(t.data), np.asarray(ref_tensors[t.name].data))


def test_an_unsupported_quantization_type_is_named_with_its_tensor(tmp_path, original):
  path = write_gguf(
    tmp_path / "q5.gguf", CONFIG, original, TYPES, raw_types={"blk.1.ffn_gate.weight": "Q5_0"}
  )
  with pytest.raises(ValueError, match=r"'blk\.1\.ffn_gate\.weight'.*Q5_0 is not supported"):
    G.load_gguf(path)


def test_a_missing_tensor_is_named(tmp_path, original):
  path = write_gguf(tmp_path / "m.gguf", CONFIG, original, TYPES, drop=("blk.1.ffn_norm.weight",))
  with pytest.raises(
    ValueError,
    match=r"'blk\.1\.ffn_norm\.weight'.*"
    r"post_attention_layernorm.*missing",
  ):
    G.load_gguf(path)


def test_a_wrong_shape_is_named_with_both_shapes(tmp_path, original):
  path = write_gguf(
    tmp_path / "s.gguf", CONFIG, original, TYPES, reshape={"blk.0.ffn_up.weight": (96, 64)}
  )
  with pytest.raises(
    ValueError,
    match=r"'blk\.0\.ffn_up\.weight'.*expected shape "
    r"\[128, 64\], got \[96, 64\]",
  ):
    G.load_gguf(path)


def test_another_architecture_is_named(tmp_path, original):
  path = write_gguf(tmp_path / "g.gguf", CONFIG, original, TYPES, architecture="qwen2")
  with pytest.raises(ValueError, match=r"general\.architecture: 'qwen2' is not supported"):
    G.load_gguf(path)


def test_a_non_gguf_or_truncated_file_is_a_value_error_naming_the_path(tmp_path, tiny_file):
  text = tmp_path / "notes.gguf"
  text.write_text("not a model")
  with pytest.raises(ValueError, match=f"{text}.*not a GGUF file"):
    G.load_gguf(text)
  with open(tiny_file, "rb") as f:
    data = f.read()
  for size in (len(data) - 100, 200, 30):
    cut = tmp_path / f"cut{size}.gguf"
    cut.write_bytes(data[:size])
    with pytest.raises(ValueError, match=str(cut)):
      G.load_gguf(cut)
  with pytest.raises(ValueError, match="no such GGUF file"):
    G.load_gguf(tmp_path / "absent.gguf")
