"""Hugging Face Llama checkpoints: safetensors both ways, errors, and parity with
transformers' `LlamaForCausalLM` on small random models the test writes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec.io.hf import (
  llama_config_from_hf,
  llama_config_to_hf,
  llama_params_from_hf,
  llama_params_to_hf,
  load_hf_llama,
  save_hf_llama,
)
from specdec.models import llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT_LENGTH, NEW_TOKENS = 16, 16


def hf_model(tied, seed=0):
  """A random transformers Llama (d 64, 2 layers, 4 heads over 2 key/value heads,
  V 256) with weights at scales that make attention and RoPE matter: kernels with
  std 1/sqrt(fan_in), norm scales around 1 (transformers' own init, std 0.02, makes
  attention nearly uniform, which would hide a wrong rotation)."""
  cfg = transformers.LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=5000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=128,
    tie_word_embeddings=tied,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
  )
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(cfg).eval()
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if name.endswith("norm.weight"):
        weight.copy_(1.0 + 0.2 * torch.randn(weight.shape, generator=generator))
      else:
        weight.copy_(
          torch.randn(weight.shape, generator=generator) * weight.shape[-1] ** -0.5 * 2.0
        )
  return model


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def saved(request, tmp_path_factory):
  model = hf_model(tied=request.param)
  path = tmp_path_factory.mktemp("hf_llama")
  model.save_pretrained(path)
  return model, path


def test_config_json_as_transformers_writes_it_loads(saved):
  model, path = saved
  cfg, params = load_hf_llama(path)
  hf = model.config
  assert cfg == llama.LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=5000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=hf.tie_word_embeddings,
    max_position_embeddings=128,
  )
  assert ("logits_dense" in params) == (not hf.tie_word_embeddings)
  np.testing.assert_array_equal(
    params["layers_1"]["attention"]["key"]["kernel"],
    model.model.layers[1].self_attn.k_proj.weight.detach().numpy().T,
  )


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_logits_and_greedy_tokens_match_transformers(saved):
  """float32 logits within 1e-4 over a 16-token prompt; 16 greedy tokens identical
  to transformers' generate(do_sample=False)."""
  model, path = saved
  cfg, params = load_hf_llama(path)
  ours = llama.Llama(cfg, params)
  prompt = np.random.default_rng(1).integers(0, 256, (2, PROMPT_LENGTH))
  with torch.no_grad():
    reference = model(torch.tensor(prompt)).logits.numpy()
    generated = model.generate(
      torch.tensor(prompt),
      do_sample=False,
      max_new_tokens=NEW_TOKENS,
      min_new_tokens=NEW_TOKENS,
      attention_mask=torch.ones_like(torch.tensor(prompt)),
    )
  logits = ours.forward(jnp.asarray(prompt, jnp.int32))
  np.testing.assert_allclose(logits, reference, atol=1e-4, rtol=0)
  # The cached path too: the prompt fed by init, its last token by extend.
  state = ours.init(jnp.asarray(prompt, jnp.int32), 1)
  last, _ = ours.extend(state, ours.start_tokens(jnp.asarray(prompt))[:, None])
  np.testing.assert_allclose(last[:, 0], reference[:, -1], atol=1e-4, rtol=0)
  out = specdec.autoregressive_sample(
    ours,
    jnp.asarray(prompt, jnp.int32),
    jax.random.key(0),
    max_new_tokens=NEW_TOKENS,
    sampling=specdec.SamplingConfig(temperature=0.0),
  )
  np.testing.assert_array_equal(out.tokens, generated[:, PROMPT_LENGTH:].numpy())


def test_saved_checkpoints_round_trip_and_load_in_transformers(tmp_path):
  for tied in (False, True):
    cfg = llama.tiny_config(tie_word_embeddings=tied, rope_theta=20000.0)
    params = llama.random_params(cfg, seed=3)
    path = tmp_path / f"tied_{tied}"
    save_hf_llama(path, cfg, params)
    cfg2, params2 = load_hf_llama(path)
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    theirs = transformers.LlamaForCausalLM.from_pretrained(path).eval()
    assert theirs.config.rope_parameters["rope_theta"] == 20000.0
    tokens = np.arange(1, 9)[None]
    with torch.no_grad():
      reference = theirs(torch.tensor(tokens)).logits.numpy()
    ours = llama.Llama(cfg, params).forward(jnp.asarray(tokens, jnp.int32))
    np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=0)


def test_bfloat16_parameters_round_trip(tmp_path):
  cfg = llama.tiny_config()
  params = llama.random_params(cfg, seed=1, dtype=jnp.bfloat16)
  save_hf_llama(tmp_path, cfg, params)
  _, loaded = load_hf_llama(tmp_path)
  assert loaded["layers_0"]["mlp"]["wo"]["kernel"].dtype == jnp.bfloat16
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  cfg16, cast = load_hf_llama(tmp_path, dtype=jnp.float32)
  assert cast["final_norm"]["scale"].dtype == np.float32 and cfg16.dtype == jnp.float32


def test_transformers_4_config_layout_is_read():
  hf = llama_config_to_hf(llama.CONFIGS["smollm2_135m"])
  del hf["rope_parameters"]
  hf["rope_scaling"] = None
  assert llama_config_from_hf(hf) == llama.CONFIGS["smollm2_135m"]
  hf["rope_theta"] = 123.0
  assert llama_config_from_hf(hf).rope_theta == 123.0


@pytest.mark.parametrize(
  "change,name",
  [
    (dict(model_type="mistral"), "model_type"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "rope_type"),
    (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4}), "rope_type"),
    (dict(vocab_size=None), "vocab_size"),
  ],
)
def test_unsupported_configs_raise_errors_naming_the_key(change, name):
  hf = dict(llama_config_to_hf(llama.tiny_config()), **change)
  if change.get("vocab_size", 0) is None:
    del hf["vocab_size"]
  with pytest.raises(ValueError, match=name):
    llama_config_from_hf(hf)


def _tensors(cfg):
  return llama_params_to_hf(llama.random_params(cfg), cfg)


def test_bad_tensors_raise_errors_naming_the_tensor_and_shapes():
  cfg = llama.tiny_config()
  tensors = _tensors(cfg)
  missing = dict(tensors)
  del missing["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(ValueError, match=r"missing key 'model\.layers\.1\.mlp\.up_proj"):
    llama_params_from_hf(missing, cfg)
  extra = dict(tensors, **{"model.layers.0.self_attn.q_proj.bias": np.zeros(32)})
  with pytest.raises(ValueError, match=r"unexpected key 'model\.layers\.0\.self_attn"):
    llama_params_from_hf(extra, cfg)
  wrong = dict(tensors, **{"model.layers.0.self_attn.k_proj.weight": np.zeros((32, 32))})
  with pytest.raises(ValueError, match=r"k_proj.*\(32, 32\).*\(16, 32\)"):
    llama_params_from_hf(wrong, cfg)
  # Old checkpoints' rotary buffers are not weights: ignored.
  old = dict(tensors, **{"model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(4)})
  llama_params_from_hf(old, cfg)


def test_a_tied_config_accepts_only_a_copy_of_the_embedding_as_lm_head():
  cfg = llama.tiny_config(tie_word_embeddings=True)
  tensors = _tensors(cfg)
  assert "lm_head.weight" not in tensors
  copy = dict(tensors, **{"lm_head.weight": tensors["model.embed_tokens.weight"]})
  llama_params_from_hf(copy, cfg)
  other = dict(tensors, **{"lm_head.weight": tensors["model.embed_tokens.weight"] + 1})
  with pytest.raises(ValueError, match=r"lm_head.weight"):
    llama_params_from_hf(other, cfg)


def test_load_errors_name_the_path(tmp_path):
  with pytest.raises(ValueError, match=r"config.json"):
    load_hf_llama(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps(llama_config_to_hf(llama.tiny_config())))
  with pytest.raises(ValueError, match=r"model.safetensors"):
    load_hf_llama(tmp_path)
  with pytest.raises(ValueError, match="missing key 'final_norm/scale'"):
    llama_params_to_hf({"nope": np.zeros(3)}, llama.tiny_config())
