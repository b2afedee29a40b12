"""specdec.io.t5x and specdec.io.hf: T5X (legacy, Orbax) and Hugging Face round trips
and errors."""

import dataclasses
import json
import os
import shutil

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specdec.io.hf import config_from_hf, export_hf, hf_config, hf_names, load_hf, save_hf
from specdec.io.t5x import load_t5x
from specdec.models import t5

from t5_helpers import assert_trees_equal, write_t5x_legacy, write_t5x_orbax


@pytest.fixture(scope="module", params=["1.0", "1.1"])
def cfg_params(request):
  cfg = t5.tiny_config(request.param)
  params = t5.random_params(cfg, seed=3)
  return cfg, params


def _drop(params, key):
  flat = traverse_util.flatten_dict(params, sep="/")
  del flat[key]
  return traverse_util.unflatten_dict(flat, sep="/")


# ------------------------------------------------------------------------------ T5X


def test_t5x_legacy_round_trip(tmp_path, cfg_params):
  cfg, params = cfg_params
  ckpt = tmp_path / "checkpoint_1000"
  msgpack_file = write_t5x_legacy(str(ckpt), params)
  assert os.path.isdir(ckpt / "target.decoder.layers_0.self_attention.key.kernel")
  for path in (ckpt, msgpack_file, tmp_path):  # step dir, msgpack file, model dir.
    assert_trees_equal(load_t5x(path, cfg), params)


def test_t5x_legacy_dtype_cast(tmp_path, cfg_params):
  cfg, params = cfg_params
  write_t5x_legacy(str(tmp_path), params)
  loaded = load_t5x(tmp_path, cfg, dtype=jnp.bfloat16)
  assert_trees_equal(loaded, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))


def test_t5x_orbax_round_trip(tmp_path, cfg_params):
  pytest.importorskip("orbax.checkpoint", reason="the Orbax format needs orbax-checkpoint")
  cfg, params = cfg_params
  step_dir = write_t5x_orbax(str(tmp_path), params)
  for path in (step_dir, os.path.join(step_dir, "state"), tmp_path):
    assert_trees_equal(load_t5x(path, cfg), params)
  loaded = load_t5x(step_dir, cfg, dtype="bfloat16")
  assert_trees_equal(loaded, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))


def test_t5x_missing_key(tmp_path, cfg_params):
  cfg, params = cfg_params
  key = "decoder/layers_1/mlp/wo/kernel"
  write_t5x_legacy(str(tmp_path), _drop(params, key))
  with pytest.raises(
    ValueError,
    match=r"missing key 'decoder/layers_1/mlp/wo/kernel'"
    r".*\(64, 32\)",
  ):
    load_t5x(tmp_path, cfg)


def test_t5x_unexpected_key(tmp_path, cfg_params):
  cfg, params = cfg_params
  write_t5x_legacy(
    str(tmp_path), params, extra_target={"encoder/layers_9/mlp/wo/kernel": np.zeros((2, 3))}
  )
  with pytest.raises(
    ValueError,
    match=r"unexpected key 'encoder/layers_9/mlp/wo/kernel'"
    r".*\(2, 3\)",
  ):
    load_t5x(tmp_path, cfg)


def test_t5x_shape_mismatch_names_key_and_both_shapes(tmp_path, cfg_params):
  cfg, params = cfg_params
  write_t5x_legacy(str(tmp_path), params)
  other = dataclasses.replace(cfg, mlp_dim=48)
  with pytest.raises(
    ValueError,
    match=r"shape mismatch for 'decoder/layers_0/mlp/wi"
    r"(_0)?/kernel' \(target\.decoder\.layers_0\.mlp\.wi(_0)?\.kernel"
    r"\): the checkpoint has \(32, 64\), the config expects \(32, 48\)",
  ):
    load_t5x(tmp_path, other)


def test_t5x_missing_array_directory(tmp_path, cfg_params):
  cfg, params = cfg_params
  write_t5x_legacy(str(tmp_path), params)
  shutil.rmtree(tmp_path / "target.encoder.layers_0.attention.query.kernel")
  with pytest.raises(
    ValueError,
    match=r"target\.encoder\.layers_0\.attention\.query"
    r"\.kernel: cannot open",
  ):
    load_t5x(tmp_path, cfg)


def test_t5x_zarr_shape_disagrees_with_msgpack(tmp_path, cfg_params):
  cfg, params = cfg_params
  write_t5x_legacy(str(tmp_path), params)
  zarray = tmp_path / "target.token_embedder.embedding" / ".zarray"
  meta = json.loads(zarray.read_text())
  meta["shape"] = [meta["shape"][0] + 1, meta["shape"][1]]
  zarray.write_text(json.dumps(meta))
  with pytest.raises(
    ValueError,
    match=r"target\.token_embedder\.embedding: cannot open"
    r".*\[64,32\] but received: \[65,32\]",
  ):
    load_t5x(tmp_path, cfg)


def test_t5x_corrupted_chunk(tmp_path, cfg_params):
  cfg, params = cfg_params
  write_t5x_legacy(str(tmp_path), params)
  chunk = tmp_path / "target.decoder.decoder_norm.scale" / "0"
  chunk.write_bytes(b"not gzip")
  with pytest.raises(
    ValueError,
    match=r"target\.decoder\.decoder_norm\.scale: cannot "
    "read",
  ):
    load_t5x(tmp_path, cfg)


def test_t5x_corrupted_msgpack(tmp_path, cfg_params):
  cfg, params = cfg_params
  path = write_t5x_legacy(str(tmp_path), params)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
  with pytest.raises(ValueError, match="is not a T5X msgpack checkpoint"):
    load_t5x(tmp_path, cfg)


def test_t5x_no_checkpoint(tmp_path):
  with pytest.raises(ValueError, match="holds no T5X checkpoint"):
    load_t5x(tmp_path)
  with pytest.raises(ValueError, match="no such file or directory"):
    load_t5x(tmp_path / "absent")


# ------------------------------------------------------------------ Hugging Face


def test_hf_round_trip(tmp_path, cfg_params):
  cfg, params = cfg_params
  save_hf(tmp_path, params, cfg)
  assert_trees_equal(load_hf(tmp_path, cfg), params)
  # The directory's config.json stands in for cfg; a file path works too.
  assert_trees_equal(load_hf(tmp_path / "model.safetensors"), params)
  assert config_from_hf(hf_config(cfg)) == cfg
  loaded = load_hf(tmp_path, cfg, dtype=jnp.bfloat16)
  assert_trees_equal(loaded, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))


def test_hf_names_cover_every_parameter_once(cfg_params):
  cfg, params = cfg_params
  names = hf_names(cfg)
  assert set(names) == set(traverse_util.flatten_dict(params, sep="/"))
  assert len({theirs for theirs, _ in names.values()}) == len(names)
  exported = export_hf(params, cfg)
  assert "lm_head.weight" in exported or cfg.logits_via_embedding
  q = exported["decoder.block.1.layer.1.EncDecAttention.q.weight"]
  np.testing.assert_array_equal(
    q, params["decoder"]["layers_1"]["encoder_decoder_attention"]["query"]["kernel"].T
  )


def test_hf_tied_aliases_and_sharded_index(tmp_path, cfg_params):
  cfg, params = cfg_params
  tensors = export_hf(params, cfg)
  shared = tensors.pop("shared.weight")
  tensors["encoder.embed_tokens.weight"] = shared
  tensors["decoder.embed_tokens.weight"] = shared
  names = sorted(tensors)
  halves = {
    "model-00001-of-00002.safetensors": names[::2],
    "model-00002-of-00002.safetensors": names[1::2],
  }
  for file, keys in halves.items():
    save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
  (tmp_path / "model.safetensors.index.json").write_text(
    json.dumps({"weight_map": {k: file for file, keys in halves.items() for k in keys}})
  )
  assert_trees_equal(load_hf(tmp_path, cfg), params)


def test_hf_missing_key(tmp_path, cfg_params):
  cfg, params = cfg_params
  tensors = export_hf(params, cfg)
  del tensors["decoder.block.0.layer.1.EncDecAttention.k.weight"]
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(
    ValueError,
    match=r"missing key 'decoder\.block\.0\.layer\.1\."
    r"EncDecAttention\.k\.weight' \(T5X 'decoder/layers_0/encoder_"
    r"decoder_attention/key/kernel'\): the config expects shape "
    r"\(16, 32\)",
  ):
    load_hf(tmp_path, cfg)


def test_hf_unexpected_key(tmp_path, cfg_params):
  cfg, params = cfg_params
  tensors = export_hf(params, cfg)
  tensors["encoder.block.7.layer.0.layer_norm.weight"] = np.ones(32, np.float32)
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(
    ValueError,
    match=r"unexpected key 'encoder\.block\.7\.layer\.0\."
    r"layer_norm\.weight' with shape \(32,\)",
  ):
    load_hf(tmp_path, cfg)


def test_hf_shape_mismatch_names_key_and_both_shapes(tmp_path, cfg_params):
  cfg, params = cfg_params
  save_hf(tmp_path, params, cfg)
  other = dataclasses.replace(cfg, num_heads=4)
  with pytest.raises(
    ValueError,
    match=r"shape mismatch for 'decoder\.block\.0\.layer\."
    r"0\.SelfAttention\.k\.weight' \(T5X 'decoder/layers_0/"
    r"self_attention/key/kernel'\): the checkpoint has \(16, 32\), "
    r"the config expects \(32, 32\)",
  ):
    load_hf(tmp_path, other)


def test_hf_untied_copy_of_embedding_is_an_error(tmp_path, cfg_params):
  cfg, params = cfg_params
  tensors = export_hf(params, cfg)
  tensors["decoder.embed_tokens.weight"] = tensors["shared.weight"] + 1.0
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match=r"'decoder.embed_tokens.weight' should be a tied"):
    load_hf(tmp_path, cfg)


def test_hf_corrupted_file(tmp_path, cfg_params):
  cfg, params = cfg_params
  save_hf(tmp_path, params, cfg)
  (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
  with pytest.raises(ValueError, match="is not a safetensors file"):
    load_hf(tmp_path, cfg)


def test_export_rejects_wrong_tree(cfg_params):
  cfg, params = cfg_params
  with pytest.raises(ValueError, match=r"missing key 'decoder/decoder_norm/scale'"):
    export_hf(_drop(params, "decoder/decoder_norm/scale"), cfg)


def test_hf_written_file_is_what_transformers_expects(tmp_path, cfg_params):
  cfg, params = cfg_params
  save_hf(tmp_path, params, cfg)
  tensors = load_file(str(tmp_path / "model.safetensors"))
  assert tensors["shared.weight"].shape == (cfg.vocab_size, cfg.emb_dim)
  assert tensors["encoder.block.0.layer.0.SelfAttention.q.weight"].shape == (
    cfg.num_heads * cfg.head_dim,
    cfg.emb_dim,
  )
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["feed_forward_proj"] == ("relu" if cfg.logits_via_embedding else "gated-gelu")
