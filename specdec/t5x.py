"""Speculative decoding inside T5X: a drop-in `EncoderDecoderModel` and a `decode_fn`.

Two ways to decode a T5X model Mp with a draft Mq by Algorithm 1 of Leviathan, Kalman &
Matias (ICML 2023), both traceable inside T5X's `PjitPartitioner`:

* `SpeculativeEncoderDecoderModel` (recommended): a `t5x.models.EncoderDecoderModel`
  whose `predict_batch_with_aux` calls `specdec.speculative_sample`. The target is the
  model's own `module` and params; the draft is a second module (`draft_module`) whose
  params live in the same train state under `params['specdec_draft']` (`DRAFT_KEY`),
  so T5X shards them with its logical-axis rules and passes them to the compiled
  decode as arguments. They get there at restore time: `insert_draft_checkpoint`
  (with its `path`) in the restore config's `state_transformation_fns`, as
  `configs/runs/infer.gin` sets it.
* `speculative_decode`: a function with T5X's `decode_fn` calling convention, for a
  stock `EncoderDecoderModel` whose gin binds `decode_fn`. What it needs beyond
  T5X's one-token callback, and why, is in its docstring.

Both return T5X's shapes and order: decodes [B, num_decodes, L] and scores
[B, num_decodes] sorted by increasing score (the model keeps the last, best, one
unless `return_all_decodes`). A score is the log-probability of the decode under the
target after the sampling transform (T5X's `rescale_log_probs=True`; 0 when greedy),
from one teacher-forced target pass after decoding: the sampler never forms the
target's probability of a whole sequence.

t5x is not on PyPI. This module imports without it; `SpeculativeEncoderDecoderModel`
imports t5x when first used and raises an ImportError saying how to install it.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Mapping, Optional

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec import checkpoints
from specdec.distributions import SamplingConfig, probabilities
from specdec.models import t5
from specdec.sample import speculative_sample

Array = jax.Array
PyTree = Any

# Where the draft's parameters sit in the model's parameter tree. Not a key of
# `t5.Transformer`'s tree (token_embedder, encoder, decoder), so the target's
# checkpoint restores unchanged beside it.
DRAFT_KEY = 'specdec_draft'
# T5X's `EncoderDecoderModel` decodes to the output vocabulary's EOS, else 1.
DEFAULT_EOS_ID = 1
# The `t5.T5Config` fields, which T5X's `network.T5Config` shares by name.
_CONFIG_FIELDS = ('vocab_size', 'dtype', 'emb_dim', 'num_heads', 'num_encoder_layers',
                  'num_decoder_layers', 'head_dim', 'mlp_dim', 'mlp_activations',
                  'dropout_rate', 'logits_via_embedding')
_T5X_NETWORK_MODULE = 't5x.examples.t5.network'
_T5X_MISSING = (
    "specdec.t5x.SpeculativeEncoderDecoderModel subclasses T5X's EncoderDecoderModel, "
    'but t5x cannot be imported. t5x is not on PyPI: install it from its source '
    '(https://github.com/google-research/t5x; `pip install -e .` in a checkout), then '
    "`pip install 'specdec[t5x]'`.")
# Decoder parameters `predict_batch_with_aux` takes (T5X passes others only to
# decode_fns that declare them).
_DECODER_PARAMS = ('decode_rng', 'eos_id')
# A floor for the log of a probability: a sampled token at the edge of a top-k /
# top-p set can fall just outside it in the scoring pass, whose rounding differs from
# the cached decode's; the floor keeps such a score finite.
_LOG_FLOOR = float(np.finfo(np.float32).tiny)


# ------------------------------------------------------------------------------
# Configuration and parameters.
# ------------------------------------------------------------------------------
def config_of(module: Any, name: str = 'module') -> t5.T5Config:
  """The `t5.T5Config` of a T5 network: specdec's `t5.Transformer` or T5X's.

  T5X's `t5x.examples.t5.network.Transformer` has the same parameter tree and config
  field names (its `float32_attention_logits` is implied: specdec computes attention
  logits in float32 always), so a T5X gin model file works unchanged.

  Raises:
    TypeError: naming `name`, for any other module.
  """
  if isinstance(module, t5.Transformer):
    config = module.config
  elif type(module).__module__ == _T5X_NETWORK_MODULE and hasattr(module, 'config'):
    config = t5.T5Config(**{f: getattr(module.config, f) for f in _CONFIG_FIELDS})
  else:
    raise TypeError(f"{name} must be specdec.models.t5.Transformer or T5X's "
                    f't5x.examples.t5.network.Transformer, got {type(module).__name__}')
  # gin and T5X may give mlp_activations as a list; a jit-static config must hash.
  config = config.replace(mlp_activations=tuple(config.mlp_activations))
  t5.check_config(config)
  return config


def split_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
  """params -> (the target's tree, the draft's tree under `DRAFT_KEY`).

  Raises:
    ValueError: when `params` holds no draft, saying how to put it there.
  """
  if not isinstance(params, Mapping) or DRAFT_KEY not in params:
    keys = sorted(params) if isinstance(params, Mapping) else type(params).__name__
    raise ValueError(
        f'params has no {DRAFT_KEY!r} subtree (keys: {keys}): restore the target with '
        'state_transformation_fns=[specdec.t5x.insert_draft_checkpoint] (its path '
        'the draft checkpoint), or build the tree with specdec.t5x.with_draft')
  target = {k: v for k, v in params.items() if k != DRAFT_KEY}
  return target, params[DRAFT_KEY]


def with_draft(params: Mapping[str, Any], draft_params: Mapping[str, Any]) -> dict:
  """The parameter tree of `SpeculativeEncoderDecoderModel`: target + draft."""
  if DRAFT_KEY in params:
    raise ValueError(f'params already holds a {DRAFT_KEY!r} subtree')
  return {**params, DRAFT_KEY: draft_params}


def _flat_shapes(tree: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  return {'/'.join(k): tuple(np.shape(v)) for k, v in
          traverse_util.flatten_dict(dict(tree)).items()}


def insert_draft_checkpoint(state_dict: Mapping[str, Any],
                            target_state_dict: Mapping[str, Any], *,
                            is_resuming: bool = False, path: Optional[str] = None,
                            dtype: Any = None) -> dict[str, Any]:
  """A T5X restore transformation that adds the draft checkpoint to the state read.

  T5X calls it (in `RestoreCheckpointConfig.state_transformation_fns`) with the state
  read from the target checkpoint; it adds the draft's `target` tree, read with
  `specdec.checkpoints.load_t5x(path, dtype=dtype)`, under
  `state_dict['target'][DRAFT_KEY]`; T5X then shards it with the rest. T5X casts only
  the arrays it reads itself (`RestoreCheckpointConfig.dtype`), not arrays a
  transformation returns: give the same `dtype` here (configs/runs/infer.gin does).
  A checkpoint that already holds a draft (written from this model's train state) is
  returned unchanged.

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
    raise ValueError('path: the draft checkpoint is unset (gin: '
                     'insert_draft_checkpoint.path = %DRAFT_CHECKPOINT_PATH)')
  expected = target_state_dict.get('target', {})
  if DRAFT_KEY not in expected:
    raise ValueError(f'the model being restored has no {DRAFT_KEY!r} parameters: '
                     'insert_draft_checkpoint is for SpeculativeEncoderDecoderModel')
  if DRAFT_KEY in state_dict.get('target', {}):
    return dict(state_dict)
  draft = checkpoints.load_t5x(os.fspath(path), dtype=dtype)
  found, want = _flat_shapes(draft), _flat_shapes(expected[DRAFT_KEY])
  for key in sorted(set(found) | set(want)):
    if found.get(key) != want.get(key):
      raise ValueError(f'draft checkpoint {path}: parameter {key!r} has shape '
                       f'{found.get(key)}, the draft module expects {want.get(key)}')
  return {**state_dict, 'target': {**state_dict['target'], DRAFT_KEY: draft}}


# ------------------------------------------------------------------------------
# The decode both entry points share.
# ------------------------------------------------------------------------------
def sampling_from_t5x(temperature: float = 1.0, topk: int = 0,
                      topp: float = 0.0) -> SamplingConfig:
  """T5X's `temperature_sample` arguments (0 = off for topk/topp) as a SamplingConfig."""
  if topk and topp:
    raise ValueError(f'topk ({topk}) and topp ({topp}): at most one may be non-zero, '
                     "as in T5X's temperature_sample")
  return SamplingConfig(temperature=temperature, top_k=topk or None, top_p=topp or None)


def sequence_scores(model: t5.T5, inputs: Array, tokens: Array, lengths: Array,
                    sampling: SamplingConfig) -> Array:
  """float32[B]: log-probability of each decode under `model` and `sampling`.

  Args:
    model: the target.
    inputs: int[B, S], encoder tokens.
    tokens: int32[B, L], decodes (0 past each row's length).
    lengths: int32[B], decoded tokens per row, EOS included.
    sampling: the transform the decode sampled under.

  Returns:
    sum over positions t < lengths[b] of log p_sampling(tokens[b, t] | tokens[b, :t]),
    from one teacher-forced pass; all zeros when greedy, as T5X reports.
  """
  if sampling.greedy:
    return jnp.zeros(tokens.shape[:1], jnp.float32)
  valid = jnp.arange(tokens.shape[1])[None] < lengths[:, None]
  decoder_inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)),
                           constant_values=t5.DECODER_START_ID)
  # Targets only set the decoder's padding mask: every decoded position is real,
  # even a 0 the model produced.
  logits = model.module.apply({'params': model.params}, inputs, decoder_inputs,
                              valid.astype(jnp.int32), enable_dropout=False)
  probs = jnp.take_along_axis(probabilities(logits, sampling), tokens[..., None],
                              axis=-1)[..., 0]
  return jnp.sum(jnp.where(valid, jnp.log(jnp.maximum(probs, _LOG_FLOOR)), 0.0),
                 axis=1)


def decode(target: t5.T5, draft: t5.T5, inputs: Array, rng: Optional[Array], *,
           max_decode_length: int, num_decodes: int, eos_id: int, gamma: int,
           sampling: SamplingConfig) -> tuple[Array, Array, dict[str, Array]]:
  """num_decodes speculative decodes of each row, sorted as T5X sorts them.

  One compiled program per static configuration (T5X traces it inside its own pjit;
  called directly, it is jitted here, so that scoring does not run op by op).

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
    decodes int32[B, num_decodes, L], scores float32[B, num_decodes], both sorted by
    increasing score along axis 1, and the per-decode statistics in the same order,
    each [B, num_decodes]: 'length', 'iterations' (target calls), 'drafted',
    'accepted', 'alpha_hat' (mean beta along the decode, the paper's alpha).
  """
  if isinstance(num_decodes, bool) or not isinstance(num_decodes, int) or num_decodes < 1:
    raise ValueError(f'num_decodes must be an int >= 1, got {num_decodes!r}')
  return _decode(target, draft, inputs,
                 jax.random.PRNGKey(0) if rng is None else rng,
                 max_decode_length=max_decode_length, num_decodes=num_decodes,
                 eos_id=eos_id, gamma=gamma, sampling=sampling)


@functools.partial(jax.jit, static_argnames=('max_decode_length', 'num_decodes',
                                             'eos_id', 'gamma', 'sampling'))
def _decode(target, draft, inputs, rng, *, max_decode_length, num_decodes, eos_id,
            gamma, sampling):
  batch = inputs.shape[0]
  # T5X's row order: the decodes of row b are rows b * num_decodes + j.
  flat = jnp.repeat(inputs, num_decodes, axis=0)
  out = speculative_sample(target, draft, flat, rng, gamma=gamma,
                           max_new_tokens=max_decode_length, sampling=sampling,
                           eos_id=eos_id)
  scores = sequence_scores(target, flat, out.tokens, out.lengths, sampling)
  stats = {'length': out.lengths, 'iterations': out.stats.iterations,
           'drafted': out.stats.drafted, 'accepted': out.stats.accepted,
           'alpha_hat': out.stats.alpha_hat}

  def unflatten(x: Array) -> Array:
    return x.reshape((batch, num_decodes) + x.shape[1:])

  order = jnp.argsort(unflatten(scores), axis=1)

  def sort(x: Array) -> Array:
    x = unflatten(x)
    index = order.reshape(order.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)

  return sort(out.tokens), sort(scores), {k: sort(v) for k, v in stats.items()}


def _check_gamma(gamma: Any) -> None:
  if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
    raise ValueError(f'gamma must be an int >= 1, got {gamma!r}')


def _check_pair(target: t5.T5Config, draft: t5.T5Config) -> None:
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f'draft_module: vocab_size {draft.vocab_size} differs from the '
                     f"target's {target.vocab_size}; Algorithm 1 compares p and q token "
                     'by token')


# ------------------------------------------------------------------------------
# The decode_fn.
# ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _draft_params(path: str, config: t5.T5Config) -> PyTree:
  # Read once per process: T5X calls the decode_fn at every trace.
  return checkpoints.load_t5x(path, config, dtype=config.dtype)


def _target_from_callback(tokens_to_logits: Callable[..., Any]
                          ) -> tuple[t5.T5, Array]:
  """(the target as a `t5.T5`, encoder tokens [B * num_decodes, S]) from T5X's callback.

  `EncoderDecoderModel.predict_batch_with_aux` binds the callback as
  `functools.partial(model._compute_logits_from_slice, params=..., encoded_inputs=...,
  raw_inputs=..., max_decode_length=...)`; its model, params and raw inputs are all a
  chunked target needs.
  """
  func = getattr(tokens_to_logits, 'func', None)
  keywords = getattr(tokens_to_logits, 'keywords', {})
  if (not isinstance(tokens_to_logits, functools.partial)
      or getattr(func, '__name__', None) != '_compute_logits_from_slice'
      or not hasattr(func, '__self__')
      or not {'params', 'raw_inputs'} <= set(keywords)):
    raise TypeError(
        'tokens_to_logits must be the callback T5X\'s EncoderDecoderModel.'
        'predict_batch_with_aux builds (a functools.partial of '
        '_compute_logits_from_slice with params and raw_inputs); speculative_decode '
        f'reads the target from it, got {tokens_to_logits!r}')
  config = config_of(func.__self__.module, 'the T5X model\'s module')
  return t5.T5(config, keywords['params']), keywords['raw_inputs']


def speculative_decode(*, inputs: Array, cache: Mapping[str, Array],
                       tokens_to_logits: Callable[..., Any], eos_id: int,
                       num_decodes: int = 1, decode_rng: Optional[Array] = None,
                       cache_offset: int = 0, draft_module: Any = None,
                       draft_checkpoint_path: Optional[str] = None, gamma: int = 7,
                       temperature: float = 1.0, topk: int = 0, topp: float = 0.0,
                       **kwargs) -> tuple[Array, Array]:
  """Speculative decoding with T5X's `decode_fn` convention (like `temperature_sample`).

  Bind it as `models.EncoderDecoderModel.decode_fn = @specdec_t5x.speculative_decode`
  with `draft_module`, `draft_checkpoint_path`, `gamma` and the sampling arguments
  bound in gin too.

  What it needs beyond T5X's one-token callback, and why:

  1. The target, chunked. Algorithm 1 scores gamma + 1 draft tokens with ONE target
     call, and rows accept different numbers of tokens, so each row rewinds its cache
     on its own. T5X's `tokens_to_logits` feeds one token against a cache with one
     shared index, and `cache` is that cache: neither can do this. So the function
     reads the model, `params` and `raw_inputs` (the encoder tokens) bound into
     `tokens_to_logits` by `EncoderDecoderModel.predict_batch_with_aux`, rebuilds the
     target as a `specdec.models.t5.T5` with a chunked, per-row cache, and ignores
     `cache` and `cache_offset` (XLA drops T5X's unused cache). The model's module
     must be specdec's `t5.Transformer` or T5X's `network.Transformer`.
  2. A draft. Algorithm 1 needs the draft's distributions q; T5X gives one model. The
     draft is `draft_module` with the T5X checkpoint at `draft_checkpoint_path`,
     read once per process. T5X passes a decode_fn no parameters of its own, so the
     draft's weights enter the compiled program as constants, replicated: fine for
     a small draft, but `SpeculativeEncoderDecoderModel` passes them as sharded
     arguments instead and should be preferred.
  3. No decoder prompt: `inputs` gives only L = inputs.shape[1]; it must be all
     padding (T5X's default `prompt_with_targets=False`). Under jit its values cannot
     be checked here.

  Args:
    inputs: int32[B, L], zeros; its length is the decode length.
    cache: T5X's one-token cache (unused, see 1).
    tokens_to_logits: T5X's callback (see 1).
    eos_id: the token that ends a decode.
    num_decodes: independent decodes per row.
    decode_rng: a PRNG key; None is T5X's `PRNGKey(0)`.
    cache_offset: T5X's scanned-layer cache axis (unused, see 1).
    draft_module: the draft network (specdec's or T5X's T5 Transformer).
    draft_checkpoint_path: the draft's T5X checkpoint.
    gamma: draft tokens per iteration.
    temperature, topk, topp: as in T5X's `temperature_sample` (0 = off).
    **kwargs: other decoder params; any is an error.

  Returns:
    (decodes int32[B, num_decodes, L], scores float32[B, num_decodes]), sorted by
    increasing score along axis 1.
  """
  del cache, cache_offset
  if kwargs:
    raise ValueError(f'speculative_decode: unsupported decoder params {sorted(kwargs)}')
  _check_gamma(gamma)
  if draft_module is None:
    raise ValueError('draft_module is unset (gin: speculative_decode.draft_module)')
  if not draft_checkpoint_path:
    raise ValueError('draft_checkpoint_path is unset (gin: '
                     'speculative_decode.draft_checkpoint_path = %DRAFT_CHECKPOINT_PATH)')
  sampling = sampling_from_t5x(temperature, topk, topp)
  target, raw_inputs = _target_from_callback(tokens_to_logits)
  draft_config = config_of(draft_module, 'draft_module')
  _check_pair(target.config, draft_config)
  draft = t5.T5(draft_config, _draft_params(os.fspath(draft_checkpoint_path),
                                            draft_config))
  # T5X expanded the encoder tokens to [B * num_decodes, S]; `decode` expands itself.
  decodes, scores, _ = decode(target, draft, raw_inputs[::num_decodes], decode_rng,
                              max_decode_length=inputs.shape[1],
                              num_decodes=num_decodes, eos_id=eos_id, gamma=gamma,
                              sampling=sampling)
  return decodes, scores


# ------------------------------------------------------------------------------
# The model (built on first use: it subclasses a t5x class).
# ------------------------------------------------------------------------------
def _model_class() -> type:
  try:
    from t5x import models  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(_T5X_MISSING) from e
  import flax.core  # pylint: disable=g-import-not-at-top

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

    def __init__(self, module, input_vocabulary, output_vocabulary,
                 optimizer_def=None, *, draft_module, gamma: int,
                 sampling: SamplingConfig = SamplingConfig(), decode_fn=None,
                 **kwargs):
      if decode_fn is not None:
        raise ValueError(
            'decode_fn: SpeculativeEncoderDecoderModel decodes with speculative '
            'sampling itself; to bind a decode_fn, use models.EncoderDecoderModel '
            'with decode_fn=specdec.t5x.speculative_decode')
      _check_gamma(gamma)
      if not isinstance(sampling, SamplingConfig):
        raise TypeError(f'sampling must be a specdec.SamplingConfig, got '
                        f'{type(sampling).__name__}')
      self._target_config = config_of(module, 'module')
      self._draft_config = config_of(draft_module, 'draft_module')
      _check_pair(self._target_config, self._draft_config)
      sampling.validate_vocab(self._target_config.vocab_size)
      self.draft_module = draft_module
      self.gamma = gamma
      self.sampling = sampling
      super().__init__(module, input_vocabulary, output_vocabulary, optimizer_def,
                       **kwargs)

    def get_initial_variables(self, rng, input_shapes, input_types=None):
      """The target's variables (T5X's) plus the draft's under `DRAFT_KEY`."""
      target_rng, draft_rng = jax.random.split(rng)
      target = flax.core.unfreeze(
          super().get_initial_variables(target_rng, input_shapes, input_types))
      input_types = input_types or {}
      encoder = jnp.ones(input_shapes['encoder_input_tokens'],
                         input_types.get('encoder_input_tokens', jnp.int32))
      decoder = jnp.ones(input_shapes['decoder_input_tokens'],
                         input_types.get('decoder_input_tokens', jnp.int32))
      draft = flax.core.unfreeze(self.draft_module.init(
          draft_rng, encoder, decoder, decoder, decode=False, enable_dropout=False))
      return flax.core.freeze({
          'params': {**target['params'], DRAFT_KEY: draft['params']},
          'params_axes': {**target['params_axes'], DRAFT_KEY: draft['params_axes']},
      })

    def _compute_logits(self, params, batch, dropout_rng=None, mutable=False,
                        other_variables=None):
      # The loss and scores are the target's alone.
      target_params = ({k: v for k, v in params.items() if k != DRAFT_KEY}
                       if DRAFT_KEY in params else params)
      return super()._compute_logits(target_params, batch, dropout_rng, mutable,
                                     other_variables)

    def predict_batch_with_aux(self, params, batch, rng=None, decoder_params=None,
                               return_all_decodes=None, num_decodes=None,
                               prompt_with_targets=False):
      """Speculative decodes of `batch['encoder_input_tokens']` [B, S].

      Returns (decodes, aux) as T5X does: decodes int32[B, L] (the best of
      num_decodes) or [B, num_decodes, L] with `return_all_decodes`, L being
      `batch['decoder_input_tokens'].shape[1]`; aux holds 'scores' and the
      statistics of `decode` ('length', 'iterations', 'drafted', 'accepted',
      'alpha_hat'), each [B] or [B, num_decodes], in the decodes' order.
      `decoder_params` may hold 'decode_rng' and 'eos_id'.
      """
      if prompt_with_targets:
        raise ValueError('prompt_with_targets: speculative decoding starts from the '
                         'decoder start token; decoder prompts are not supported')
      if return_all_decodes is None:
        return_all_decodes = self._default_decoder_params.return_all_decodes
      if num_decodes is None:
        num_decodes = self._default_decoder_params.num_decodes
      decoder_params = dict(decoder_params or {})
      unknown = sorted(set(decoder_params) - set(_DECODER_PARAMS))
      if unknown:
        raise ValueError(f'decoder_params: unsupported keys {unknown}; supported: '
                         f'{list(_DECODER_PARAMS)}')
      if rng is not None and decoder_params.get('decode_rng') is not None:
        raise ValueError('rng and decoder_params["decode_rng"] are both set; give one')
      rng = rng if rng is not None else decoder_params.get('decode_rng')
      eos_id = decoder_params.get('eos_id', self.output_vocabulary.eos_id
                                  or DEFAULT_EOS_ID)
      target_params, draft_params = split_params(params)
      decodes, scores, stats = decode(
          t5.T5(self._target_config, target_params),
          t5.T5(self._draft_config, draft_params), batch['encoder_input_tokens'], rng,
          max_decode_length=batch['decoder_input_tokens'].shape[1],
          num_decodes=num_decodes, eos_id=eos_id, gamma=self.gamma,
          sampling=self.sampling)
      aux = {'scores': scores, **stats}
      if return_all_decodes:
        return decodes, aux
      return decodes[:, -1], {k: v[:, -1] for k, v in aux.items()}

  SpeculativeEncoderDecoderModel.__module__ = __name__
  return SpeculativeEncoderDecoderModel


def __getattr__(name: str) -> Any:
  # PEP 562: t5x is imported when the model class is first asked for.
  if name == 'SpeculativeEncoderDecoderModel':
    cls = _model_class()
    globals()[name] = cls
    return cls
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
