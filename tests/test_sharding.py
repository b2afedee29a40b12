"""specdec.sharding: logical axes, and sharded == unsharded speculative decoding."""

import json
import os
import subprocess
import sys

import jax
from jax.sharding import PartitionSpec as P
import pytest

from specdec import sharding
from specdec.models import t5

HERE = os.path.dirname(os.path.abspath(__file__))
SIMULATED_DEVICES = 8


def test_parameters_carry_t5x_logical_axes():
  axes = sharding.param_logical_axes(t5.tiny_config("1.1"))
  assert axes["token_embedder"]["embedding"] == P("vocab", "embed")
  assert axes["encoder"]["relpos_bias"]["rel_embedding"] == P("heads", "relpos_buckets")
  layer = axes["decoder"]["layers_0"]
  assert layer["self_attention"]["query"]["kernel"] == P("embed", "joined_kv")
  assert layer["encoder_decoder_attention"]["out"]["kernel"] == P("joined_kv", "embed")
  assert layer["mlp"]["wi_1"]["kernel"] == P("embed", "mlp")
  assert layer["mlp"]["wo"]["kernel"] == P("mlp", "embed")
  assert layer["pre_mlp_layer_norm"]["scale"] == P("embed")
  assert axes["decoder"]["logits_dense"]["kernel"] == P("embed", "vocab")


def test_state_carries_logical_axes():
  cfg = t5.tiny_config("1.1")
  state = jax.eval_shape(
    lambda m, x: m.init(x, 4),
    t5.T5(cfg, t5.param_shapes(cfg)),
    jax.ShapeDtypeStruct((2, 5), "int32"),
  )
  axes = t5.state_logical_axes(state)
  assert axes.caches[1][0] == P("batch", "length", "heads", "kv")
  assert axes.cross[0][1] == P("batch", "length", "heads", "kv")
  assert axes.lengths == P("batch")
  mesh = sharding.make_mesh(1, 1)
  shardings = sharding.state_shardings(state, mesh)
  assert shardings.caches[0][0].spec == P("data", None, "model", None)


def test_make_mesh_errors():
  with pytest.raises(ValueError, match="model"):
    sharding.make_mesh(1, 0)
  with pytest.raises(ValueError, match="devices requested"):
    sharding.make_mesh(len(jax.devices()) + 1, 1)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_sharded_speculative_decoding_equals_single_device():
  """8 simulated CPU devices, parameters over ('data', 'model') = (2, 4): greedy
  speculative decoding is token-identical to one device and gathers no parameter."""
  env = dict(
    os.environ,
    XLA_FLAGS=f"--xla_force_host_platform_device_count={SIMULATED_DEVICES}",
    JAX_PLATFORMS="cpu",
  )
  result = subprocess.run(
    [sys.executable, os.path.join(HERE, "t5_sharded_run.py")],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-4000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["devices"] == SIMULATED_DEVICES
  assert report["sharded_tokens"] == report["single_tokens"]
  assert report["sharded_lengths"] == report["single_lengths"]
  # The target's mlp/wi_0 [32, 64] split 4 ways over 'model': [32, 16] per device.
  assert report["kernel_shard_shape"] == [32, 16]
  # No collective assembles a whole parameter.
  assert not set(report["collectives"]) & set(report["param_shapes"]), report
  assert report["small_relpos_spec"] == [None, None]
  assert report["small_query_spec"] == [None, "model"]
