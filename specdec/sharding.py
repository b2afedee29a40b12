"""T5X-style logical-axis sharding of model parameters and decode state (T5, Llama).

Every parameter axis of `t5.Transformer` and `llama.Transformer` carries a T5X
logical name (recorded by `param_with_axes` in the 'params_axes' collection): 'vocab',
'embed', 'mlp', 'heads', 'joined_kv' (heads x head_dim, flattened in the 2-D attention
kernels), 'relpos_buckets' (T5); the decode caches are ('batch', 'length', 'heads',
'kv'). The functions below take either model's config, model or state. Rules map
logical names onto the axes of a `jax.sharding.Mesh` of ('data', 'model'); the default
rules are T5X's standard ones: batch over 'data', the model split over 'model'
(Megatron-style: heads, MLP hidden units and vocabulary), embedding dims replicated.

Placing parameters with `shard_params` (and inputs with `batch_sharding`) is all that
`speculative_sample` needs: under `jax.jit` the partitioner keeps each weight where it
is and moves activations instead, so the parameters are never gathered.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from typing import Any

from flax import linen as nn, traverse_util
from flax.linen import partitioning as nn_partitioning
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from specdec.models import llama, t5

Config = t5.T5Config | llama.LlamaConfig
Model = t5.T5 | llama.Llama
MESH_AXES = ("data", "model")
LogicalRules = Sequence[tuple[str, str | None]]

# T5X's `standard_logical_axis_rules()` (t5x/partitioning.py) for a ('data', 'model')
# mesh, restricted to the names T5 and Llama use.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
  ("batch", "data"),
  ("vocab", "model"),
  ("embed", None),
  ("mlp", "model"),
  ("heads", "model"),
  ("kv", None),
  ("joined_kv", "model"),
  ("relpos_buckets", None),
  ("length", None),
)


def make_mesh(data: int, model: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'model') mesh of data x model devices (default: the first ones)."""
  for name, value in (("data", data), ("model", model)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{name} must be a positive int, got {value!r}")
  devices = list(jax.devices() if devices is None else devices)
  if data * model > len(devices):
    raise ValueError(f"data * model = {data * model} devices requested, {len(devices)} available")
  return Mesh(np.asarray(devices[: data * model]).reshape(data, model), MESH_AXES)


def _model_module(cfg: Config) -> Any:
  """The module (`t5` or `llama`) that defines `cfg`'s network."""
  if isinstance(cfg, llama.LlamaConfig):
    return llama
  if isinstance(cfg, t5.T5Config):
    return t5
  raise TypeError(f"config must be a t5.T5Config or llama.LlamaConfig, got {type(cfg).__name__}")


def param_logical_axes(cfg: Config) -> Any:
  """A tree like `cfg`'s parameters of `PartitionSpec`s of logical axis names."""
  module = _model_module(cfg)
  variables = jax.eval_shape(lambda: module.init_variables(cfg, jax.random.key(0)))
  names = nn_partitioning.get_axis_names(variables["params_axes"])
  # Plain nested dicts, like the parameter trees the loaders return.
  return traverse_util.unflatten_dict(traverse_util.flatten_dict(names))


def _named_sharding(
  logical: PartitionSpec, shape: Sequence[int], mesh: Mesh, rules: LogicalRules
) -> NamedSharding:
  """The NamedSharding of an array of `shape` with logical axes `logical`.

  A dimension that its mesh axis does not divide is replicated rather than split
  unevenly (e.g. T5-small's 6 heads on 4 'model' devices): such arrays are small.
  """
  mesh_axes = nn.logical_to_mesh_axes(tuple(logical), rules)
  if mesh_axes is None:  # flax returns None only for logical axes None
    raise ValueError(f"logical axes {logical!r}: none given")
  if len(mesh_axes) != len(shape):
    raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")

  def fits(axis: Any, size: int) -> bool:
    names = axis if isinstance(axis, tuple) else (axis,)
    return size % int(np.prod([mesh.shape[n] for n in names])) == 0

  spec = [
    axis if axis is None or fits(axis, size) else None for axis, size in zip(mesh_axes, shape)
  ]
  return NamedSharding(mesh, PartitionSpec(*spec))


def logical_shardings(
  logical_tree: Any, shapes_tree: Any, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES
) -> Any:
  """NamedShardings for `shapes_tree` (arrays or ShapeDtypeStructs) whose logical
  axes are the `PartitionSpec` leaves of `logical_tree` (same structure)."""
  return jax.tree.map(
    lambda logical, x: _named_sharding(logical, np.shape(x), mesh, rules),
    logical_tree,
    shapes_tree,
    is_leaf=lambda x: isinstance(x, PartitionSpec),
  )


def param_shardings(cfg: Config, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES) -> Any:
  """NamedShardings of `cfg`'s parameter tree on `mesh`."""
  return logical_shardings(
    param_logical_axes(cfg), _model_module(cfg).param_shapes(cfg), mesh, rules
  )


def shard_params(
  params: Any, cfg: Config, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES
) -> Any:
  """`params` placed on `mesh` by their logical axes (`jax.device_put`)."""
  return jax.device_put(params, param_shardings(cfg, mesh, rules))


def shard_model(model: Model, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES) -> Model:
  """`model` with its parameters placed on `mesh`."""
  return dataclasses.replace(model, params=shard_params(model.params, model.config, mesh, rules))


def state_shardings(
  state: t5.T5State | llama.LlamaState, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES
) -> Any:
  """NamedShardings of a decode state (caches over batch and heads)."""
  module = llama if isinstance(state, llama.LlamaState) else t5
  return logical_shardings(module.state_logical_axes(state), state, mesh, rules)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """The sharding of a [batch, ...] input: rows over 'data', the rest replicated."""
  return NamedSharding(mesh, PartitionSpec("data", *([None] * (ndim - 1))))
