"""Parity with a peer implementation: Hugging Face transformers' PyTorch T5.

The same random weights, exported with `specdec.io.hf.export_hf`, in
`T5ForConditionalGeneration` (v1.0 and v1.1 tiny configs) give the logits of
`t5.Transformer` and of the chunked `T5.extend` within 1e-4.
"""

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity with transformers needs torch (the `hf` extra)")
transformers = pytest.importorskip(
  "transformers", reason="parity with transformers needs transformers (the `hf` extra)"
)

from specdec.io.hf import export_hf, hf_config, save_hf  # noqa: E402 - after importorskip
from specdec.models import t5  # noqa: E402 - after importorskip

from t5_helpers import (  # noqa: E402 - after importorskip
  MAX_LENGTH,
  encode,
  extend,
  full_logits,
  init,
  rewind,
  standard_batch,
  tiny_model,
)

ATOL = 1e-4


def _hf_model(model: t5.T5):
  """The transformers model holding `model`'s weights."""
  cfg = model.config
  config = transformers.T5Config(
    **{k: v for k, v in hf_config(cfg).items() if k not in ("architectures", "model_type")}
  )
  hf = transformers.T5ForConditionalGeneration(config)
  if not cfg.logits_via_embedding:
    # transformers 5 ties lm_head to the shared embedding whatever the config says;
    # v1.1's output layer is its own parameter.
    hf.lm_head.weight = torch.nn.Parameter(torch.empty_like(hf.lm_head.weight))
  state = {k: torch.from_numpy(np.array(v)) for k, v in export_hf(model.params, cfg).items()}
  missing, unexpected = hf.load_state_dict(state, strict=False)
  tied = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
  if cfg.logits_via_embedding:
    tied.add("lm_head.weight")
  assert set(missing) <= tied and not unexpected, (missing, unexpected)
  hf.eval()
  return hf


@pytest.fixture(scope="module", params=["1.0", "1.1"])
def pair(request):
  model = tiny_model(request.param, seed=2)
  return model, _hf_model(model)


def _hf_logits(hf, inputs, decoder_inputs):
  with torch.no_grad():
    out = hf(
      input_ids=torch.from_numpy(np.array(inputs)).long(),
      attention_mask=torch.from_numpy(np.array(inputs != 0)).long(),
      decoder_input_ids=torch.from_numpy(np.array(decoder_inputs)).long(),
    )
  return out.logits.numpy(), out.encoder_last_hidden_state.numpy()


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_logits_match_transformers(pair):
  model, hf = pair
  inputs, decoder_inputs = standard_batch(model)  # rows 1 and 2 padded.
  hf_logits, hf_encoded = _hf_logits(hf, inputs, decoder_inputs)

  encoded = encode(model, inputs)
  valid = np.asarray(inputs != 0)  # transformers computes padded positions too.
  np.testing.assert_allclose(np.asarray(encoded)[valid], hf_encoded[valid], atol=ATOL)
  np.testing.assert_allclose(full_logits(model, inputs, decoder_inputs), hf_logits, atol=ATOL)

  # The chunked cache, rows rewound to different positions in between.
  state = init(model, inputs, MAX_LENGTH)
  logits, state = extend(model, state, decoder_inputs[:, :3])
  np.testing.assert_allclose(logits, hf_logits[:, :3], atol=ATOL)
  starts = np.array([3, 2, 1])
  state = rewind(model, state, jnp.asarray(starts, jnp.int32))
  for k in (3, 1):
    chunk = jnp.stack([decoder_inputs[b, s : s + k] for b, s in enumerate(starts)])
    logits, state = extend(model, state, chunk)
    for b, s in enumerate(starts):
      np.testing.assert_allclose(logits[b], hf_logits[b, s : s + k], atol=ATOL)
    starts += k


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_buckets_match_transformers(bidirectional):
  rel = np.arange(-1000, 1001)
  theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
    torch.from_numpy(rel),
    bidirectional=bidirectional,
    num_buckets=t5.NUM_BUCKETS,
    max_distance=t5.MAX_DISTANCE,
  ).numpy()
  np.testing.assert_array_equal(t5.relative_position_bucket(rel, bidirectional), theirs)


def test_saved_directory_loads_in_transformers(tmp_path):
  """`save_hf` writes what `from_pretrained` reads (v1.0: tied, as transformers 5
  forces)."""
  model = tiny_model("1.0", seed=2)
  save_hf(tmp_path, model.params, model.config)
  hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
  inputs, decoder_inputs = standard_batch(model)
  np.testing.assert_allclose(
    full_logits(model, inputs, decoder_inputs), _hf_logits(hf, inputs, decoder_inputs)[0], atol=ATOL
  )
