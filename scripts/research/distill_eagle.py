"""Trains a feature draft (`specdec.drafts.eagle`) for SmolLM2-135M-Instruct.

    python scripts/research/distill_eagle.py --out_dir=out/distill_lm \\
        --eagle_dir=out/distill_eagle --eagle_stages=features,train,evaluate --gamma=3

The draft reads the target's features (its normed last hidden states): one decoder
layer at the target's width predicts the next feature from the previous one and the
token just committed, and the target's own output rows of a shortlist read it
(EAGLE, Li et al. 2024). Algorithm 1 stays exact whatever the draft computes.

Stages (each reads the previous one's files in --eagle_dir):

* `features`: the target's teacher-forced features over --eagle_sequences of the
  decodes `distill_lm.py --stages=generate` cached in --out_dir (its
  `gen_train_t0*` greedy decodes, and `gen_train_t1*` with
  --eagle_temperatures=0,1),
  chosen at random (--seed), and over the held-out `gen_eval_t0` decodes: one full
  causal forward pass per batch, float16 on disk.
* `train`: the draft's fc, layer and norm (the embedding and the head are the
  target's, frozen) on prompt + response sequences: Huber regression of the target's
  feature plus --eagle_cls_weight times the cross-entropy of the draft's shortlist
  distribution against the target's (both through the target's output rows of the
  shortlist), with uniform noise of +-eagle_feature_noise on the input features (the draft
  reads its own, inexact, features after its first step), AdamW with warm-up and
  cosine decay. The held-out accuracy after each epoch: how often the draft's first
  token (from the target's features) is the target's greedy token.
* `evaluate`: `specdec.speculative_sample` with the trained draft over the held-out
  prompts at temperature 0 (--gamma): alpha-hat, tokens per iteration, and rows
  identical to the target's greedy decodes, into summary.json (where every stage
  records what it did). The trained draft is --eagle_dir/draft
  (`specdec.drafts.eagle.load(directory, target)`).
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import glob
import json
import os
import time
from typing import Any

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec import pretrained
from specdec.bench.cli import write_json
from specdec.distributions import SamplingConfig
from specdec.drafts import eagle

from common import log
import lm_decodes
from lm_decodes import NAME
from lm_evaluation import speculative_stats
from lm_training import final_hidden

STAGES = ("features", "train", "evaluate")
FEATURE_BATCH = 16
FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class EagleSettings:
  """How `train` trains (the flags eagle_<field>, and --seed)."""

  epochs: int = 6  # passes over the training sequences
  batch: int = 16  # sequences per step
  length: int = 160  # positions per sequence (longer cut)
  learning_rate: float = 1e-3  # peak AdamW
  warmup_steps: int = 50  # linear warm-up
  cls_weight: float = 0.5  # weight of the cross-entropy term
  feature_noise: float = 0.1  # uniform noise on input features
  seed: int = 0  # initialisation, data order, noise

  def __post_init__(self):
    for name in ("epochs", "batch", "length"):
      if getattr(self, name) < 1:
        raise ValueError(f"eagle_{name}: must be >= 1, got {getattr(self, name)}")


def define_flags() -> None:
  """The command line; defined when run as a command only, so that importing this
  file (the tests do) registers no flag. --out_dir, --seed, --gamma and
  --max_new_tokens mean what they mean to distill_lm.py (--out_dir: where its decodes
  are cached); this script's own flags are prefixed eagle_."""
  d = EagleSettings()
  flags.DEFINE_string(
    "out_dir", "out/distill_lm", "distill_lm.py's --out_dir (its cached decodes)."
  )
  flags.DEFINE_integer("seed", d.seed, "Initialisation, data order, sampling keys.")
  flags.DEFINE_integer("gamma", 4, "Draft tokens per iteration (evaluate).")
  flags.DEFINE_integer("max_new_tokens", 96, "Tokens per decode (evaluate).")
  flags.DEFINE_string("eagle_dir", "out/distill_eagle", "Features, weights, logs.")
  flags.DEFINE_list("eagle_stages", list(STAGES), f"Any of {STAGES}.")
  flags.DEFINE_list(
    "eagle_temperatures", ["0"], "Training decodes: 0 (greedy), 1 (sampled) or both."
  )
  flags.DEFINE_integer("eagle_sequences", 2500, "Training sequences.")
  flags.DEFINE_string(
    "eagle_head_ids",
    str(pretrained.WEIGHTS_DIR / NAME / "draft" / pretrained.SHORTLIST_FILE),
    "The head's ids: a shortlist.json ({'ids': [...]}).",
  )
  flags.DEFINE_integer("eagle_epochs", d.epochs, "Passes over the training sequences.")
  flags.DEFINE_integer("eagle_batch", d.batch, "Sequences per step.")
  flags.DEFINE_integer("eagle_length", d.length, "Positions per sequence (longer cut).")
  flags.DEFINE_float("eagle_learning_rate", d.learning_rate, "Peak AdamW learning rate.")
  flags.DEFINE_integer("eagle_warmup_steps", d.warmup_steps, "Linear warm-up steps.")
  flags.DEFINE_float("eagle_cls_weight", d.cls_weight, "Weight of the cross-entropy term.")
  flags.DEFINE_float("eagle_feature_noise", d.feature_noise, "Uniform noise on input features.")


# ------------------------------------------------------------------------------
# Features.
# ------------------------------------------------------------------------------
def sequences(directories: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
  """(prompt ids, response ids) of every cached decode row, in file order."""
  return [
    (prompt, response)
    for d in directories
    for prompt, response, _ in lm_decodes.examples(lm_decodes.load_decodes(d))
  ]


def extract(target, pad_id: int, seqs: Sequence[tuple], path: str) -> None:
  """Writes the target's features of `seqs` to `path` (.npz): tokens and float16
  features concatenated over sequences, with lengths and prompt lengths."""
  cfg, params = target.config, target.params
  forward = jax.jit(lambda t: final_hidden(cfg, params, t))
  order = np.argsort([len(p) + len(r) for p, r in seqs], kind="stable")
  tokens, feats = [None] * len(seqs), [None] * len(seqs)
  started = time.perf_counter()
  for i in range(0, len(order), FEATURE_BATCH):
    rows = order[i : i + FEATURE_BATCH]
    width = -(-max(len(seqs[j][0]) + len(seqs[j][1]) for j in rows) // 32) * 32
    batch = np.full((FEATURE_BATCH, width), pad_id, np.int32)
    for k, j in enumerate(rows):
      s = np.concatenate(seqs[j])
      batch[k, : len(s)] = s
    hidden = np.asarray(forward(jnp.asarray(batch)))
    for k, j in enumerate(rows):
      n = len(seqs[j][0]) + len(seqs[j][1])
      tokens[j], feats[j] = batch[k, :n], hidden[k, :n].astype(np.float16)
    if i // FEATURE_BATCH % 25 == 0:
      log(f"features: {i + len(rows)}/{len(seqs)} sequences, {time.perf_counter() - started:.0f} s")
  np.savez(
    path,
    tokens=np.concatenate(tokens),
    features=np.concatenate(feats),
    lengths=np.array([len(t) for t in tokens]),
    prompt_lengths=np.array([len(p) for p, _ in seqs]),
  )


def load_features(path: str) -> list[tuple[np.ndarray, np.ndarray, int]]:
  """(tokens, float16 features, prompt length) per sequence of `extract`'s file."""
  with np.load(path) as z:  # each key read once: an NpzFile reads it on every access
    tokens, feats, lengths, prompts = (
      z[k] for k in ("tokens", "features", "lengths", "prompt_lengths")
    )
  ends = np.cumsum(lengths)
  return [(tokens[e - n : e], feats[e - n : e], int(p)) for e, n, p in zip(ends, lengths, prompts)]


# ------------------------------------------------------------------------------
# Training.
# ------------------------------------------------------------------------------
def pack(rows: Sequence[tuple], length: int, width: int, response_only: bool = False):
  """tokens int32[B, L], features float32[B, L, d], mask [B, L] (positions whose
  next token is in the sequence; with `response_only`, only those that predict a
  response token)."""
  tokens = np.zeros((len(rows), length), np.int32)
  feats = np.zeros((len(rows), length, width), np.float32)
  mask = np.zeros((len(rows), length), np.float32)
  for k, (t, f, prompt) in enumerate(rows):
    n = min(len(t), length)
    tokens[k, :n], feats[k, :n] = t[:n], f[:n]
    mask[k, (prompt - 1 if response_only else 0) : n - 1] = 1
  return tokens, feats, mask


def shifted(feats: jax.Array) -> jax.Array:
  """The feature of the position before each one (zeros first)."""
  return jnp.concatenate([jnp.zeros_like(feats[:, :1]), feats[:, :-1]], axis=1)


def make_functions(target, ids: np.ndarray, tx, cls_weight: float, noise: float):
  """(train step, held-out accuracy counts), jitted."""
  cfg = target.config
  module = eagle.FeatureLayer(cfg, len(ids))
  embedding = jnp.asarray(target.params["token_embedder"]["embedding"], jnp.float32)
  head = {"embedding": jnp.asarray(eagle.output_rows(target, ids))}
  full_rows = jnp.asarray(eagle.output_rows(target, np.arange(cfg.vocab_size)))
  ids_j = jnp.asarray(ids)

  def apply(params, tokens, previous):
    variables = {"params": dict(params, head=head)}
    return module.apply(variables, jnp.take(embedding, tokens, axis=0), previous)

  def loss_fn(params, tokens, feats, mask, key):
    previous = shifted(feats)
    previous += jax.random.uniform(key, previous.shape, minval=-noise, maxval=noise)
    logits, g = apply(params, tokens, previous)
    regression = jnp.mean(optax.huber_loss(g, feats, delta=1.0), axis=-1)
    log_p = jax.nn.log_softmax(feats @ head["embedding"].T, axis=-1)
    log_q = jax.nn.log_softmax(logits, axis=-1)
    cross = -jnp.sum(jnp.exp(log_p) * log_q, axis=-1)
    total = jnp.maximum(jnp.sum(mask), 1.0)
    per = regression + cls_weight * cross
    return jnp.sum(per * mask) / total, (
      jnp.sum(regression * mask) / total,
      jnp.sum(cross * mask) / total,
    )

  @jax.jit
  def step(params, opt_state, tokens, feats, mask, key):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, feats, mask, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, aux

  @jax.jit
  def hits(params, tokens, feats, mask):
    logits, _ = apply(params, tokens, shifted(feats))
    greedy = jnp.argmax(feats @ full_rows.T, axis=-1)
    drafted = jnp.take(ids_j, jnp.argmax(logits, axis=-1))
    return jnp.sum((greedy == drafted) * mask), jnp.sum(mask)

  return step, hits


def accuracy(hits, params, data, length: int, width: int, batch: int) -> float:
  """How often the draft's first token is the target's greedy one, over the
  response positions of `data`."""
  right = total = 0.0
  for i in range(0, len(data), batch):
    rows = list(data[i : i + batch])
    mask_rows = len(rows)
    rows += [rows[0]] * (batch - len(rows))
    tokens, feats, mask = pack(rows, length, width, response_only=True)
    mask[mask_rows:] = 0
    h, n = hits(params, tokens, feats, mask)
    right, total = right + float(h), total + float(n)
  return right / max(total, 1.0)


def train(
  target, ids: np.ndarray, data, held_out, out_dir: str, settings: EagleSettings
) -> dict[str, Any]:
  """Trains the draft on `data` (`load_features`), the head over the shortlist `ids`;
  the held-out first-token accuracy on `held_out` after every epoch; saves the draft
  to out_dir/draft (`eagle.save`) and returns the training record."""
  cfg = target.config
  width, batch, length = cfg.hidden_size, settings.batch, settings.length
  steps_per_epoch = len(data) // batch
  if steps_per_epoch < 1:
    raise ValueError(f"eagle_batch: {batch} exceeds the {len(data)} training sequences")
  steps = settings.epochs * steps_per_epoch
  tx = optax.chain(
    optax.clip_by_global_norm(0.5),
    optax.adamw(
      optax.warmup_cosine_decay_schedule(
        0.0, settings.learning_rate, settings.warmup_steps, steps, settings.learning_rate * 0.05
      ),
      b1=0.9,
      b2=0.95,
      weight_decay=0.0,
    ),
  )
  params = eagle.init_params(cfg, len(ids), jax.random.key(settings.seed))
  params = {k: v for k, v in params.items() if k != "head"}
  # The target's final norm: the predicted feature starts on the target's scale.
  params["norm"] = jax.tree.map(jnp.asarray, target.params["final_norm"])
  opt_state = tx.init(params)
  step, hits = make_functions(target, ids, tx, settings.cls_weight, settings.feature_noise)
  rng = np.random.default_rng(settings.seed)
  key = jax.random.key(settings.seed + 1)
  history = [dict(epoch=0, accuracy=accuracy(hits, params, held_out, length, width, batch))]
  log(
    f"train: {len(data)} sequences, {steps} steps; held-out first-token "
    f"accuracy {history[-1]['accuracy']:.3f}"
  )
  started = time.perf_counter()
  for epoch in range(settings.epochs):
    order = rng.permutation(len(data))
    for s in range(steps_per_epoch):
      tokens, feats, mask = pack(
        [data[j] for j in order[s * batch : (s + 1) * batch]], length, width
      )
      key, sub = jax.random.split(key)
      params, opt_state, loss, (regression, cross) = step(
        params, opt_state, tokens, feats, mask, sub
      )
      if (s + 1) % 100 == 0:
        log(
          f"epoch {epoch + 1} step {s + 1}/{steps_per_epoch}: loss {float(loss):.3f} "
          f"(regression {float(regression):.3f}, cross-entropy {float(cross):.3f})"
        )
    history.append(
      dict(
        epoch=epoch + 1,
        loss=float(loss),
        accuracy=accuracy(hits, params, held_out, length, width, batch),
        seconds=round(time.perf_counter() - started, 1),
      )
    )
    log(
      f"epoch {epoch + 1}: held-out first-token accuracy "
      f"{history[-1]['accuracy']:.3f}, {history[-1]['seconds']:.0f} s"
    )
  eagle.save(os.path.join(out_dir, "draft"), params, ids)
  return dict(
    sequences=len(data),
    steps=steps,
    epochs=settings.epochs,
    batch=batch,
    learning_rate=settings.learning_rate,
    cls_weight=settings.cls_weight,
    feature_noise=settings.feature_noise,
    history=history,
    minutes=round((time.perf_counter() - started) / 60, 1),
  )


# ------------------------------------------------------------------------------
def eagle_settings() -> EagleSettings:
  """`EagleSettings` from the flags eagle_<field> (and --seed)."""
  return EagleSettings(
    **{
      f.name: FLAGS["seed" if f.name == "seed" else f"eagle_{f.name}"].value
      for f in dataclasses.fields(EagleSettings)
    }
  )


def main(argv):
  del argv
  for stage in FLAGS.eagle_stages:
    if stage not in STAGES:
      raise ValueError(f"eagle_stages: unknown stage {stage!r}; have {list(STAGES)}")
  out_dir, decodes = FLAGS.eagle_dir, FLAGS.out_dir
  os.makedirs(out_dir, exist_ok=True)
  target, tok = pretrained.load_lm(NAME)
  train_file = os.path.join(out_dir, "features_train.npz")
  eval_file = os.path.join(out_dir, "features_eval.npz")
  summary_file = os.path.join(out_dir, "summary.json")
  summary = {}
  if os.path.exists(summary_file):
    with open(summary_file) as f:
      summary = json.load(f)

  if "features" in FLAGS.eagle_stages:
    dirs = sorted(
      d
      for t in FLAGS.eagle_temperatures
      for d in glob.glob(os.path.join(decodes, f"gen_train_t{t}*"))
    )
    pool = sequences(dirs)
    if not pool:
      raise ValueError(f"out_dir: no gen_train_t* decodes in {decodes}")
    pick = np.sort(
      np.random.default_rng(FLAGS.seed).permutation(len(pool))[: FLAGS.eagle_sequences]
    )
    started = time.perf_counter()
    extract(target, tok.pad_id, [pool[i] for i in pick], train_file)
    extract(target, tok.pad_id, sequences([os.path.join(decodes, "gen_eval_t0")]), eval_file)
    summary["features"] = dict(
      directories=[os.path.basename(d) for d in dirs],
      pool=len(pool),
      sequences=len(pick),
      minutes=round((time.perf_counter() - started) / 60, 1),
    )
    write_json(summary_file, summary, indent=1)

  with open(FLAGS.eagle_head_ids) as f:
    ids = np.asarray(json.load(f)["ids"], np.int32)
  if "train" in FLAGS.eagle_stages:
    data, held_out = load_features(train_file), load_features(eval_file)
    summary["train"] = train(target, ids, data, held_out, out_dir, eagle_settings())
    write_json(summary_file, summary, indent=1)

  if "evaluate" in FLAGS.eagle_stages:
    draft = eagle.load(os.path.join(out_dir, "draft"), target).with_packed_weights()
    batches = lm_decodes.load_decodes(os.path.join(decodes, "gen_eval_t0"))
    stats = speculative_stats(
      target,
      draft,
      tok,
      batches,
      SamplingConfig(temperature=0.0),
      FLAGS.gamma,
      FLAGS.max_new_tokens,
      FLAGS.seed,
    )
    log(f"evaluate: {stats}")
    summary["evaluate"] = stats
    write_json(summary_file, summary, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
