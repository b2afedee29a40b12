"""The draft of a distilled pair: its shape and initialisation, the loss on the
target's decodes, and a resumable training loop that keeps the parameters of the best
validation loss.

The draft learns prompt + response sequences, cross-entropy on the response tokens
only (the prompt is context), optionally mixed with cross-entropy against the target's
top-k probabilities (`lm_decodes`' soft targets), or with a loss that is the acceptance
rate's complement (`OBJECTIVES`); AdamW with warm-up and cosine decay,
gradient clipping; validation on the held-out prompts' decodes, early stopping after
`patience` validations above the best.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import dataclasses
import functools
import json
import os
import time
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec import pretrained
from specdec.io.hf import load_hf_llama
from specdec.models import llama

from common import log

# Training sequences are padded to a multiple of this.
SEQUENCE_BUCKET = 64

# What the draft learns from the target's decodes (`TrainSettings.objective`):
# * 'sequence': cross-entropy on the target's tokens alone (sequence-level
#   distillation, Kim & Rush 2016), soft targets ignored;
# * 'kd': (1 - soft_weight) of it + soft_weight cross-entropy against the target's
#   top-k probabilities (token-level distillation, Hinton et al. 2015);
# * 'tv': (1 - soft_weight) of the first + soft_weight (1 - alpha), alpha = sum_x
#   min(p(x), q(x)) = 1 - TV(p, q) the acceptance rate of one draft token
#   (Leviathan et al. 2023, Corollary 3.6), over the target's top-k and the rest of
#   the vocabulary as one bucket (`top_k_acceptance`).
OBJECTIVES = ("sequence", "kd", "tv")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """How `train` trains (distill_lm.py's flags of the same names)."""

  batch_size: int = 32  # sequences per step
  train_steps: int = 600  # unless train_minutes > 0
  train_minutes: float = 0.0  # > 0: as many steps as fit, measured at the start
  learning_rate: float = 2e-3  # peak
  warmup_steps: int = 60  # linear warm-up
  weight_decay: float = 0.01  # AdamW
  embedding_init: str = "svd"  # 'svd' (the target's principal directions) or 'random'
  top_k: int = 32  # soft targets kept per position
  soft_weight: float = 0.5  # weight of the soft-target term (kd, tv)
  objective: str = "kd"  # one of OBJECTIVES
  eval_every: int = 100  # steps between validations
  patience: int = 2  # validations above the best before stopping (0: never)
  checkpoint_every: int = 50  # steps between checkpoints
  init_from: str = ""  # a draft directory to start from
  max_new_tokens: int = 96  # response positions per sequence
  seed: int = 0  # data order and initialisation

  def __post_init__(self):
    if self.embedding_init not in ("svd", "random"):
      raise ValueError(f"embedding_init: 'svd' or 'random', got {self.embedding_init!r}")
    if self.objective not in OBJECTIVES:
      raise ValueError(f"objective: one of {OBJECTIVES}, got {self.objective!r}")
    if not 0.0 <= self.soft_weight <= 1.0:
      raise ValueError(f"soft_weight: must be in [0, 1], got {self.soft_weight}")
    for name in ("batch_size", "eval_every", "checkpoint_every", "max_new_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


def candidate_config(name: str, vocab_size: int) -> llama.LlamaConfig:
  """'d<width>_l<layers>': heads of 64 (half as many key/value heads when even),
  SwiGLU width 3 d, the target's RoPE base and tied embedding."""
  width, layers = (int(part[1:]) for part in name.split("_"))
  heads = width // 64
  return llama.LlamaConfig(
    vocab_size=vocab_size,
    hidden_size=width,
    intermediate_size=3 * width,
    num_layers=layers,
    num_heads=heads,
    num_kv_heads=heads,
    rope_theta=100000.0,
    tie_word_embeddings=True,
  )


def svd_embedding(target_embedding: np.ndarray, width: int) -> np.ndarray:
  """The target's embedding [V, D] projected onto its top `width` principal
  directions (right singular vectors): the draft's inputs and tied output logits then
  start as the target's, restricted to the directions that carry most of them."""
  e = np.asarray(target_embedding, np.float32)
  # The right singular vectors are the eigenvectors of E^T E [D, D]: cheap at D=576.
  eigenvalues, vectors = np.linalg.eigh(e.T @ e)
  top = vectors[:, np.argsort(eigenvalues)[::-1][:width]]
  return e @ top


def init_draft_params(
  cfg: llama.LlamaConfig, target_params: Any, how: str, seed: int, ids: np.ndarray | None = None
) -> dict[str, Any]:
  """Random weights; with 'svd' the embedding from the target's (`svd_embedding`),
  with a shortlist `ids` its rows, then the mean of the other rows for OTHER."""
  params = jax.tree.map(np.asarray, llama.random_params(cfg, seed))
  if how == "svd":
    embedding = svd_embedding(target_params["token_embedder"]["embedding"], cfg.hidden_size)
    if ids is not None:
      off = np.ones((len(embedding),), bool)
      off[ids] = False
      embedding = np.concatenate([embedding[ids], embedding[off].mean(0)[None]])
    params["token_embedder"]["embedding"] = embedding
  return params


def warm_start_params(directory: str, cfg: llama.LlamaConfig) -> dict[str, Any]:
  """A shipped draft's parameters (float32) to train on from.

  Raises:
    ValueError: naming the directory, when its config is not `cfg`'s shape.
  """
  loaded_cfg, params = load_hf_llama(directory, dtype=jnp.float32)
  shape = lambda c: dataclasses.replace(c, dtype=jnp.float32, max_position_embeddings=1)
  if shape(loaded_cfg) != shape(cfg):
    raise ValueError(
      f"init_from: {directory} holds a {loaded_cfg}, not the "
      f"--draft_config / --shortlist shape {cfg}"
    )
  return jax.tree.map(np.asarray, params)


def warm_start_shortlist(directory: str) -> np.ndarray | None:
  """The shortlist ids of a shipped draft directory, or None where it has none."""
  path = os.path.join(directory, pretrained.SHORTLIST_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return np.asarray(json.load(f)["ids"], np.int32)


def warm_start_record(directory: str) -> dict[str, Any]:
  """What the model card says of the draft training started from: its directory and,
  from the pair.json beside it, how it was trained, on what, and its alpha."""
  record = dict(directory=os.path.abspath(directory))
  pair_file = os.path.join(os.path.dirname(os.path.abspath(directory)), "pair.json")
  if os.path.exists(pair_file):
    with open(pair_file) as f:
      old = json.load(f)
    training = dict(old.get("draft", {}).get("training", {}))
    training.pop("history", None)
    record.update(
      training=training,
      data=old.get("data", {}),
      teacher_forced_alpha=old.get("metrics", {}).get("teacher_forced_alpha"),
    )
  return record


def shortlist_ids(data: Sequence[tuple], size: int, keep: Sequence[int]) -> np.ndarray:
  """The `size` tokens most frequent in the training responses (ties by id), the
  ids of `keep` (EOS, padding) first."""
  counts = np.bincount(np.concatenate([e[1] for e in data]), minlength=max(keep) + 1)
  order = [int(i) for i in np.argsort(-counts, kind="stable") if counts[i] > 0]
  ids = list(dict.fromkeys([int(k) for k in keep] + order))[:size]
  return np.asarray(ids, np.int32)


def map_examples(data: Sequence[tuple], index: np.ndarray) -> list[tuple]:
  """Examples in shortlist ids (`specdec.drafts.shortlist.index_map`)."""
  return [
    (index[p], index[r], None if soft is None else (soft[0], index[soft[1]])) for p, r, soft in data
  ]


def final_hidden(cfg: llama.LlamaConfig, params: Any, tokens: jax.Array) -> jax.Array:
  """The normed last hidden states [B, L, d] of the full causal forward pass. The
  output layer it also computes is unused and removed by XLA under jit."""
  _, state = llama.Transformer(cfg).apply(
    {"params": params},
    tokens,
    mutable=["intermediates"],
    capture_intermediates=lambda module, method: module.name == "final_norm",
  )
  return state["intermediates"]["final_norm"]["__call__"][0]


def response_logits(
  cfg: llama.LlamaConfig, params: Any, tokens: jax.Array, starts: jax.Array, length: int
) -> jax.Array:
  """float32 logits [B, R] at the positions that predict the response tokens."""
  hidden = final_hidden(cfg, params, tokens)
  positions = starts[:, None] + jnp.arange(length)[None, :]
  positions = jnp.minimum(positions, tokens.shape[1] - 1)
  picked = jnp.take_along_axis(hidden, positions[:, :, None], axis=1)
  return llama.output_logits_tied(picked, params["token_embedder"]["embedding"], cfg.dtype)


def top_k_acceptance(
  log_q: jax.Array, soft_log_probs: jax.Array, soft_ids: jax.Array, listed: int | None = None
) -> jax.Array:
  """alpha = sum_x min(p(x), q(x)) per position (Leviathan et al. 2023, Corollary
  3.6: alpha = 1 - TV(p, q)), with p known on the target's top-k ids only: those ids
  count one by one, every other token as one bucket (mass 1 - sum of the top-k, in p
  and in q). Merging tokens can only raise sum min, so this bounds the true alpha
  from above, and equals it where the top-k hold all of p's mass.

  Args:
    log_q: float32 [..., V] the draft's log-probabilities.
    soft_log_probs: [..., k] the target's top-k log-probabilities.
    soft_ids: int32 [..., k] their ids in the draft's vocabulary.
    listed: with a shortlist draft, its list size: ids >= it (the draft's OTHER id,
      where off-list tokens map) join the bucket instead of counting one by one.
  Returns:
    float32 [...], alpha in [0, 1].
  """
  p = jnp.exp(soft_log_probs.astype(jnp.float32))
  q = jnp.exp(jnp.take_along_axis(log_q, soft_ids, axis=-1))
  if listed is not None:
    on = (soft_ids < listed).astype(jnp.float32)
    p, q = p * on, q * on
  p_rest = jnp.clip(1.0 - jnp.sum(p, axis=-1), 0.0, 1.0)
  q_rest = jnp.clip(1.0 - jnp.sum(q, axis=-1), 0.0, 1.0)
  return jnp.sum(jnp.minimum(p, q), axis=-1) + jnp.minimum(p_rest, q_rest)


def distill_loss(
  cfg: llama.LlamaConfig,
  params: Any,
  batch: dict[str, jax.Array],
  soft_weight: float,
  objective: str = "kd",
  listed: int | None = None,
) -> jax.Array:
  """(1 - w) cross-entropy on the target's tokens + w times the soft term (on rows
  that have soft targets; hard only elsewhere), per response token. The soft term:
  cross-entropy against the target's top-k probabilities ('kd'), or 1 - alpha
  (`top_k_acceptance`, 'tv'); `listed` as there."""
  logits = response_logits(cfg, params, batch["tokens"], batch["starts"], batch["labels"].shape[1])
  log_q = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  mask = batch["mask"]
  hard = -jnp.take_along_axis(log_q, batch["labels"][..., None], axis=-1)[..., 0]
  if objective == "tv":
    soft = 1.0 - top_k_acceptance(log_q, batch["soft_log_probs"], batch["soft_ids"], listed)
  elif objective == "kd":
    p = jnp.exp(batch["soft_log_probs"].astype(jnp.float32))
    soft = -jnp.sum(p * jnp.take_along_axis(log_q, batch["soft_ids"], axis=-1), axis=-1)
  else:
    raise ValueError(f"objective: 'kd' or 'tv' with soft targets, got {objective!r}")
  w = soft_weight * batch["has_soft"][:, None]
  per_token = (1 - w) * hard + w * soft
  return jnp.sum(per_token * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def response_loss(
  cfg: llama.LlamaConfig,
  params: Any,
  tokens: jax.Array,
  starts: jax.Array,
  labels: jax.Array,
  mask: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """(mean cross-entropy, weight) of the response tokens only.

  Args:
    tokens: int32[B, L], prompt then response then padding.
    starts: int32[B], the position whose output predicts the first response token
      (the prompt's length minus one).
    labels: int32[B, R], the response tokens (padded).
    mask: float32[B, R], 1 on real response tokens.
  """
  hidden = final_hidden(cfg, params, tokens)
  positions = starts[:, None] + jnp.arange(labels.shape[1])[None, :]
  positions = jnp.minimum(positions, tokens.shape[1] - 1)
  picked = jnp.take_along_axis(hidden, positions[:, :, None], axis=1)
  logits = llama.output_logits_tied(picked, params["token_embedder"]["embedding"], cfg.dtype)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  weight = jnp.sum(mask)
  return jnp.sum(ce * mask) / jnp.maximum(weight, 1.0), weight


def pack(
  batch: Sequence[tuple], response_length: int, pad_id: int, top_k: int = 0
) -> dict[str, np.ndarray]:
  """Sequences [B, L] (L a multiple of SEQUENCE_BUCKET), starts, labels, mask, and
  with `top_k` the soft targets [B, R, k] and has_soft [B]."""
  longest = max(len(e[0]) + len(e[1]) for e in batch)
  width = -(-longest // SEQUENCE_BUCKET) * SEQUENCE_BUCKET
  tokens = np.full((len(batch), width), pad_id, np.int32)
  labels = np.zeros((len(batch), response_length), np.int32)
  mask = np.zeros((len(batch), response_length), np.float32)
  starts = np.zeros((len(batch),), np.int32)
  soft_lp = np.full((len(batch), response_length, top_k), -1e4, np.float16)
  soft_ids = np.zeros((len(batch), response_length, top_k), np.int32)
  has_soft = np.zeros((len(batch),), np.float32)
  for i, (prompt, response, *rest) in enumerate(batch):
    sequence = np.concatenate([prompt, response])
    tokens[i, : len(sequence)] = sequence
    starts[i] = len(prompt) - 1
    labels[i, : len(response)] = response
    mask[i, : len(response)] = 1.0
    if top_k and rest and rest[0] is not None:
      lp, ids = rest[0]
      soft_lp[i, : len(response)] = lp[:, :top_k]
      soft_ids[i, : len(response)] = ids[:, :top_k]
      has_soft[i] = 1.0
  out = dict(tokens=tokens, starts=starts, labels=labels, mask=mask)
  if top_k:
    out.update(soft_log_probs=soft_lp, soft_ids=soft_ids, has_soft=has_soft)
  return out


def training_batches(
  data: Sequence[tuple],
  batch: int,
  seed: int,
  first_step: int,
  response_length: int,
  pad_id: int,
  top_k: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
  """Endless shuffled batches (a fresh permutation each epoch, fixed by `seed`);
  batches are drawn from groups of similar length so that padding stays small, and
  the stream resumes at `first_step`."""
  per_epoch = len(data) // batch
  step = 0
  epoch = 0
  while True:
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(data))
    # Sort within windows of 8 batches by length, then shuffle the batches.
    window = 8 * batch
    groups = []
    for start in range(0, per_epoch * batch, window):
      chunk = sorted(order[start : start + window], key=lambda i: len(data[i][0]) + len(data[i][1]))
      groups += [chunk[j : j + batch] for j in range(0, len(chunk) - batch + 1, batch)]
    for g in rng.permutation(len(groups)):
      if step >= first_step:
        yield pack([data[i] for i in groups[g]], response_length, pad_id, top_k)
      step += 1
    epoch += 1


def optimizer(steps: int, learning_rate: float, warmup: int, weight_decay: float):
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, learning_rate, warmup, steps, end_value=learning_rate * 0.05
  )
  return optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=weight_decay),
  )


def make_step(
  cfg: llama.LlamaConfig,
  tx,
  soft_weight: float,
  top_k: int,
  objective: str = "kd",
  listed: int | None = None,
):
  """One jit-compiled AdamW step of `objective`'s loss (plain cross-entropy where
  `top_k` is 0: no soft targets, or 'sequence')."""

  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(p):
      if top_k:
        return distill_loss(cfg, p, batch, soft_weight, objective, listed)
      return response_loss(
        cfg, p, batch["tokens"], batch["starts"], batch["labels"], batch["mask"]
      )[0]

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


@functools.partial(jax.jit, static_argnums=0)
def _validation_step(cfg, params, b):
  return response_loss(cfg, params, b["tokens"], b["starts"], b["labels"], b["mask"])


def validation_loss(cfg, params, data, response_length: int, pad_id: int, batch: int = 32) -> float:
  """Token-weighted mean cross-entropy of the draft on `data`'s responses."""
  total = weight = 0.0
  for start in range(0, len(data), batch):
    b = pack(data[start : start + batch], response_length, pad_id)
    loss, w = _validation_step(cfg, params, b)
    total += float(loss) * float(w)
    weight += float(w)
  return total / max(weight, 1.0)


def steps_for_minutes(
  cfg, params, data, pad_id: int, top_k: int, s: TrainSettings, listed: int | None = None
) -> int:
  """Training steps that fit `minutes`, from the time of a few steps on typical
  batches (after compilation; a tenth of the budget kept for compilations of other
  widths and validation). The steps' results are discarded."""
  minutes = s.train_minutes
  tx = optimizer(100, s.learning_rate, s.warmup_steps, s.weight_decay)
  step_fn = make_step(cfg, tx, s.soft_weight, top_k, s.objective, listed)
  batches = training_batches(data, s.batch_size, s.seed + 1, 0, s.max_new_tokens, pad_id, top_k)
  batch = next(batches)
  opt_state = tx.init(params)
  jax.block_until_ready(step_fn(params, opt_state, batch))  # compiles
  start = time.perf_counter()
  for _ in range(3):
    jax.block_until_ready(step_fn(params, opt_state, batch))
  seconds = (time.perf_counter() - start) / 3
  steps = max(int(0.9 * 60 * minutes / seconds), 1)
  log(
    f"{seconds:.2f} s per step (width {batch['tokens'].shape[1]}): {steps} steps in {minutes} min"
  )
  return steps


def train(
  cfg,
  target_params,
  data,
  validation,
  out_dir: str,
  pad_id: int,
  s: TrainSettings,
  ids: np.ndarray | None = None,
) -> dict[str, Any]:
  """Trains the draft; resumes from out_dir/train/state.msgpack; returns a summary.

  Args:
    cfg: the draft's `llama.LlamaConfig`.
    target_params: the target's parameters (its embedding initialises the draft's).
    data, validation: `lm_decodes.examples` (in shortlist ids where `ids` is given).
    pad_id: the padding id of `data`'s ids.
    s: the settings.
    ids: the shortlist (`shortlist_ids`), or None for the whole vocabulary.
  """
  directory = os.path.join(out_dir, "train")
  os.makedirs(directory, exist_ok=True)
  state_file = os.path.join(directory, "state.msgpack")
  history_file = os.path.join(directory, "history.json")
  response_length = s.max_new_tokens
  has_soft = any(e[2] is not None for e in data)
  if s.objective == "tv" and not has_soft:
    raise ValueError(
      "objective: 'tv' needs soft targets (the `soft` stage); none of the training data has them"
    )
  top_k = s.top_k if has_soft and s.objective != "sequence" else 0
  listed = None if ids is None else len(ids)
  log(
    f"{sum(e[2] is not None for e in data)} of {len(data)} sequences have soft "
    f"targets; objective {s.objective}, top_k {top_k}, soft weight {s.soft_weight}"
  )
  if s.init_from:
    params = warm_start_params(s.init_from, cfg)
    log(f"parameters from {s.init_from}")
  else:
    params = init_draft_params(cfg, target_params, s.embedding_init, s.seed, ids)
  params = jax.tree.map(jnp.asarray, params)
  steps = s.train_steps
  steps_file = os.path.join(directory, "steps.json")
  if os.path.exists(steps_file):
    with open(steps_file) as f:
      steps = json.load(f)["steps"]
  elif s.train_minutes > 0:
    steps = steps_for_minutes(cfg, params, data, pad_id, top_k, s, listed)
  with open(steps_file, "w") as f:
    json.dump(dict(steps=steps), f)
  planned_steps = steps
  tx = optimizer(steps, s.learning_rate, s.warmup_steps, s.weight_decay)
  opt_state = tx.init(params)
  state = dict(params=params, opt_state=opt_state, step=0, seconds=0.0)
  history = []
  if os.path.exists(state_file):
    with open(state_file, "rb") as f:
      state = flax.serialization.from_bytes(state, f.read())
    with open(history_file) as f:
      history = json.load(f)
    log(f"resumed at step {int(state['step'])}")
  params, opt_state = state["params"], state["opt_state"]
  first = int(state["step"])
  seconds = float(state["seconds"])
  step_fn = make_step(cfg, tx, s.soft_weight, top_k, s.objective, listed)
  batches = training_batches(data, s.batch_size, s.seed, first, response_length, pad_id, top_k)
  if first == 0:
    val = validation_loss(cfg, params, validation, response_length, pad_id)
    history.append(dict(step=0, val_loss=val, seconds=0.0))
    log(f"step 0: validation loss {val:.3f}")
    save_if_best(directory, history, params)
  losses = []
  started = time.perf_counter() - seconds
  for step in range(first + 1, steps + 1):
    params, opt_state, loss = step_fn(params, opt_state, next(batches))
    losses.append(float(loss))
    if step % 10 == 0:
      log(
        f"step {step}/{steps}: train loss {np.mean(losses[-10:]):.3f} "
        f"({time.perf_counter() - started:.0f} s)"
      )
    if step % s.eval_every == 0 or step == steps:
      val = validation_loss(cfg, params, validation, response_length, pad_id)
      history.append(
        dict(
          step=step,
          train_loss=float(np.mean(losses[-50:])),
          val_loss=val,
          seconds=time.perf_counter() - started,
        )
      )
      log(f"step {step}: validation loss {val:.3f}")
      save_if_best(directory, history, params)
      if stopped(history, s.patience):
        log(
          f"step {step}: validation loss above its best for {s.patience} "
          "validations in a row; stopping"
        )
        steps = step
    if step % s.checkpoint_every == 0 or step == steps:
      state = dict(
        params=params, opt_state=opt_state, step=step, seconds=time.perf_counter() - started
      )
      with open(state_file + ".tmp", "wb") as f:
        f.write(flax.serialization.to_bytes(state))
      os.replace(state_file + ".tmp", state_file)
      with open(history_file, "w") as f:
        json.dump(history, f, indent=1)
    if step == steps:
      break
  return finish_training(directory, history, planned_steps, data, top_k, s)


# The parameters of the lowest validation loss so far; params.msgpack at the end.
BEST_PARAMS = "best_params.msgpack"


def save_if_best(directory: str, history: Sequence[dict[str, Any]], params: Any) -> None:
  """Writes `params` to BEST_PARAMS when the last validation is the best so far."""
  if history[-1]["val_loss"] <= min(h["val_loss"] for h in history):
    path = os.path.join(directory, BEST_PARAMS)
    with open(path + ".tmp", "wb") as f:
      f.write(flax.serialization.to_bytes(jax.tree.map(np.asarray, params)))
    os.replace(path + ".tmp", path)


def stopped(history: Sequence[dict[str, Any]], patience: int) -> bool:
  """True when the last `patience` validations are all above the best before them."""
  if patience < 1 or len(history) <= patience:
    return False
  best_before = min(h["val_loss"] for h in history[:-patience])
  return all(h["val_loss"] > best_before for h in history[-patience:])


def finish_training(
  directory: str,
  history: Sequence[dict[str, Any]],
  planned_steps: int,
  data: Sequence[tuple],
  top_k: int,
  s: TrainSettings,
) -> dict[str, Any]:
  """params.msgpack = the parameters of the best validation (BEST_PARAMS; absent
  when a finished run is resumed: moved already); the training summary."""
  best_path = os.path.join(directory, BEST_PARAMS)
  if os.path.exists(best_path):
    os.replace(best_path, os.path.join(directory, "params.msgpack"))
  best = min(history, key=lambda h: h["val_loss"])
  steps = best["step"]
  return dict(
    steps=steps,
    planned_steps=planned_steps,
    stopped_at=history[-1]["step"],
    batch_size=s.batch_size,
    learning_rate=s.learning_rate,
    warmup_steps=s.warmup_steps,
    weight_decay=s.weight_decay,
    embedding_init=s.embedding_init,
    objective=s.objective,
    soft_targets=dict(
      sequences=sum(e[2] is not None for e in data),
      top_k=top_k,
      weight=s.soft_weight if top_k else 0.0,
    ),
    sequences=len(data),
    response_tokens=sum(len(e[1]) for e in data),
    epochs=round(steps * s.batch_size / len(data), 2),
    minutes=round(best["seconds"] / 60, 1),
    final_val_loss=best["val_loss"],
    history=list(history),
  )
