"""Speculative decoding inside T5X: drop-in models for its model classes, a decode_fn.

Ways to decode a T5X model Mp with a draft Mq by Algorithm 1 of Leviathan, Kalman &
Matias (ICML 2023), all traceable inside T5X's `PjitPartitioner`:

* `SpeculativeEncoderDecoderModel` (recommended for T5): a
  `t5x.models.EncoderDecoderModel` whose `predict_batch_with_aux` calls
  `specdec.speculative_sample`. The target is the model's own `module` and params;
  the draft is a second module (`draft_module`) whose params live in the same train
  state under `params['specdec_draft']` (`DRAFT_KEY`), so T5X shards them with its
  logical-axis rules and passes them to the compiled decode as arguments. They get
  there at restore time: `insert_draft_checkpoint` (with its `path`) in the restore
  config's `state_transformation_fns`, as `configs/runs/infer.gin` sets it.
* `SpeculativeDecoderOnlyModel`: the same for T5X's `DecoderOnlyModel` (a language
  model or prefix LM: `t5x/examples/decoder_only/network.py` or
  `specdec.models.t5x_decoder.Transformer`), with per-row prompts as T5X passes
  them (`decoder_causal_attention`, `initial_index`); `configs/runs/
  infer_decoder_only.gin`.
* `speculative_decode`: a function with T5X's `decode_fn` calling convention, for a
  stock `EncoderDecoderModel` or `DecoderOnlyModel` whose gin binds `decode_fn`.
  What it needs beyond T5X's one-token callback, and why, is in its docstring.

All return T5X's shapes and order: decodes [B, num_decodes, L] and scores
[B, num_decodes] sorted by increasing score (the models keep the last, best, one
unless `return_all_decodes`). A score is what T5X's `temperature_sample` reports with
its default `rescale_log_probs=True`: the sum over the decode's tokens (EOS included,
nothing after it) of log softmax(logits / temperature, top-k / top-p masked) at the
token, under the target, and 0 at temperature 0. specdec reads it from the
sampler's `SampleOutput.log_probs`: the log of the target's p (temperature, top-k,
top-p applied) at each committed token, taken from the verification pass that
accepted it (Algorithm 1 computes p there anyway), so no pass is added. The two
agree to float rounding, except that specdec floors each probability at 1e-30
(`specdec.sample`) where T5X has none, and that a token at the edge of a top-k /
top-p set is in or out by each implementation's own rounding.

The gin files of the project's `configs/` ship inside the package: `gin_search_path()`
(printed by `python -m specdec.t5x`) is the directory to pass as T5X's
`--gin_search_paths`, and `configs/runs/multi30k_ende_infer.gin` runs the shipped pair
under `python -m t5x.infer` (`shipped_checkpoint` gives its checkpoints). docs/t5x.md
has the commands and what T5X writes.

t5x is not on PyPI. This module imports without it; the model classes import t5x
when first used and raise an ImportError saying how to install it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
import functools
import importlib.resources
import os
from typing import Any

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec._checks import check_positive_int
from specdec.distributions import SamplingConfig
from specdec.io import load_t5x
from specdec.models import t5, t5x_decoder
from specdec.outputs import SampleOutput
from specdec.sample import speculative_sample

Array = jax.Array
PyTree = Any

# Where the draft's parameters sit in the model's parameter tree. Not a key of
# `t5.Transformer`'s tree (token_embedder, encoder, decoder) nor of the decoder-only
# one (decoder), so the target's checkpoint restores unchanged beside it.
DRAFT_KEY = "specdec_draft"
# T5X's `EncoderDecoderModel` decodes to the output vocabulary's EOS, else 1.
DEFAULT_EOS_ID = 1
# The `t5.T5Config` fields, which T5X's `network.T5Config` shares by name.
_CONFIG_FIELDS = (
  "vocab_size",
  "dtype",
  "emb_dim",
  "num_heads",
  "num_encoder_layers",
  "num_decoder_layers",
  "head_dim",
  "mlp_dim",
  "mlp_activations",
  "dropout_rate",
  "logits_via_embedding",
)
_T5X_NETWORK_MODULE = "t5x.examples.t5.network"
# The `t5x_decoder.DecoderOnlyConfig` fields, which T5X's decoder-only
# `network.TransformerConfig` shares by name.
_DECODER_ONLY_FIELDS = (
  "vocab_size",
  "dtype",
  "emb_dim",
  "num_heads",
  "num_layers",
  "head_dim",
  "mlp_dim",
  "mlp_activations",
  "dropout_rate",
  "logits_via_embedding",
)
_T5X_DECODER_ONLY_MODULE = "t5x.examples.decoder_only.network"
_MODEL_CLASSES = ("SpeculativeEncoderDecoderModel", "SpeculativeDecoderOnlyModel")
_T5X_MISSING = (
  "specdec.t5x.{name} subclasses a T5X model class, but t5x cannot be imported. t5x "
  "is not on PyPI: install it from its source (https://github.com/google-research/"
  "t5x; `pip install -e .` in a checkout) with `pip install 'specdec[t5x]'`; "
  "docs/t5x.md lists the packages it also needs."
)
# Decoder parameters `predict_batch_with_aux` takes (T5X passes others only to
# decode_fns that declare them).
_DECODER_PARAMS = ("decode_rng", "eos_id")


# ------------------------------------------------------------------------------
# Configuration and parameters.
# ------------------------------------------------------------------------------
def config_of(module: Any, name: str = "module") -> t5.T5Config:
  """The `t5.T5Config` of a T5 network: specdec's `t5.Transformer` or T5X's.

  T5X's `t5x.examples.t5.network.Transformer` has the same parameter tree and config
  field names (its `float32_attention_logits` is implied: specdec computes attention
  logits in float32 always), so a T5X gin model file works unchanged.

  Raises:
    TypeError: naming `name`, for any other module.
  """
  if isinstance(module, t5.Transformer):
    config = module.config
  elif type(module).__module__ == _T5X_NETWORK_MODULE and hasattr(module, "config"):
    config = t5.T5Config(**{f: getattr(module.config, f) for f in _CONFIG_FIELDS})
  else:
    raise TypeError(
      f"{name} must be specdec.models.t5.Transformer or T5X's "
      f"t5x.examples.t5.network.Transformer, got {type(module).__name__}"
    )
  # gin and T5X may give mlp_activations as a list; a jit-static config must hash.
  config = dataclasses.replace(config, mlp_activations=tuple(config.mlp_activations))
  t5.check_config(config)
  return config


def decoder_only_config_of(module: Any, name: str = "module") -> t5x_decoder.DecoderOnlyConfig:
  """The `t5x_decoder.DecoderOnlyConfig` of a decoder-only network: specdec's
  `t5x_decoder.Transformer` or T5X's `t5x.examples.decoder_only.network.DecoderWrapper`
  (same parameter tree and config field names; specdec computes attention logits in
  float32 always, T5X in the network's dtype).

  Raises:
    TypeError: naming `name`, for any other module.
  """
  if isinstance(module, t5x_decoder.Transformer):
    config = module.config
  elif type(module).__module__ == _T5X_DECODER_ONLY_MODULE and hasattr(module, "config"):
    config = t5x_decoder.DecoderOnlyConfig(
      **{f: getattr(module.config, f) for f in _DECODER_ONLY_FIELDS}
    )
  else:
    raise TypeError(
      f"{name} must be specdec.models.t5x_decoder.Transformer or T5X's "
      "t5x.examples.decoder_only.network.DecoderWrapper, got "
      f"{type(module).__name__}"
    )
  config = dataclasses.replace(config, mlp_activations=tuple(config.mlp_activations))
  t5x_decoder.check_config(config)
  return config


# ------------------------------------------------------------------------------
# The shipped gin configs and checkpoints.
# ------------------------------------------------------------------------------
def gin_search_path() -> str:
  """The directory to add to gin's search path (T5X's `--gin_search_paths`) for
  specdec's gin files: the installed package, whose `configs/` holds the root
  `configs/` of the project (copied into a wheel as package data; a link to it in a
  checkout and in an editable install). Its run files include one another by names
  relative to it ('configs/runs/...'). `python -m specdec.t5x` prints it.

  Raises:
    FileNotFoundError: the package has no `configs/` (a broken installation).
  """
  package = importlib.resources.files("specdec")
  if not (package / "configs" / "runs" / "infer.gin").is_file():
    raise FileNotFoundError(
      f"specdec is installed without its gin configs: no "
      f"configs/runs/infer.gin under {package}; reinstall it"
    )
  return str(package)


def shipped_checkpoint(pair: str = "multi30k_ende", which: str = "target") -> str:
  """The T5X checkpoint directory of one model of a pair shipped in the package, for
  gin files (`configs/pairs/multi30k_ende.gin`): `TARGET_CHECKPOINT_PATH =
  @specdec_t5x.shipped_checkpoint()`.

  Args:
    pair: a pair of `specdec.pretrained.PAIRS` stored as T5X checkpoints.
    which: 'target' or one of its drafts (`specdec.pretrained.drafts(pair)`).

  Raises:
    ValueError: naming `pair` or `which` when there is no such checkpoint.
  """
  from specdec import pretrained

  info = pretrained.pair_info(pair)
  if pair in pretrained.LM_PAIRS:
    raise ValueError(
      f"pair: {pair!r} is a decoder-only LM pair; its models are not T5X checkpoints"
    )
  models = ["target", *pretrained.drafts(pair)]
  if which not in models:
    raise ValueError(f"which must be one of {models} for pair {pair!r}, got {which!r}")
  return str(pretrained.pair_dir(pair) / info[which]["checkpoint"])


def split_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
  """params -> (the target's tree, the draft's tree under `DRAFT_KEY`).

  Raises:
    ValueError: when `params` holds no draft, saying how to put it there.
  """
  if not isinstance(params, Mapping) or DRAFT_KEY not in params:
    keys = sorted(params) if isinstance(params, Mapping) else type(params).__name__
    raise ValueError(
      f"params has no {DRAFT_KEY!r} subtree (keys: {keys}): restore the target with "
      "state_transformation_fns=[specdec.t5x.insert_draft_checkpoint] (its path "
      "the draft checkpoint), or build the tree with specdec.t5x.with_draft"
    )
  target = {k: v for k, v in params.items() if k != DRAFT_KEY}
  return target, params[DRAFT_KEY]


def with_draft(params: Mapping[str, Any], draft_params: Mapping[str, Any]) -> dict:
  """The parameter tree of `SpeculativeEncoderDecoderModel`: target + draft."""
  if DRAFT_KEY in params:
    raise ValueError(f"params already holds a {DRAFT_KEY!r} subtree")
  return {**params, DRAFT_KEY: draft_params}


def _flat_shapes(tree: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  return {
    "/".join(k): tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(dict(tree)).items()
  }


def _check_shapes(path: Any, found: Mapping[str, Any], want: Mapping[str, Any]) -> None:
  found, want = _flat_shapes(found), _flat_shapes(want)
  for key in sorted(set(found) | set(want)):
    if found.get(key) != want.get(key):
      raise ValueError(
        f"draft checkpoint {path}: parameter {key!r} has shape "
        f"{found.get(key)}, the draft module expects {want.get(key)}"
      )


def insert_draft_checkpoint(
  state_dict: Mapping[str, Any],
  target_state_dict: Mapping[str, Any],
  *,
  is_resuming: bool = False,
  path: str | None = None,
  dtype: Any = None,
) -> dict[str, Any]:
  """A T5X restore transformation that adds the draft checkpoint to the state read.

  T5X calls it (in `RestoreCheckpointConfig.state_transformation_fns`) with the state
  read from the target checkpoint; it adds the draft's `target` tree, read with
  `specdec.io.load_t5x(path, dtype=dtype)`, under
  `state_dict['target'][DRAFT_KEY]`; T5X then shards it with the rest. T5X casts only
  the arrays it reads itself (`RestoreCheckpointConfig.dtype`), not arrays a
  transformation returns: give the same `dtype` here (configs/runs/infer.gin does).
  A checkpoint that already holds a draft (written from this model's train state) is
  returned unchanged. Serves both speculative models.

  Args:
    state_dict: the optimizer state read from the target checkpoint.
    target_state_dict: the state of the model being restored (shapes only).
    is_resuming: part of T5X's protocol; resuming reads the checkpoint the same way.
    path: the draft's T5X checkpoint (gin: `DRAFT_CHECKPOINT_PATH`).
    dtype: cast the draft's parameters to this dtype (None: as stored).

  Raises:
    ValueError: no `path`, a model without a draft, or a draft checkpoint whose
      parameters differ from the draft module's (key and shapes named).
  """
  del is_resuming
  if not path:
    raise ValueError(
      "path: the draft checkpoint is unset (gin: "
      "insert_draft_checkpoint.path = %DRAFT_CHECKPOINT_PATH)"
    )
  expected = target_state_dict.get("target", {})
  if DRAFT_KEY not in expected:
    raise ValueError(
      f"the model being restored has no {DRAFT_KEY!r} parameters: "
      "insert_draft_checkpoint is for SpeculativeEncoderDecoderModel "
      "and SpeculativeDecoderOnlyModel"
    )
  if DRAFT_KEY in state_dict.get("target", {}):
    return dict(state_dict)
  draft = load_t5x(os.fspath(path), dtype=dtype)
  _check_shapes(path, draft, expected[DRAFT_KEY])
  return {**state_dict, "target": {**state_dict["target"], DRAFT_KEY: draft}}


# ------------------------------------------------------------------------------
# The decodes the entry points share.
# ------------------------------------------------------------------------------
def sampling_from_t5x(temperature: float = 1.0, topk: int = 0, topp: float = 0.0) -> SamplingConfig:
  """T5X's `temperature_sample` arguments (0 = off for topk/topp) as a SamplingConfig."""
  if topk and topp:
    raise ValueError(
      f"topk ({topk}) and topp ({topp}): at most one may be non-zero, "
      "as in T5X's temperature_sample"
    )
  return SamplingConfig(temperature=temperature, top_k=topk or None, top_p=topp or None)


def _check_num_decodes(num_decodes: Any) -> int:
  if isinstance(num_decodes, bool) or not isinstance(num_decodes, int) or num_decodes < 1:
    raise ValueError(f"num_decodes must be an int >= 1, got {num_decodes!r}")
  return num_decodes


def _stats(out: SampleOutput, lengths: Array) -> dict[str, Array]:
  return {
    "length": lengths,
    "iterations": out.stats.iterations,
    "drafted": out.stats.drafted,
    "accepted": out.stats.accepted,
    "alpha_hat": out.stats.alpha_hat,
  }


def _sorted_by_score(
  batch: int, num_decodes: int, tokens: Array, scores: Array, stats: Mapping[str, Array]
) -> tuple[Array, Array, dict[str, Array]]:
  """Rows b * num_decodes + j (T5X's order) -> [B, num_decodes, ...], sorted by
  increasing score along axis 1, as T5X's decodes are."""

  def unflatten(x: Array) -> Array:
    return x.reshape((batch, num_decodes) + x.shape[1:])

  order = jnp.argsort(unflatten(scores), axis=1)

  def sort(x: Array) -> Array:
    x = unflatten(x)
    index = order.reshape(order.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)

  return sort(tokens), sort(scores), {k: sort(v) for k, v in stats.items()}


def decode(
  target: t5.T5,
  draft: t5.T5,
  inputs: Array,
  rng: Array | None,
  *,
  max_decode_length: int,
  num_decodes: int,
  eos_id: int,
  gamma: int,
  sampling: SamplingConfig,
) -> tuple[Array, Array, dict[str, Array]]:
  """num_decodes speculative decodes of each row of an encoder-decoder, sorted as T5X
  sorts them.

  One compiled program per static configuration (T5X traces it inside its own pjit;
  called directly, it is jitted here).

  Args:
    target: Mp.
    draft: Mq.
    inputs: int[B, S], encoder tokens.
    rng: a PRNG key, or None for T5X's default `PRNGKey(0)`.
    max_decode_length: L, tokens per decode.
    num_decodes: independent decodes per row.
    eos_id: the token that ends a decode.
    gamma: draft tokens per iteration.
    sampling: applied to both models.

  Returns:
    decodes int32[B, num_decodes, L]; scores float32[B, num_decodes], T5X's
    (module docstring: the sum of the sampler's `log_probs`); both sorted by
    increasing score along axis 1; and the per-decode statistics in the same order,
    each [B, num_decodes]: 'length', 'iterations' (target calls), 'drafted',
    'accepted', 'alpha_hat' (mean beta along the decode, the paper's alpha).
  """
  return _decode(
    target,
    draft,
    inputs,
    jax.random.PRNGKey(0) if rng is None else rng,
    max_decode_length=max_decode_length,
    num_decodes=_check_num_decodes(num_decodes),
    eos_id=eos_id,
    gamma=gamma,
    sampling=sampling,
  )


@functools.partial(
  jax.jit, static_argnames=("max_decode_length", "num_decodes", "eos_id", "gamma", "sampling")
)
def _decode(target, draft, inputs, rng, *, max_decode_length, num_decodes, eos_id, gamma, sampling):
  # T5X's row order: the decodes of row b are rows b * num_decodes + j.
  flat = jnp.repeat(inputs, num_decodes, axis=0)
  out = speculative_sample(
    target,
    draft,
    flat,
    rng,
    gamma=gamma,
    max_new_tokens=max_decode_length,
    sampling=sampling,
    eos_id=eos_id,
  )
  return _sorted_by_score(
    inputs.shape[0], num_decodes, out.tokens, out.scores, _stats(out, out.lengths)
  )


def decode_decoder_only(
  target: t5x_decoder.T5XDecoder,
  draft: t5x_decoder.T5XDecoder,
  inputs: Array,
  rng: Array | None,
  *,
  num_decodes: int,
  eos_id: int,
  gamma: int,
  sampling: SamplingConfig,
) -> tuple[Array, Array, dict[str, Array]]:
  """num_decodes speculative decodes of each prompt, as T5X's `DecoderOnlyModel`
  returns them.

  Row b's prompt is T5X's: inputs[b] = [0, prompt (P_b tokens), 0, ...], P_b being
  T5X's `initial_index` (`t5x_decoder.prefix_lengths`). T5X's `temperature_sample`
  writes the decode at positions P_b + 1 .. L of the length-L sequence, so it
  generates at most L - P_b tokens, and `DecoderOnlyModel` returns them shifted to
  the front (`remove_prefix`). Here each row is sampled for up to L tokens and cut
  at L - P_b: the first L - P_b tokens of a longer sample have exactly the law of a
  sample of L - P_b tokens, so the output is T5X's (its greedy decode at
  temperature 0). The sampler takes one length for the whole batch, so a row that
  meets no EOS decodes P_b tokens more than it keeps.

  Args:
    target: Mp.
    draft: Mq, the same vocabulary; fed the same prompts.
    inputs: int[B, L], T5X's `decoder_input_tokens * decoder_causal_attention`.
    rng: a PRNG key, or None for T5X's default `PRNGKey(0)`.
    num_decodes: independent decodes per row.
    eos_id: the token that ends a decode.
    gamma: draft tokens per iteration.
    sampling: applied to both models.

  Returns:
    decodes int32[B, num_decodes, L] (row b's first L - P_b positions at most are
    non-zero), scores float32[B, num_decodes] (T5X's, over those tokens), sorted by
    increasing score along axis 1, and the statistics of `decode` in that order
    ('length' counts the kept tokens; the others, the whole decode).
  """
  return _decode_decoder_only(
    target,
    draft,
    inputs,
    jax.random.PRNGKey(0) if rng is None else rng,
    num_decodes=_check_num_decodes(num_decodes),
    eos_id=eos_id,
    gamma=gamma,
    sampling=sampling,
  )


@functools.partial(jax.jit, static_argnames=("num_decodes", "eos_id", "gamma", "sampling"))
def _decode_decoder_only(target, draft, inputs, rng, *, num_decodes, eos_id, gamma, sampling):
  length = inputs.shape[1]
  flat = jnp.repeat(inputs, num_decodes, axis=0)
  out = speculative_sample(
    target, draft, flat, rng, gamma=gamma, max_new_tokens=length, sampling=sampling, eos_id=eos_id
  )
  budget = length - t5x_decoder.prefix_lengths(flat)  # [N], T5X's tokens per row
  kept = jnp.arange(length)[None] < budget[:, None]
  tokens = jnp.where(kept, out.tokens, 0)
  if out.log_probs is None:  # speculative_sample always returns them
    raise ValueError("speculative_sample returned no log_probs to score the decodes")
  scores = jnp.sum(jnp.where(kept, out.log_probs, 0.0), axis=1)
  return _sorted_by_score(
    inputs.shape[0], num_decodes, tokens, scores, _stats(out, jnp.minimum(out.lengths, budget))
  )


def _check_pair(target: Any, draft: Any) -> None:
  if target.vocab_size != draft.vocab_size:
    raise ValueError(
      f"draft_module: vocab_size {draft.vocab_size} differs from the "
      f"target's {target.vocab_size}; Algorithm 1 compares p and q "
      "token by token"
    )


# ------------------------------------------------------------------------------
# The decode_fn.
# ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _draft_params(path: str, config: Any) -> PyTree:
  # Read once per process: T5X calls the decode_fn at every trace.
  if isinstance(config, t5.T5Config):
    return load_t5x(path, config, dtype=config.dtype)
  params = load_t5x(path, dtype=config.dtype)
  _check_shapes(path, params, t5x_decoder.param_shapes(config))
  return params


def _model_from_callback(tokens_to_logits: Callable[..., Any]) -> tuple[Any, Mapping[str, Any]]:
  """(T5X's model, the keywords bound into its callback).

  `EncoderDecoderModel.predict_batch_with_aux` binds the callback as
  `functools.partial(model._compute_logits_from_slice, params=..., encoded_inputs=...,
  raw_inputs=..., max_decode_length=...)`, `DecoderOnlyModel`'s as the same partial
  with `params` and `max_decode_length` only; the model, params and (encoder-decoder)
  raw inputs are all a chunked target needs.
  """
  func: Any = getattr(tokens_to_logits, "func", None)
  keywords = getattr(tokens_to_logits, "keywords", {})
  if (
    not isinstance(tokens_to_logits, functools.partial)
    or getattr(func, "__name__", None) != "_compute_logits_from_slice"
    or not hasattr(func, "__self__")
    or "params" not in keywords
  ):
    raise TypeError(
      "tokens_to_logits must be the callback T5X's EncoderDecoderModel or "
      "DecoderOnlyModel.predict_batch_with_aux builds (a functools.partial of "
      "_compute_logits_from_slice with params); speculative_decode reads the "
      f"target from it, got {tokens_to_logits!r}"
    )
  return func.__self__, keywords


def with_prefix(inputs: Array, decodes: Array) -> Array:
  """T5X's `temperature_sample` layout of decoder-only decodes, which
  `DecoderOnlyModel` undoes with `remove_prefix`.

  Args:
    inputs: int[B, L], T5X's decoder-only prompts (`t5x_decoder.prefix_lengths`).
    decodes: int32[B, n, L], generated tokens first (`decode_decoder_only`).

  Returns:
    int32[B, n, L]: row b's prompt inputs[b, 1:P_b + 1], then its decode.
  """
  length = inputs.shape[1]
  prefix = t5x_decoder.prefix_lengths(inputs)[:, None, None]  # [B, 1, 1]
  positions = jnp.arange(length)[None, None]  # [1, 1, L]
  generated = jnp.take_along_axis(decodes, jnp.maximum(positions - prefix, 0), axis=2)
  prompt = jnp.pad(inputs[:, 1:], ((0, 0), (0, 1)))[:, None].astype(decodes.dtype)
  return jnp.where(positions < prefix, prompt, generated)


def speculative_decode(
  *,
  inputs: Array,
  cache: Mapping[str, Array],
  tokens_to_logits: Callable[..., Any],
  eos_id: int,
  num_decodes: int = 1,
  decode_rng: Array | None = None,
  cache_offset: int = 0,
  initial_index: Array | None = None,
  draft_module: Any = None,
  draft_checkpoint_path: str | None = None,
  gamma: int = 7,
  temperature: float = 1.0,
  topk: int = 0,
  topp: float = 0.0,
  **kwargs,
) -> tuple[Array, Array]:
  """Speculative decoding with T5X's `decode_fn` convention (like `temperature_sample`).

  Bind it as `models.EncoderDecoderModel.decode_fn = @specdec_t5x.speculative_decode`
  (or `models.DecoderOnlyModel.decode_fn`) with `draft_module`,
  `draft_checkpoint_path`, `gamma` and the sampling arguments bound in gin too.

  What it needs beyond T5X's one-token callback, and why:

  1. The target, chunked. Algorithm 1 scores gamma + 1 draft tokens with ONE target
     call, and rows accept different numbers of tokens, so each row rewinds its cache
     on its own. T5X's `tokens_to_logits` feeds one token against a cache with one
     shared index, and `cache` is that cache: neither can do this. So the function
     reads the model and `params` (and, for an encoder-decoder, `raw_inputs`, the
     encoder tokens) bound into `tokens_to_logits` by the model's
     `predict_batch_with_aux`, rebuilds the target with a chunked, per-row cache
     (`specdec.models.t5.T5`, or `t5x_decoder.T5XDecoder` with the model's
     `inputs_bidirectional_attention`), and ignores `cache` and `cache_offset` (XLA
     drops T5X's unused cache). The model's module must be specdec's or T5X's
     network of that kind (`config_of`, `decoder_only_config_of`).
  2. A draft. Algorithm 1 needs the draft's distributions q; T5X gives one model. The
     draft is `draft_module` (of the target's kind) with the T5X checkpoint at
     `draft_checkpoint_path`, read once per process. T5X passes a decode_fn no
     parameters of its own, so the draft's weights enter the compiled program as
     constants, replicated: fine for a small draft, but the Speculative*Model
     classes pass them as sharded arguments instead and should be preferred.
  3. Prompts. An encoder-decoder takes none: `inputs` gives only L = inputs.shape[1]
     and must be all padding (T5X's default `prompt_with_targets=False`; under jit
     its values cannot be checked). A decoder-only model's `inputs` are its prompts
     (`decode_decoder_only`), and `initial_index` is T5X's
     `t5x_decoder.prefix_lengths(inputs)`, which is recomputed from them; the
     decodes come back in `temperature_sample`'s layout (`with_prefix`), which
     `DecoderOnlyModel` shifts back.

  Args:
    inputs: int32[B, L]: zeros (encoder-decoder) or prompts (decoder-only).
    cache: T5X's one-token cache (unused, see 1).
    tokens_to_logits: T5X's callback (see 1).
    eos_id: the token that ends a decode.
    num_decodes: independent decodes per row.
    decode_rng: a PRNG key; None is T5X's `PRNGKey(0)`.
    cache_offset: T5X's scanned-layer cache axis (unused, see 1).
    initial_index: int32[B], decoder-only models only (see 3).
    draft_module: the draft network (specdec's or T5X's, the target's kind).
    draft_checkpoint_path: the draft's T5X checkpoint.
    gamma: draft tokens per iteration.
    temperature, topk, topp: as in T5X's `temperature_sample` (0 = off).
    **kwargs: other decoder params; any is an error.

  Returns:
    (decodes int32[B, num_decodes, L], scores float32[B, num_decodes]), sorted by
    increasing score along axis 1; scores as the module docstring says.
  """
  del cache, cache_offset
  if kwargs:
    raise ValueError(f"speculative_decode: unsupported decoder params {sorted(kwargs)}")
  check_positive_int("gamma", gamma)
  if draft_module is None:
    raise ValueError("draft_module is unset (gin: speculative_decode.draft_module)")
  if not draft_checkpoint_path:
    raise ValueError(
      "draft_checkpoint_path is unset (gin: "
      "speculative_decode.draft_checkpoint_path = %DRAFT_CHECKPOINT_PATH)"
    )
  sampling = sampling_from_t5x(temperature, topk, topp)
  model, keywords = _model_from_callback(tokens_to_logits)
  path = os.fspath(draft_checkpoint_path)
  if "raw_inputs" in keywords:
    if initial_index is not None:
      raise ValueError(
        "initial_index: an encoder-decoder decode starts from the "
        "decoder start token; decoder prompts are not supported"
      )
    target = t5.T5(config_of(model.module, "the T5X model's module"), keywords["params"])
    draft_config = config_of(draft_module, "draft_module")
    _check_pair(target.config, draft_config)
    draft = t5.T5(draft_config, _draft_params(path, draft_config))
    # T5X expanded the encoder tokens to [B * num_decodes, S]; `decode` expands
    # itself.
    decodes, scores, _ = decode(
      target,
      draft,
      keywords["raw_inputs"][::num_decodes],
      decode_rng,
      max_decode_length=inputs.shape[1],
      num_decodes=num_decodes,
      eos_id=eos_id,
      gamma=gamma,
      sampling=sampling,
    )
    return decodes, scores
  bidirectional = bool(getattr(model, "_inputs_bidirectional_attention", False))
  lm_target = t5x_decoder.T5XDecoder(
    decoder_only_config_of(model.module, "the T5X model's module"),
    keywords["params"],
    bidirectional_prefix=bidirectional,
  )
  lm_draft_config = decoder_only_config_of(draft_module, "draft_module")
  _check_pair(lm_target.config, lm_draft_config)
  lm_draft = t5x_decoder.T5XDecoder(
    lm_draft_config, _draft_params(path, lm_draft_config), bidirectional_prefix=bidirectional
  )
  decodes, scores, _ = decode_decoder_only(
    lm_target,
    lm_draft,
    inputs,
    decode_rng,
    num_decodes=num_decodes,
    eos_id=eos_id,
    gamma=gamma,
    sampling=sampling,
  )
  return with_prefix(inputs, decodes), scores


# ------------------------------------------------------------------------------
# The models (built on first use: they subclass t5x classes).
# ------------------------------------------------------------------------------
def _model_classes() -> dict[str, type]:
  import flax.core
  from t5x import models

  class SpeculativeEncoderDecoderModel(models.EncoderDecoderModel):
    """T5X's `EncoderDecoderModel`, predicting by speculative decoding.

    Training, scoring and the target's checkpoint are T5X's; `predict_batch` and
    `predict_batch_with_aux` decode with `specdec.speculative_sample`, exactly the
    target's distribution under `sampling` (Appendix A.1), and the target's greedy
    decode at temperature 0. The parameter tree is the target's plus the draft's
    under `DRAFT_KEY` (see `insert_draft_checkpoint`); loss and scores use the
    target only.

    Args:
      module: the target network (specdec's `t5.Transformer`, or T5X's
        `network.Transformer`, which has the same parameters).
      input_vocabulary, output_vocabulary, optimizer_def, feature_converter_cls,
        label_smoothing, z_loss, loss_normalizing_factor, default_decoder_params:
        as `EncoderDecoderModel`.
      draft_module: the draft network, same vocabulary.
      gamma: draft tokens per iteration (the paper's Table 2 values are in
        configs/runs).
      sampling: temperature / top-k / top-p, applied to target and draft alike.
    """

    def __init__(
      self,
      module,
      input_vocabulary,
      output_vocabulary,
      optimizer_def=None,
      *,
      draft_module,
      gamma: int,
      sampling: SamplingConfig = SamplingConfig(),
      decode_fn=None,
      **kwargs,
    ):
      if decode_fn is not None:
        raise ValueError(
          "decode_fn: SpeculativeEncoderDecoderModel decodes with speculative "
          "sampling itself; to bind a decode_fn, use models.EncoderDecoderModel "
          "with decode_fn=specdec.t5x.speculative_decode"
        )
      self.gamma = check_positive_int("gamma", gamma)
      if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specdec.SamplingConfig, got {type(sampling).__name__}")
      self._target_config = config_of(module, "module")
      self._draft_config = config_of(draft_module, "draft_module")
      _check_pair(self._target_config, self._draft_config)
      sampling.validate_vocab(self._target_config.vocab_size)
      self.draft_module = draft_module
      self.sampling = sampling
      super().__init__(module, input_vocabulary, output_vocabulary, optimizer_def, **kwargs)

    def get_initial_variables(self, rng, input_shapes, input_types=None):
      """The target's variables (T5X's) plus the draft's under `DRAFT_KEY`."""
      target_rng, draft_rng = jax.random.split(rng)
      target = flax.core.unfreeze(
        super().get_initial_variables(target_rng, input_shapes, input_types)
      )
      input_types = input_types or {}
      encoder = jnp.ones(
        input_shapes["encoder_input_tokens"], input_types.get("encoder_input_tokens", jnp.int32)
      )
      decoder = jnp.ones(
        input_shapes["decoder_input_tokens"], input_types.get("decoder_input_tokens", jnp.int32)
      )
      draft = flax.core.unfreeze(
        self.draft_module.init(
          draft_rng, encoder, decoder, decoder, decode=False, enable_dropout=False
        )
      )
      return _with_draft_variables(target, draft)

    def _compute_logits(self, params, batch, dropout_rng=None, mutable=False, other_variables=None):
      # The loss and scores are the target's alone.
      return super()._compute_logits(
        _target_only(params), batch, dropout_rng, mutable, other_variables
      )

    def predict_batch_with_aux(
      self,
      params,
      batch,
      rng=None,
      decoder_params=None,
      return_all_decodes=None,
      num_decodes=None,
      prompt_with_targets=False,
    ):
      """Speculative decodes of `batch['encoder_input_tokens']` [B, S].

      Returns (decodes, aux) as T5X does: decodes int32[B, L] (the best of
      num_decodes) or [B, num_decodes, L] with `return_all_decodes`, L being
      `batch['decoder_input_tokens'].shape[1]`; aux holds 'scores' and the
      statistics of `decode` ('length', 'iterations', 'drafted', 'accepted',
      'alpha_hat'), each [B] or [B, num_decodes], in the decodes' order.
      `decoder_params` may hold 'decode_rng' and 'eos_id'.
      """
      if prompt_with_targets:
        raise ValueError(
          "prompt_with_targets: speculative decoding starts from the "
          "decoder start token; decoder prompts are not supported"
        )
      if return_all_decodes is None:
        return_all_decodes = self._default_decoder_params.return_all_decodes
      if num_decodes is None:
        num_decodes = self._default_decoder_params.num_decodes
      rng, eos_id = _decoder_params(
        decoder_params, rng, self.output_vocabulary.eos_id or DEFAULT_EOS_ID
      )
      target_params, draft_params = split_params(params)
      decodes, scores, stats = decode(
        t5.T5(self._target_config, target_params),
        t5.T5(self._draft_config, draft_params),
        batch["encoder_input_tokens"],
        rng,
        max_decode_length=batch["decoder_input_tokens"].shape[1],
        num_decodes=num_decodes,
        eos_id=eos_id,
        gamma=self.gamma,
        sampling=self.sampling,
      )
      return _best_or_all(decodes, {"scores": scores, **stats}, return_all_decodes)

  class SpeculativeDecoderOnlyModel(models.DecoderOnlyModel):
    """T5X's `DecoderOnlyModel`, predicting by speculative decoding.

    Training, scoring and the target's checkpoint are T5X's; `predict_batch` and
    `predict_batch_with_aux` decode each prompt with `specdec.speculative_sample`
    (`decode_decoder_only`), exactly the target's distribution under `sampling`
    (Appendix A.1), and at temperature 0 the greedy decode that T5X's
    `temperature_sample` gives. Prompts are T5X's: `decoder_input_tokens *
    decoder_causal_attention`, each row decoded from its own `initial_index`. The
    parameter tree is the target's plus the draft's under `DRAFT_KEY` (see
    `insert_draft_checkpoint`); loss and scores use the target only.

    Args:
      module: the target network (specdec's `t5x_decoder.Transformer`, or T5X's
        decoder-only `network.DecoderWrapper`, which has the same parameters).
      vocabulary, optimizer_def, feature_converter_cls, label_smoothing, z_loss,
        loss_normalizing_factor: as `DecoderOnlyModel`.
      inputs_bidirectional_attention: as `DecoderOnlyModel` (a prefix LM); the
        draft's prompt is read the same way.
      draft_module: the draft network, same vocabulary.
      gamma: draft tokens per iteration.
      sampling: temperature / top-k / top-p, applied to target and draft alike.
    """

    def __init__(
      self,
      module,
      vocabulary,
      optimizer_def=None,
      *,
      draft_module,
      gamma: int,
      sampling: SamplingConfig = SamplingConfig(),
      decode_fn=None,
      **kwargs,
    ):
      if decode_fn is not None:
        raise ValueError(
          "decode_fn: SpeculativeDecoderOnlyModel decodes with speculative "
          "sampling itself; to bind a decode_fn, use models.DecoderOnlyModel "
          "with decode_fn=specdec.t5x.speculative_decode"
        )
      self.gamma = check_positive_int("gamma", gamma)
      if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specdec.SamplingConfig, got {type(sampling).__name__}")
      self._target_config = decoder_only_config_of(module, "module")
      self._draft_config = decoder_only_config_of(draft_module, "draft_module")
      _check_pair(self._target_config, self._draft_config)
      sampling.validate_vocab(self._target_config.vocab_size)
      self.draft_module = draft_module
      self.sampling = sampling
      super().__init__(module, vocabulary, optimizer_def, **kwargs)

    def get_initial_variables(self, rng, input_shapes, input_types=None):
      """The target's variables (T5X's) plus the draft's under `DRAFT_KEY`."""
      target_rng, draft_rng = jax.random.split(rng)
      target = flax.core.unfreeze(
        super().get_initial_variables(target_rng, input_shapes, input_types)
      )
      tokens = jnp.ones(
        input_shapes["decoder_input_tokens"],
        (input_types or {}).get("decoder_input_tokens", jnp.int32),
      )
      draft = flax.core.unfreeze(
        self.draft_module.init(draft_rng, tokens, tokens, enable_dropout=False)
      )
      return _with_draft_variables(target, draft)

    def _compute_logits(self, params, batch, dropout_rng=None, mutable=False, other_variables=None):
      # The loss and scores are the target's alone.
      return super()._compute_logits(
        _target_only(params), batch, dropout_rng, mutable, other_variables
      )

    def predict_batch_with_aux(
      self, params, batch, rng=None, *, return_all_decodes=False, num_decodes=1, decoder_params=None
    ):
      """Speculative decodes of the prompts in `batch` [B, L] (T5X's features).

      Returns (decodes, aux) as T5X's `DecoderOnlyModel` does: decodes int32[B, L]
      (the best of num_decodes) or [B, num_decodes, L] with `return_all_decodes`,
      each row's generated tokens first (at most L - initial_index of them), zeros
      after; aux holds 'scores' and the statistics of `decode_decoder_only`, each
      [B] or [B, num_decodes], in the decodes' order. `decoder_params` may hold
      'decode_rng' and 'eos_id'.
      """
      if "decoder_causal_attention" not in batch:
        raise ValueError(
          "batch has no decoder_causal_attention: decoder-only prediction needs "
          "prompts (seqio.DecoderFeatureConverter with both 'inputs' and "
          "'targets' feature lengths), as T5X's DecoderOnlyModel does"
        )
      rng, eos_id = _decoder_params(
        decoder_params, rng, self.output_vocabulary.eos_id or DEFAULT_EOS_ID
      )
      target_params, draft_params = split_params(params)
      bidirectional = self._inputs_bidirectional_attention
      decodes, scores, stats = decode_decoder_only(
        t5x_decoder.T5XDecoder(
          self._target_config, target_params, bidirectional_prefix=bidirectional
        ),
        t5x_decoder.T5XDecoder(
          self._draft_config, draft_params, bidirectional_prefix=bidirectional
        ),
        batch["decoder_input_tokens"] * batch["decoder_causal_attention"],
        rng,
        num_decodes=num_decodes,
        eos_id=eos_id,
        gamma=self.gamma,
        sampling=self.sampling,
      )
      return _best_or_all(decodes, {"scores": scores, **stats}, return_all_decodes)

  for cls in (SpeculativeEncoderDecoderModel, SpeculativeDecoderOnlyModel):
    cls.__module__ = __name__
  return {
    "SpeculativeEncoderDecoderModel": SpeculativeEncoderDecoderModel,
    "SpeculativeDecoderOnlyModel": SpeculativeDecoderOnlyModel,
  }


def _target_only(params: Mapping[str, Any]) -> Mapping[str, Any]:
  if DRAFT_KEY not in params:
    return params
  return {k: v for k, v in params.items() if k != DRAFT_KEY}


def _with_draft_variables(target: Mapping[str, Any], draft: Mapping[str, Any]) -> Any:
  import flax.core

  return flax.core.freeze(
    {
      "params": {**target["params"], DRAFT_KEY: draft["params"]},
      "params_axes": {**target["params_axes"], DRAFT_KEY: draft["params_axes"]},
    }
  )


def _decoder_params(
  decoder_params: Mapping[str, Any] | None, rng: Array | None, default_eos_id: int
) -> tuple[Array | None, int]:
  """(rng, eos_id) from `predict_batch_with_aux`'s `rng` and `decoder_params`."""
  decoder_params = dict(decoder_params or {})
  unknown = sorted(set(decoder_params) - set(_DECODER_PARAMS))
  if unknown:
    raise ValueError(
      f"decoder_params: unsupported keys {unknown}; supported: {list(_DECODER_PARAMS)}"
    )
  if rng is not None and decoder_params.get("decode_rng") is not None:
    raise ValueError('rng and decoder_params["decode_rng"] are both set; give one')
  rng = rng if rng is not None else decoder_params.get("decode_rng")
  return rng, decoder_params.get("eos_id", default_eos_id)


def _best_or_all(
  decodes: Array, aux: Mapping[str, Array], return_all_decodes: bool
) -> tuple[Array, dict[str, Array]]:
  if return_all_decodes:
    return decodes, dict(aux)
  return decodes[:, -1], {k: v[:, -1] for k, v in aux.items()}


def __getattr__(name: str) -> Any:
  # PEP 562: t5x is imported when a model class is first asked for.
  if name in _MODEL_CLASSES:
    try:
      classes = _model_classes()
    except ImportError as e:
      raise ImportError(_T5X_MISSING.format(name=name)) from e
    globals().update(classes)
    return classes[name]
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
  print(gin_search_path())
