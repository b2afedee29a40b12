"""A draft that reads the target's features: one decoder layer over the target's
last hidden states (EAGLE: Li, Wei, Zhang & Zhang, "EAGLE: Speculative Sampling
Requires Rethinking Feature Uncertainty", ICML 2024).

Algorithm 1 of Leviathan et al. (2023) is lossless for *any* draft distribution q
(Appendix A.1), so q may depend on anything the target has already computed. The
target scores gamma + 1 positions per iteration anyway; its normed last hidden state
h_t at each (the vector its output layer reads, "the feature") summarises the whole
prefix. A feature draft predicts the next feature from the previous one and the
token just committed:

    g_t = norm(layer(fc([embed(x_t); f_{t-1}])))      logits_t = head(g_t)

where f_{t-1} is the target's feature h_{t-1} where the target has computed it and
the draft's own g_{t-1} for the positions it is drafting ahead. `layer` is one
Llama decoder layer at the target's width with its own key/value cache, `embed` is
the target's token embedding (shared, not copied), and `head` is the target's tied
output layer restricted to a shortlist of N ids (`specdec.drafts.shortlist`): q is
zero off the list, which Algorithm 1 allows.

Parameter tree (T5X-style names, float32 or bfloat16 leaves):

    fc/kernel [2d, d]                 the [embedding; feature] -> d projection
    layer/...                         one `llama.DecoderLayer` (pre_attention_norm,
                                      attention/{query,key,value,out}, pre_mlp_norm,
                                      mlp/{wi_0,wi_1,wo})
    norm/scale [d]                    the RMSNorm of the predicted feature
    head/embedding [N, d]             the target's output rows of the shortlist ids

The sampler (`specdec.sample.speculative_sample`) drives a feature draft when the
draft has `reads_target_features`: the target must then provide
`init_with_features` and `extend_with_features` (`llama.Llama` does).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from flax import linen as nn
import flax.struct
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from specdec import _optional
from specdec.backends import cpu
from specdec.drafts import shortlist
from specdec.models import base, llama

Array = jax.Array


class FeatureLayer(nn.Module):
  """fc -> one decoder layer (cached) -> norm -> shortlist head."""

  config: llama.LlamaConfig
  num_ids: int

  def setup(self):
    cfg = self.config
    self.fc = llama.Dense(cfg.hidden_size, ("mlp", "embed"), cfg.dtype)
    self.layer = llama.DecoderLayer(cfg)
    self.norm = llama.RMSNorm(cfg.rms_norm_eps, cfg.dtype)
    self.head = llama.Embed(self.num_ids, cfg.hidden_size, cfg.dtype)

  def __call__(self, embedded: Array, features: Array) -> tuple[Array, Array]:
    """The full causal pass (training): embedded, features [B, L, d] -> (shortlist
    logits [B, L, N] float32, predicted features [B, L, d])."""
    cfg = self.config
    batch, length = embedded.shape[:2]
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    assert cfg.head_dim is not None  # LlamaConfig.__post_init__ resolves it
    cos, sin = llama.rope_angles(positions, cfg.head_dim, cfg.rope_theta)
    visible = jnp.tril(jnp.ones((length, length), jnp.bool_))
    x = self.fc(jnp.concatenate([embedded, features], axis=-1))
    g = self.norm(self.layer(x, cos, sin, visible))
    return self.head.attend(g), g

  def extend(
    self, embedded: Array, features: Array, lengths: Array, cache: tuple[Array, Array]
  ) -> tuple[Array, Array, tuple[Array, Array]]:
    """A chunk [B, k, d] at positions lengths[b].. against the layer's cache
    [B, T, KV, hd]: (shortlist logits [B, k, N], predicted features [B, k, d],
    the cache with the chunk written)."""
    cfg = self.config
    capacity = cache[0].shape[1]
    positions = lengths[:, None] + jnp.arange(embedded.shape[1])
    assert cfg.head_dim is not None  # LlamaConfig.__post_init__ resolves it
    cos, sin = llama.rope_angles(positions, cfg.head_dim, cfg.rope_theta)
    visible = (jnp.arange(capacity)[None, None, :] <= positions[:, :, None])[:, None, None]
    x = self.fc(jnp.concatenate([embedded, features.astype(embedded.dtype)], axis=-1))
    y, cache = self.layer.extend(x, cos, sin, cache, lengths, visible)
    g = self.norm(y)
    return self.head.attend(g), g, cache


def init_params(cfg: llama.LlamaConfig, num_ids: int, rng: Array) -> dict[str, Any]:
  """Random parameters of `FeatureLayer` (float32)."""
  d = cfg.hidden_size
  return FeatureLayer(cfg, num_ids).init(rng, jnp.zeros((1, 2, d)), jnp.zeros((1, 2, d)))["params"]


def output_rows(target: llama.Llama, ids: ArrayLike) -> np.ndarray:
  """float32[N, d]: the target's output-layer rows of `ids` (its tied embedding's
  rows, or the columns of its untied `logits_dense` kernel), the draft's head."""
  p = target.params
  if target.config.tie_word_embeddings:
    rows = np.asarray(p["token_embedder"]["embedding"], np.float32)
  else:
    rows = np.asarray(p["logits_dense"]["kernel"], np.float32).T
  return rows[np.asarray(ids)]


def from_target(target: llama.Llama, params: Any, ids: ArrayLike) -> FeatureDraft:
  """The draft of trained `params` (fc, layer, norm; a `head` entry is replaced)
  reading `target`'s features, with the target's embedding and output rows of `ids`
  as its input side and head: nothing of the target is stored with the draft."""
  params = dict(params, head={"embedding": jnp.asarray(output_rows(target, ids))})
  return FeatureDraft.create(
    target.config, params, target.params["token_embedder"]["embedding"], ids, pad_id=target.pad_id
  )


def decode_matrices(params: Any) -> dict[str, tuple[Array, bool]]:
  """{path: (matrix, transposed)} of every matrix a step reads (`cpu.pack_tree`)."""
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  matrices = {k: (v, False) for k, v in flat.items() if k.endswith("/kernel")}
  matrices["head/embedding"] = (flat["head/embedding"], True)
  return matrices


@flax.struct.dataclass
class FeatureDraftState:
  """Decode state of `FeatureDraft`: the layer's cache (key, value) [B, T, KV, hd]
  and the tokens fed per row."""

  cache: tuple[Array, Array]
  lengths: Array


@flax.struct.dataclass
class FeatureDraft:
  """A draft over the target's vocabulary V that reads the target's features.

  Positions follow `llama.Llama` (right-padded ragged prompts with `pad_id`): the
  token at position i is fed with the feature of position i - 1 (zeros at i = 0).

  Attributes:
    config: the target's `LlamaConfig` (static; its width and heads are the layer's).
    params: the module docstring's tree.
    embedding: the target's token embedding [V, d] (the input side).
    ids: int32[N], the full-vocabulary id of each head row.
    pad_id: (static) the prompts' right-padding id, or None.
    packed: None, or the `cpu.pack_tree` copy of `decode_matrices(params)`.
  """

  config: llama.LlamaConfig = flax.struct.field(pytree_node=False)
  params: Any
  embedding: Any
  ids: Any
  pad_id: int | None = flax.struct.field(pytree_node=False, default=None)
  packed: Any = None

  reads_target_features = True

  @classmethod
  def create(
    cls,
    config: llama.LlamaConfig,
    params: Any,
    embedding: Any,
    ids: ArrayLike,
    pad_id: int | None = None,
  ) -> FeatureDraft:
    """Checks shapes and builds. Raises ValueError naming the mismatched argument."""
    ids = np.asarray(ids)
    vocab, width = np.shape(embedding)
    shortlist.index_map(ids, vocab)  # checks the ids
    if width != config.hidden_size or vocab != config.vocab_size:
      raise ValueError(
        f"embedding: expected [{config.vocab_size}, "
        f"{config.hidden_size}] (the target's), got {np.shape(embedding)}"
      )
    head = np.shape(params["head"]["embedding"])
    if head != (len(ids), width):
      raise ValueError(
        f"params: head/embedding is {head}, expected ({len(ids)}, {width}) for {len(ids)} ids"
      )
    fc = np.shape(params["fc"]["kernel"])
    if fc != (2 * width, width):
      raise ValueError(f"params: fc/kernel is {fc}, expected ({2 * width}, {width})")
    return cls(
      config=config,
      params=params,
      embedding=embedding,
      ids=jnp.asarray(ids.astype(np.int32)),
      pad_id=pad_id,
    )

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def feature_size(self) -> int:
    return self.config.hidden_size

  def with_packed_weights(self) -> FeatureDraft:
    """This draft with its matrices packed for `specdec.backends.cpu` where enabled
    (bfloat16 packs where bfloat16 holds every weight exactly)."""
    if self.packed is not None or not cpu.enabled():
      return self
    if jnp.dtype(self.config.dtype) != jnp.float32:
      return self
    return dataclasses.replace(self, packed=cpu.pack_tree(decode_matrices(self.params)))

  def _prompt(self) -> llama.Llama:
    # Prompt lengths and start tokens depend on the vocabulary and pad_id only: the
    # target's rules, applied through a Llama whose network is never run.
    return llama.Llama(self.config, self.params, pad_id=self.pad_id)

  def start_tokens(self, inputs: Array) -> Array:
    return llama.Llama.start_tokens(self._prompt(), inputs)

  def _apply(self, tokens: Array, features: Array, lengths: Array, cache: tuple[Array, Array]):
    variables = {"params": self.params}
    if self.packed is not None:
      variables[cpu.PACKED] = self.packed
    embedded = jnp.take(jnp.asarray(self.embedding, self.config.dtype), tokens, axis=0, mode="clip")
    module = FeatureLayer(self.config, int(self.ids.shape[0]))
    logits, g, cache = module.apply(  # type: ignore[misc]  # flax: Any | tuple; a 3-tuple
      variables, embedded, features, lengths, cache, method=FeatureLayer.extend
    )
    return shortlist.expand_logits(logits, self.ids, self.vocab_size), g, cache

  def init(self, inputs: Array, max_length: int, features: Array) -> FeatureDraftState:
    """Feeds each row's prompt minus its last token, paired with `features` [B, S - 1,
    d] (the target's features of those positions, `llama.Llama.init_with_features`),
    shifted by one; allocates S - 1 + max_length positions."""
    prompt_lengths = llama.Llama.prompt_lengths(self._prompt(), inputs)
    cfg = self.config
    batch, length = inputs.shape
    capacity = llama.cache_capacity(cfg, length, max_length)
    if features.shape != (batch, length - 1, cfg.hidden_size):
      raise ValueError(
        f"features: expected {(batch, length - 1, cfg.hidden_size)} "
        f"(the target's features of inputs[:, :-1]), got {features.shape}"
      )
    shape = (batch, capacity, cfg.num_kv_heads, cfg.head_dim)
    cache = (jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype))
    if length > 1:
      previous = jnp.concatenate([jnp.zeros_like(features[:, :1]), features[:, :-1]], axis=1)
      _, _, cache = self._apply(
        jnp.asarray(inputs)[:, :-1], previous, jnp.zeros((batch,), jnp.int32), cache
      )
    return FeatureDraftState(cache=cache, lengths=prompt_lengths - 1)

  def extend(
    self, state: FeatureDraftState, tokens: Array, features: Array
  ) -> tuple[Array, Array, FeatureDraftState]:
    """tokens int[B, k], each with the feature of the position before it [B, k, d] ->
    (float32 logits [B, k, V], predicted features [B, k, d], state advanced by k)."""
    base.check_tokens("tokens", tokens, self.vocab_size)
    base.check_chunk(tokens, *state.cache[0].shape[:2])
    logits, g, cache = self._apply(jnp.asarray(tokens), features, state.lengths, state.cache)
    return logits, g, FeatureDraftState(cache=cache, lengths=state.lengths + tokens.shape[1])

  def rewind(self, state: FeatureDraftState, lengths: Array) -> FeatureDraftState:
    return dataclasses.replace(state, lengths=base.rewound(state.lengths, lengths))

  def lengths(self, state: FeatureDraftState) -> Array:
    return state.lengths


WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "feature_draft.json"


def save(directory: str, params: Any, ids: ArrayLike, dtype: Any = jnp.bfloat16) -> None:
  """Writes the trained fc, layer and norm (`head` is the target's, not stored) in
  `dtype` as safetensors, and the head's ids, to `directory`."""
  safetensors_flax = _optional.require("safetensors.flax", "lm", purpose="writing a feature draft")
  os.makedirs(directory, exist_ok=True)
  flat = flax.traverse_util.flatten_dict({k: v for k, v in params.items() if k != "head"}, sep="/")
  safetensors_flax.save_file(
    {k: jnp.asarray(v, dtype) for k, v in flat.items()}, os.path.join(directory, WEIGHTS_FILE)
  )
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump({"ids": [int(i) for i in np.asarray(ids)]}, f)


def load(directory: str, target: llama.Llama) -> FeatureDraft:
  """The feature draft `save` wrote, for `target` (float32 weights; its embedding
  and output rows). Raises ValueError naming a missing or malformed file."""
  safetensors_flax = _optional.require("safetensors.flax", "lm", purpose="reading a feature draft")
  weights, config = (os.path.join(directory, n) for n in (WEIGHTS_FILE, CONFIG_FILE))
  for path in (weights, config):
    if not os.path.exists(path):
      raise ValueError(f"directory: {directory} has no {os.path.basename(path)}")
  try:
    flat = safetensors_flax.load_file(weights)
    with open(config) as f:
      ids = json.load(f)["ids"]
  except Exception as e:
    raise ValueError(f"directory: malformed feature draft in {directory}: {e}") from e
  params = flax.traverse_util.unflatten_dict(
    {k: jnp.asarray(v, jnp.float32) for k, v in flat.items()}, sep="/"
  )
  expected = jax.eval_shape(lambda: init_params(target.config, len(ids), jax.random.key(0)))
  expected = {k: v for k, v in expected.items() if k != "head"}
  got = jax.tree.map(lambda a: a.shape, params)
  want = jax.tree.map(lambda a: a.shape, expected)
  if got != want:
    raise ValueError(
      f"directory: {directory} holds parameters of the wrong shapes for "
      f"this target: {got} against {want}"
    )
  return from_target(target, params, ids)
