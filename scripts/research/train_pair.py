"""Trains the embedded default pair: a T5 v1.1 target and a much smaller draft.

    python scripts/research/train_pair.py --out_dir=out/train_pair [--which=draft,target]

English->German on Multi30k (train 29k pairs, validation 1014), T5's SentencePiece
vocabulary and T5's task prefix ("translate English to German: "), both models from
scratch with the same data, optimizer and seed. Seeded and reproducible (the data
order and the initialisation depend on --training_seed only), with a progress bar, periodic
validation loss, and resumable checkpoints: rerunning the same command continues from
the last saved step. At the end each model's parameters are exported in bfloat16 in
the T5X checkpoint layout that `specdec.io.load_t5x` reads.

The draft can instead be distilled from the target (`--draft_data=distill`,
sequence-level knowledge distillation, Kim & Rush 2016): the target decodes every
training source greedily (batched, `specdec.autoregressive_sample`) and the draft is
trained on those outputs in place of the references, so that it learns to predict
what the target says rather than what the references say, which is what acceptance
rewards. The teacher is the shipped pair's target unless --teacher_checkpoint names
one; its outputs are cached in --out_dir, so a resumed run does not decode again.

Sizes (see `PRESETS`) are chosen for two CPU cores: the 32128-token vocabulary
dominates both the cost and the size, so the target is narrow but deep enough to
translate, and the draft is narrower and shallower still so that one draft step costs
a small fraction of a target step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import dataclasses
import json
import os
import time

from absl import app, flags, logging
import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec import sample
from specdec.bench.cli import write_json
from specdec.distributions import SamplingConfig
from specdec.io.t5x import load_t5x, save_t5x
from specdec.models import t5

PREFIX = "translate English to German: "
EOS_ID = 1
PAD_ID = 0

# Both v1.1 (gated GELU, untied logits), float32 for training on a CPU.
PRESETS = {
  "target": t5.T5Config(
    vocab_size=t5.T5_VOCAB_SIZE,
    dtype=jnp.float32,
    emb_dim=256,
    num_heads=4,
    head_dim=64,
    mlp_dim=1024,
    num_encoder_layers=3,
    num_decoder_layers=3,
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.1,
    logits_via_embedding=False,
  ),
  "draft": t5.T5Config(
    vocab_size=t5.T5_VOCAB_SIZE,
    dtype=jnp.float32,
    emb_dim=32,
    num_heads=2,
    head_dim=16,
    mlp_dim=128,
    num_encoder_layers=2,
    num_decoder_layers=1,
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.0,
    logits_via_embedding=False,
  ),
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Optimisation settings shared by both models."""

  batch_size: int = 64
  epochs: float = 1.0
  learning_rate: float = 2e-3
  warmup_steps: int = 200
  label_smoothing: float = 0.0
  ema_decay: float = 0.0  # 0: no average; else the exported weights are this EMA.
  optimizer: str = "adamw"  # or "adafactor"
  embedding_std: float = 1.0  # token embeddings' initial scale (T5: N(0, 1))
  # "full": the loss normalizes over the whole vocabulary; "train": over the tokens the
  # training targets hold (a shortlist; see `output_vocabulary`).
  output_vocab: str = "full"
  # With output_vocab "train": every this many steps one runs over the full vocabulary
  # (0: none), which keeps the other columns' logits down and pins the level of the
  # shortlist's (a softmax over the shortlist alone is blind to a shift of all of them).
  full_vocab_every: int = 4
  init_from: str = ""  # a train_state.msgpack to start from (a second phase)
  # Train in a parametrization where every matrix starts at the same scale, ~1/sqrt(fan
  # in) (`multipliers`): AdamW's absolute steps then move each by the same fraction.
  reparam: bool = False
  max_input_length: int = 48
  max_target_length: int = 48
  eval_every: int = 100
  eval_examples: int = 512
  checkpoint_every: int = 100
  seed: int = 0


# ------------------------------------------------------------------------------- data


def read_pairs(src_path: str, tgt_path: str) -> list[tuple[str, str]]:
  """Line-aligned (English, German) pairs, dropping pairs with an empty side."""
  with open(src_path, encoding="utf-8") as f_src, open(tgt_path, encoding="utf-8") as f_tgt:
    src, tgt = f_src.read().splitlines(), f_tgt.read().splitlines()
  if len(src) != len(tgt):
    raise ValueError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}")
  return [(s.strip(), t.strip()) for s, t in zip(src, tgt) if s.strip() and t.strip()]


def encode_pairs(
  pairs: Sequence[tuple[str, str]], vocab, max_input: int, max_target: int
) -> list[tuple[np.ndarray, np.ndarray]]:
  """SentencePiece ids with the task prefix on inputs and EOS on both, truncated."""
  inputs = vocab.encode([PREFIX + s for s, _ in pairs])
  targets = vocab.encode([t for _, t in pairs])
  return [
    (
      np.asarray(i[: max_input - 1] + [EOS_ID], np.int32),
      np.asarray(t[: max_target - 1] + [EOS_ID], np.int32),
    )
    for i, t in zip(inputs, targets)
  ]


def _pad(rows: Sequence[np.ndarray], multiple: int = 8) -> np.ndarray:
  """Right-pads rows with 0 to the longest, rounded up to `multiple` (few shapes)."""
  width = -(-max(len(r) for r in rows) // multiple) * multiple
  out = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    out[i, : len(r)] = r
  return out


def make_batch(examples: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
  """T5X's feature names: decoder inputs are the targets shifted right by one."""
  inputs = _pad([e[0] for e in examples])
  targets = _pad([e[1] for e in examples])
  decoder_inputs = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
  return dict(
    encoder_input_tokens=inputs, decoder_input_tokens=decoder_inputs, decoder_target_tokens=targets
  )


def epoch_batches(
  examples, batch_size: int, seed: int, epoch: int, window: int = 32
) -> list[list[int]]:
  """One epoch's batches of example indices, length-bucketed, seeded by (seed, epoch).

  The permuted examples are cut into windows of `window` batches; each window is
  sorted by length before being cut into batches, so a batch pads to its own longest
  sentence and not the corpus's; then the batch order is shuffled.
  """
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(examples))
  span = batch_size * window
  result = []
  for start in range(0, len(order) - batch_size + 1, span):
    chunk = order[start : start + span]
    chunk = chunk[
      np.argsort([len(examples[i][1]) + len(examples[i][0]) for i in chunk], kind="stable")
    ]
    result += [
      list(chunk[i : i + batch_size]) for i in range(0, len(chunk) - batch_size + 1, batch_size)
    ]
  rng.shuffle(result)
  return result


def batches(
  examples, batch_size: int, seed: int, start_step: int = 0
) -> Iterator[dict[str, np.ndarray]]:
  """Endless batches, epoch after epoch, starting at global step `start_step`."""
  epoch, offset = None, 0
  plan: list[list[int]] = []
  step = start_step
  while True:
    if epoch is None or offset == len(plan):
      per_epoch = len(epoch_batches(examples, batch_size, seed, 0))
      epoch, offset = divmod(step, per_epoch)
      plan = epoch_batches(examples, batch_size, seed, epoch)
    yield make_batch([examples[i] for i in plan[offset]])
    offset += 1
    step += 1


# ------------------------------------------------------------------------- distillation


def teacher_outputs(
  teacher: t5.T5,
  sources: Sequence[np.ndarray],
  max_new_tokens: int,
  batch_size: int = 128,
  progress: bool = False,
) -> list[np.ndarray]:
  """The teacher's greedy outputs (EOS included when it ends) for every source.

  Sources are decoded in batches of similar length (fewer padded positions, and few
  distinct shapes: inputs pad to a multiple of 8), in one compiled loop per shape;
  the outputs come back in the order of `sources`.
  """
  order = np.argsort([len(s) for s in sources], kind="stable")
  outputs: list[np.ndarray | None] = [None] * len(sources)
  bar = None
  if progress:
    from tqdm import tqdm  # Only for the command line.

    bar = tqdm(total=len(sources), desc="teacher", unit="sentence")
  greedy = SamplingConfig(temperature=0.0)
  for start in range(0, len(order), batch_size):
    index = order[start : start + batch_size]
    rows = [sources[i] for i in index]
    rows += [rows[-1]] * (batch_size - len(rows))  # One batch shape per length.
    out = sample.autoregressive_sample(
      teacher,
      jnp.asarray(_pad(rows)),
      jax.random.key(0),
      max_new_tokens=max_new_tokens,
      sampling=greedy,
      eos_id=EOS_ID,
    )
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    for j, i in enumerate(index):
      outputs[i] = tokens[j, : lengths[j]].astype(np.int32)
    if bar is not None:
      bar.update(len(index))
  if bar is not None:
    bar.close()
  return outputs


def distilled_examples(
  examples,
  teacher: t5.T5,
  max_target: int,
  cache_path: str,
  batch_size: int = 128,
  progress: bool = False,
):
  """`examples` with each target replaced by the teacher's greedy output.

  The outputs are stored in `cache_path` (npz) and reused when it exists and holds as
  many outputs as there are examples.
  """
  if os.path.exists(cache_path):
    with np.load(cache_path) as cached:
      flat, offsets = cached["tokens"], cached["offsets"]
    if len(offsets) == len(examples) + 1:
      outputs = [flat[offsets[i] : offsets[i + 1]] for i in range(len(examples))]
      return [(src, out) for (src, _), out in zip(examples, outputs)]
    logging.warning(
      "%s holds %d outputs for %d examples: decoding again",
      cache_path,
      len(offsets) - 1,
      len(examples),
    )
  outputs = teacher_outputs(teacher, [src for src, _ in examples], max_target, batch_size, progress)
  offsets = np.concatenate([[0], np.cumsum([len(o) for o in outputs])]).astype(np.int64)
  os.makedirs(os.path.dirname(cache_path) or ".", exist_ok=True)
  with open(cache_path + ".tmp", "wb") as f:
    np.savez(f, tokens=np.concatenate(outputs).astype(np.int32), offsets=offsets)
  os.replace(cache_path + ".tmp", cache_path)
  return [(src, out) for (src, _), out in zip(examples, outputs)]


# ----------------------------------------------------------------------------- training


def output_vocabulary(examples, vocab_size: int) -> np.ndarray:
  """int32[K], sorted: the token ids the training targets hold, with PAD and EOS.

  A shortlist for the training loss (Jean et al., 2015, "On Using Very Large Target
  Vocabulary for Neural Machine Translation"): Multi30k's German side holds 6,534 of
  T5's 32,128 tokens, so normalizing over those makes the output layer, ~55 % of a
  training step's arithmetic at the full vocabulary, about 5x cheaper. The model keeps
  its full [E, V] output layer; the other columns learn from the steps that run over
  the full vocabulary (`TrainConfig.full_vocab_every`): without those, 100 shortlist
  steps raised the full-vocabulary validation loss 2.54 -> 2.68 (the mass the other
  tokens' frozen logits take as the shortlist's logits drift, which its softmax
  cannot see)."""
  ids = np.unique(np.concatenate([t for _, t in examples] + [[PAD_ID, EOS_ID]]))
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(f"target ids outside [0, {vocab_size})")
  return ids.astype(np.int32)


def _shortlist_logits(output_ids: jax.Array):
  """A flax method interceptor: `decoder/logits_dense` multiplies by its kernel's
  `output_ids` columns only."""

  def interceptor(next_fun, args, kwargs, context):
    if context.module.name != "logits_dense" or context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    (y,) = args
    kernel = context.module.get_variable("params", "kernel")
    flat = y.reshape((-1, y.shape[-1])).astype(jnp.float32)
    out = jnp.dot(flat, jnp.take(kernel, output_ids, axis=1))
    return out.reshape(y.shape[:-1] + (output_ids.shape[0],))

  return interceptor


def multipliers(params, model_cfg: t5.T5Config):
  """Per parameter, the constant that `TrainConfig.reparam` trains it divided by.

  T5 puts two scales into its initialisation rather than its forward pass: token
  embeddings at N(0, 1) (read unscaled), and query kernels at 1/sqrt(head_dim) of the
  other kernels (attention logits unscaled). Relative-update optimizers (Adafactor)
  keep those ratios; AdamW's steps of ~lr in every coordinate do not: the embeddings
  barely move, while the query kernels soon lose their scale. Training params / m
  with the forward pass reading them times m (m = sqrt(emb_dim) for the embedding,
  1/sqrt(head_dim) for queries, 1 elsewhere) starts every matrix at ~1/sqrt(fan in),
  as a standard Transformer does (embeddings N(0, 1/d) times sqrt(d), scaled dot
  products); `effective` turns them back into T5's own parameters, so the checkpoint
  and the model are unchanged."""

  def m(path, _):
    names = [getattr(k, "key", str(k)) for k in path]
    if names[-2:] == ["token_embedder", "embedding"]:
      return float(np.sqrt(model_cfg.emb_dim))
    if len(names) >= 2 and names[-2] == "query":
      return float(1.0 / np.sqrt(model_cfg.head_dim))
    return 1.0

  return jax.tree_util.tree_map_with_path(m, params)


def effective(raw, mults):
  """T5's parameters from the trained ones (`multipliers`)."""
  return jax.tree.map(lambda p, m: p * m if m != 1.0 else p, raw, mults)


def loss_fn(
  params,
  module,
  batch,
  dropout_rng,
  train: bool,
  label_smoothing: float = 0.0,
  output_ids: jax.Array | None = None,
):
  """Mean token cross-entropy over non-pad target positions.

  With `label_smoothing` e the loss is (1 - e) * NLL + e * (mean over the vocabulary
  of -log p), i.e. cross-entropy against targets smoothed uniformly (Szegedy et al.
  2016), computed from the log-softmax without building the smoothed one-hot rows.
  With `output_ids` (int32[K], sorted, holding every target id: `output_vocabulary`)
  the softmax, and the smoothing, run over those tokens only.
  """

  def apply():
    return module.apply(
      {"params": params},
      batch["encoder_input_tokens"],
      batch["decoder_input_tokens"],
      batch["decoder_target_tokens"],
      enable_dropout=train,
      rngs={"dropout": dropout_rng},
    )

  targets = batch["decoder_target_tokens"]
  if output_ids is None:
    logits = apply()
  else:
    with nn.intercept_methods(_shortlist_logits(output_ids)):
      logits = apply()
    targets = jnp.searchsorted(output_ids, targets).astype(jnp.int32)
  weights = (batch["decoder_target_tokens"] > PAD_ID).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  losses = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  if label_smoothing:
    losses = (1.0 - label_smoothing) * losses - label_smoothing * jnp.mean(logp, axis=-1)
  return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def step_flops(
  model_cfg: t5.T5Config, batch: dict[str, np.ndarray], output_size: int | None = None
) -> float:
  """The arithmetic of one training step: 6 x weights x tokens for the matrix products
  (forward 2, backward 4), each side's tokens through its own stack, every decoder
  position through the vocabulary-sized output layer; attention scores and the
  embedding lookups (small here) left out. Padded positions count: they are computed.
  `output_size`: the columns of the output layer a step multiplies by (default: all)."""
  d, v = model_cfg.emb_dim, output_size or model_cfg.vocab_size
  inner = model_cfg.num_heads * model_cfg.head_dim
  attention = 4 * d * inner
  mlp = (len(model_cfg.mlp_activations) + 1) * d * model_cfg.mlp_dim
  encoder = model_cfg.num_encoder_layers * (attention + mlp)
  decoder = model_cfg.num_decoder_layers * (2 * attention + mlp)
  enc_tokens = batch["encoder_input_tokens"].size
  dec_tokens = batch["decoder_input_tokens"].size
  return 6.0 * (encoder * enc_tokens + (decoder + d * v) * dec_tokens)


def make_optimizer(cfg: TrainConfig, total_steps: int) -> optax.GradientTransformation:
  """AdamW, or T5's own Adafactor (T5X's settings: factored second moments, decay 0.8,
  updates clipped at RMS 1 and scaled by each parameter's RMS), each with a linear
  warm-up and a cosine decay to 5 %.

  Adafactor's relative updates matter for T5's initialisation: the token embeddings
  start at N(0, 1), and AdamW's absolute steps of ~lr move them by a few percent in
  thousands of steps (measured: 3-5 % after 1,200 steps at lr 1.5e-3), so they stay
  near their random start while every other matrix moves by its own size or more.
  """
  schedule = optax.warmup_cosine_decay_schedule(
    0.0,
    cfg.learning_rate,
    min(cfg.warmup_steps, max(1, total_steps // 10)),
    max(total_steps, 2),
    end_value=cfg.learning_rate * 0.05,
  )
  if cfg.optimizer == "adafactor":
    return optax.adafactor(
      schedule,
      multiply_by_parameter_scale=True,
      clipping_threshold=1.0,
      decay_rate=0.8,
      momentum=None,
      min_dim_size_to_factor=128,
    )
  if cfg.optimizer != "adamw":
    raise ValueError(f"optimizer must be 'adamw' or 'adafactor', got {cfg.optimizer!r}")
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def warm_start(path: str, template: dict) -> dict:
  """Parameters from another run's train_state.msgpack (its EMA where it kept one):
  a second phase of training that starts from them with a fresh optimizer."""
  with open(path, "rb") as f:
    raw = flax.serialization.msgpack_restore(f.read())
  return flax.serialization.from_state_dict(template, raw.get("ema", raw["params"]))


def _save(path: str, state: dict) -> None:
  """Writes the train state (msgpack) and its history (JSON) atomically."""
  history = state["history"]
  for target, payload in (
    (path, flax.serialization.to_bytes({k: v for k, v in state.items() if k != "history"})),
    (path + ".history.json", json.dumps(history).encode()),
  ):
    with open(target + ".tmp", "wb") as f:
      f.write(payload)
    os.replace(target + ".tmp", target)  # An interrupted save keeps the last one.


def train_model(
  name: str,
  model_cfg: t5.T5Config,
  train_examples,
  val_examples,
  cfg: TrainConfig,
  work_dir: str,
  progress: bool = True,
  stop_at: int | None = None,
) -> dict:
  """Trains one model (resuming from work_dir) and returns its history and params.

  `stop_at` ends the run early after that step, with a checkpoint, as an interruption
  would; calling again resumes where it stopped.
  """
  os.makedirs(work_dir, exist_ok=True)
  module = t5.Transformer(model_cfg)
  steps_per_epoch = len(epoch_batches(train_examples, cfg.batch_size, cfg.seed, 0))
  if steps_per_epoch < 1:
    raise ValueError(
      f"batch_size {cfg.batch_size} exceeds the {len(train_examples)} training examples"
    )
  total_steps = max(1, round(cfg.epochs * steps_per_epoch))
  if cfg.output_vocab not in ("full", "train"):
    raise ValueError(f"output_vocab must be 'full' or 'train', got {cfg.output_vocab!r}")
  output_ids = (
    jnp.asarray(output_vocabulary(train_examples, model_cfg.vocab_size))
    if cfg.output_vocab == "train"
    else None
  )
  output_size = None if output_ids is None else int(output_ids.shape[0])
  optimizer = make_optimizer(cfg, total_steps)
  params = t5.init_params(model_cfg, jax.random.key(cfg.seed))
  if cfg.embedding_std != 1.0:
    params = dict(
      params, token_embedder=jax.tree.map(lambda e: e * cfg.embedding_std, params["token_embedder"])
    )
  if cfg.init_from:
    params = warm_start(cfg.init_from, params)
  mults = multipliers(params, model_cfg)
  if cfg.reparam:  # Train params / m (see `multipliers`), T5's own values at start.
    params = jax.tree.map(lambda p, m: p / m if m != 1.0 else p, params, mults)
  else:
    mults = jax.tree.map(lambda _: 1.0, mults)
  state = dict(
    step=0, params=params, opt_state=optimizer.init(params), history=[], seconds=0.0, flops=0.0
  )
  if cfg.ema_decay:
    state["ema"] = params
  ckpt_path = os.path.join(work_dir, "train_state.msgpack")
  if os.path.exists(ckpt_path):
    with open(ckpt_path, "rb") as f:
      restored = flax.serialization.from_bytes(
        {k: v for k, v in state.items() if k != "history"}, f.read()
      )
    with open(ckpt_path + ".history.json") as f:
      state = dict(restored, history=json.load(f))
    state["step"], state["seconds"] = int(state["step"]), float(state["seconds"])
    state["flops"] = float(state["flops"])
    logging.info("%s: resumed at step %d", name, state["step"])

  def make_train_step(ids):
    @jax.jit
    def train_step(params, opt_state, batch, step):
      rng = jax.random.fold_in(jax.random.key(cfg.seed + 1), step)
      loss, grads = jax.value_and_grad(
        lambda raw: loss_fn(
          effective(raw, mults), module, batch, rng, True, cfg.label_smoothing, ids
        )
      )(params)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    return train_step

  full_step, short_step = make_train_step(None), make_train_step(output_ids)

  def uses_shortlist(step: int) -> bool:
    return output_ids is not None and not (
      cfg.full_vocab_every and step % cfg.full_vocab_every == 0
    )

  @jax.jit
  def ema_step(ema, params, step):
    # Polyak averaging with a warm start: early on the average follows the weights.
    decay = jnp.minimum(cfg.ema_decay, (1.0 + step) / (10.0 + step))
    return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)

  @jax.jit
  def eval_step(params, batch):
    return loss_fn(effective(params, mults), module, batch, jax.random.key(0), False)

  val_batches = [
    make_batch(val_examples[i : i + cfg.batch_size])
    for i in range(0, min(len(val_examples), cfg.eval_examples), cfg.batch_size)
  ]

  def validate(params) -> float:
    return float(np.mean([eval_step(params, b) for b in val_batches]))

  bar = None
  if progress:
    from tqdm import tqdm  # Only for the command line.

    bar = tqdm(total=total_steps, initial=state["step"], desc=name, unit="step")
  data = batches(train_examples, cfg.batch_size, cfg.seed, start_step=state["step"])
  params, opt_state = state["params"], state["opt_state"]
  ema = state.get("ema")
  if not state["history"]:
    state["history"].append(dict(step=0, train_loss=None, val_loss=validate(params), seconds=0.0))
  recent, step_rates = [], []
  while state["step"] < total_steps:
    batch = next(data)
    start = time.perf_counter()
    short = uses_shortlist(state["step"])
    params, opt_state, loss = (short_step if short else full_step)(
      params, opt_state, batch, state["step"]
    )
    if ema is not None:
      ema = ema_step(ema, params, state["step"])
    recent.append(float(loss))
    elapsed = time.perf_counter() - start
    flops = step_flops(model_cfg, batch, output_size if short else None)
    step_rates.append(flops / elapsed)
    state["step"] += 1
    state["seconds"] += elapsed
    state["flops"] += flops
    done = state["step"] == total_steps
    if state["step"] % cfg.eval_every == 0 or done:
      # The median step's rate leaves out the steps that compiled a new batch shape.
      entry = dict(
        step=state["step"],
        train_loss=float(np.mean(recent)),
        val_loss=validate(params),
        seconds=state["seconds"],
        median_gflop_per_s=float(np.median(step_rates)) / 1e9,
        output_vocab=cfg.output_vocab,
        full_vocab_every=cfg.full_vocab_every,
      )
      if ema is not None:
        entry["val_loss_ema"] = validate(ema)
      state["history"].append(entry)
      recent, step_rates = [], []
      if bar is not None:
        bar.set_postfix(train=f"{entry['train_loss']:.3f}", val=f"{entry['val_loss']:.3f}")
    interrupted = stop_at is not None and state["step"] >= stop_at
    if state["step"] % cfg.checkpoint_every == 0 or done or interrupted:
      state["params"], state["opt_state"] = params, opt_state
      if ema is not None:
        state["ema"] = ema
      _save(ckpt_path, state)
    if bar is not None:
      bar.update(1)
    if interrupted:
      break
  if bar is not None:
    bar.close()
  return dict(
    params=effective(params if ema is None else ema, mults),
    history=state["history"],
    steps=state["step"],
    seconds=state["seconds"],
    flops=state["flops"],
    config=model_cfg,
  )


def export(params, model_cfg: t5.T5Config, directory: str, step: int) -> str:
  """bfloat16 parameters in the T5X legacy checkpoint layout."""
  bf16 = jax.tree.map(lambda x: np.asarray(x, jnp.bfloat16), jax.device_get(params))
  return save_t5x(directory, bf16, step=step)


# ------------------------------------------------------------------------------ command

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined when run as a command only, so that importing this
  file (the tests do) registers no flag in absl's one registry."""
  flags.DEFINE_string("out_dir", "out/train_pair", "Work and output directory.")
  flags.DEFINE_string(
    "data_dir", "../shared/data/multi30k", "Multi30k raw files (train.en/.de, val.en/.de)."
  )
  flags.DEFINE_string("vocab", None, "SentencePiece model (default: shipped).")
  flags.DEFINE_list("which", ["draft", "target"], "Models to train, in order.")
  flags.DEFINE_multi_string(
    "epochs", ["draft=4.0", "target=5.0"], "Epochs per model, as name=value."
  )
  flags.DEFINE_multi_string(
    "learning_rate", ["draft=2e-3", "target=1.5e-3"], "Peak learning rate per model, as name=value."
  )
  flags.DEFINE_multi_string(
    "warmup_steps", ["draft=200", "target=400"], "Linear warm-up steps per model, as name=value."
  )
  flags.DEFINE_multi_string(
    "label_smoothing",
    ["draft=0.0", "target=0.1"],
    "Label smoothing per model, as name=value (the draft is "
    "trained to match a distribution, so none by default).",
  )
  flags.DEFINE_multi_string(
    "optimizer", ["draft=adamw", "target=adamw"], "adamw or adafactor, per model, as name=value."
  )
  flags.DEFINE_multi_string(
    "reparam",
    [],
    "Train in the parametrization of `multipliers` (embeddings "
    "and queries rescaled; the exported model is unchanged), as "
    "name=true|false.",
  )
  flags.DEFINE_multi_string(
    "embedding_std", [], "Initial scale of the token embeddings (T5: 1), as name=value."
  )
  flags.DEFINE_multi_string(
    "output_vocab",
    [],
    "full (default) or train: the training softmax over the "
    "tokens the training targets hold (validation always over "
    "the full vocabulary), as name=value.",
  )
  flags.DEFINE_multi_string(
    "full_vocab_every",
    [],
    "With --output_vocab=train: every this many steps one "
    "over the full vocabulary (default 4; 0: none), as "
    "name=value.",
  )
  flags.DEFINE_multi_string("init_from", [], "A train_state.msgpack to start from, as name=path.")
  flags.DEFINE_multi_string(
    "dropout",
    [],
    "Per model, e.g. target=0.0: dropout rate (default: the "
    "preset's). Zero where training and validation losses agree "
    "(underfitting).",
  )
  flags.DEFINE_multi_string(
    "ema_decay",
    ["draft=0.0", "target=0.999"],
    "Exported weights are this exponential moving average of "
    "the trained ones (0: the last weights), as name=value.",
  )
  flags.DEFINE_integer(
    "draft_width",
    0,
    "The draft's width (0: the preset's 32), for a size study as the "
    "paper's Table 4: 2 heads of width / 2, MLP 4 x width, the "
    "preset's depth.",
  )
  flags.DEFINE_integer("batch_size", 64, "Sentences per step.")
  flags.DEFINE_integer("training_seed", 0, "Seed for data order and initialisation.")
  flags.DEFINE_enum(
    "draft_data",
    "references",
    ["references", "distill"],
    "The draft's training targets: the German references, or the target's greedy "
    "outputs (sequence-level distillation).",
  )
  flags.DEFINE_string(
    "teacher_checkpoint",
    "",
    "T5X checkpoint of the distillation teacher, with the 'target' preset; empty: the "
    "shipped pair's target (or, when --which trains a target first, that target).",
  )


def main(argv):
  del argv
  # Each batch shape compiles once per process; a resumed run reads them from disk.
  jax.config.update("jax_compilation_cache_dir", os.path.join(FLAGS.out_dir, "jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  import sentencepiece as spm  # Training-time only.

  vocab_path = FLAGS.vocab or checkpoints_vocab_path()
  vocab = spm.SentencePieceProcessor(model_file=vocab_path)
  train = encode_pairs(
    read_pairs(os.path.join(FLAGS.data_dir, "train.en"), os.path.join(FLAGS.data_dir, "train.de")),
    vocab,
    48,
    48,
  )
  val = encode_pairs(
    read_pairs(os.path.join(FLAGS.data_dir, "val.en"), os.path.join(FLAGS.data_dir, "val.de")),
    vocab,
    48,
    48,
  )
  per_model = {
    key: dict(e.split("=") for e in getattr(FLAGS, key) if "=" in e)
    for key in (
      "epochs",
      "learning_rate",
      "warmup_steps",
      "label_smoothing",
      "ema_decay",
      "optimizer",
      "init_from",
      "embedding_std",
      "reparam",
      "output_vocab",
      "full_vocab_every",
      "dropout",
    )
  }
  unknown = [n for n in FLAGS.which if n not in PRESETS]
  if unknown:
    raise ValueError(f"--which: unknown models {unknown}; choose from {sorted(PRESETS)}")
  results = {}
  for name in FLAGS.which:
    defaults = TrainConfig()
    cfg = TrainConfig(
      batch_size=FLAGS.batch_size,
      seed=FLAGS.training_seed,
      epochs=float(per_model["epochs"].get(name, 1.0)),
      learning_rate=float(per_model["learning_rate"].get(name, defaults.learning_rate)),
      warmup_steps=int(per_model["warmup_steps"].get(name, defaults.warmup_steps)),
      label_smoothing=float(per_model["label_smoothing"].get(name, 0.0)),
      ema_decay=float(per_model["ema_decay"].get(name, 0.0)),
      optimizer=per_model["optimizer"].get(name, "adamw"),
      init_from=per_model["init_from"].get(name, ""),
      embedding_std=float(per_model["embedding_std"].get(name, 1.0)),
      reparam=per_model["reparam"].get(name, "false").lower() in ("1", "true", "yes"),
      output_vocab=per_model["output_vocab"].get(name, "full"),
      full_vocab_every=int(per_model["full_vocab_every"].get(name, 4)),
    )
    examples = train
    if name == "draft" and FLAGS.draft_data == "distill":
      teacher = _teacher(results.get("target"))
      examples = distilled_examples(
        train, teacher, 48, os.path.join(FLAGS.out_dir, "teacher_outputs.npz"), progress=True
      )
    model_cfg = PRESETS[name]
    if name == "draft" and FLAGS.draft_width:
      width = FLAGS.draft_width
      model_cfg = dataclasses.replace(
        model_cfg, emb_dim=width, head_dim=width // 2, mlp_dim=4 * width
      )
    if name in per_model["dropout"]:
      model_cfg = dataclasses.replace(model_cfg, dropout_rate=float(per_model["dropout"][name]))
    results[name] = (
      cfg,
      train_model(name, model_cfg, examples, val, cfg, os.path.join(FLAGS.out_dir, name)),
      model_cfg,
    )
  summary_path = os.path.join(FLAGS.out_dir, "summary.json")
  summary = {}
  if os.path.exists(summary_path):  # Models trained by earlier runs into this directory.
    with open(summary_path) as f:
      summary = json.load(f)
  for name, (cfg, result, model_cfg) in results.items():
    path = export(
      result["params"], model_cfg, os.path.join(FLAGS.out_dir, "export", name), result["steps"]
    )
    summary[name] = dict(
      checkpoint=path,
      steps=result["steps"],
      seconds=result["seconds"],
      flops=result["flops"],
      settings=dataclasses.asdict(cfg),
      epochs=cfg.epochs,
      batch_size=cfg.batch_size,
      data=(FLAGS.draft_data if name == "draft" else "references"),
      history=result["history"],
      params=t5.param_count(model_cfg),
      config={k: str(v) for k, v in dataclasses.asdict(model_cfg).items()},
    )
    print(
      f"{name}: {result['steps']} steps in {result['seconds'] / 60:.1f} min, "
      f"final val loss {result['history'][-1]['val_loss']:.3f} -> {path}"
    )
  write_json(summary_path, summary)


def _teacher(trained_target) -> t5.T5:
  """The distillation teacher: --teacher_checkpoint, the target trained in this run,
  or the shipped pair's target, in float32."""
  cfg = dataclasses.replace(PRESETS["target"], dropout_rate=0.0)
  if FLAGS.teacher_checkpoint:
    return t5.T5(cfg, jax.device_put(load_t5x(FLAGS.teacher_checkpoint, cfg, dtype=jnp.float32)))
  if trained_target is not None:
    return t5.T5(cfg, trained_target[1]["params"])
  from specdec import pretrained  # The shipped pair.

  return pretrained.load_model("multi30k_ende", "target")


def checkpoints_vocab_path() -> str:
  from specdec import pretrained  # The shipped T5 SentencePiece model.

  return pretrained.vocab_path()


if __name__ == "__main__":
  define_flags()
  app.run(main)
