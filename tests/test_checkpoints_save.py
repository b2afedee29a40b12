"""save_t5x writes the published T5X layout that load_t5x reads back exactly."""

import os

from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.io.t5x import load_t5x, save_t5x
from specdec.models import t5


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_save_then_load_round_trips(tmp_path, dtype):
  cfg = t5.tiny_config()
  params = jax.tree.map(lambda x: np.asarray(x, dtype), t5.random_params(cfg, 3))
  path = save_t5x(tmp_path, params, step=7)
  assert path == os.path.join(tmp_path, "checkpoint_7")
  loaded = load_t5x(tmp_path, cfg)  # The model dir: its latest step.
  flat_a = jax.tree_util.tree_leaves_with_path(params)
  flat_b = dict(jax.tree_util.tree_leaves_with_path(loaded))
  assert len(flat_a) == len(flat_b)
  for key, a in flat_a:
    assert flat_b[key].dtype == a.dtype
    np.testing.assert_array_equal(np.asarray(flat_b[key], np.float32), np.asarray(a, np.float32))


def test_the_layout_is_t5x_legacy(tmp_path):
  cfg = t5.tiny_config()
  path = save_t5x(tmp_path, t5.random_params(cfg, 0), step=3)
  with open(os.path.join(path, "checkpoint"), "rb") as f:
    contents = serialization.msgpack_restore(f.read())
  assert contents["version"] == 3
  spec = contents["optimizer"]["target"]["decoder"]["layers_0"]["self_attention"]["key"]["kernel"]
  assert spec["driver"] == "zarr"
  # TensorStore normalises a directory path with a trailing slash.
  assert spec["kvstore"]["path"].rstrip("/") == "target.decoder.layers_0.self_attention.key.kernel"
  assert os.path.isdir(os.path.join(path, spec["kvstore"]["path"]))


def test_bad_step_is_refused(tmp_path):
  with pytest.raises(ValueError, match="step"):
    save_t5x(tmp_path, {}, step=-1)
