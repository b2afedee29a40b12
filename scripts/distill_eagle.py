"""Trains a feature draft (`specdec.models.eagle`) for SmolLM2-135M-Instruct.

    python scripts/distill_eagle.py --out_dir=out/distill_lm \\
        --eagle_dir=out/distill_eagle --eagle_stages=features,train,evaluate --gamma=3

The draft reads the target's features (its normed last hidden states): one decoder
layer at the target's width predicts the next feature from the previous one and the
token just committed, and the target's own output rows of a shortlist read it
(EAGLE, Li et al. 2024). Algorithm 1 stays exact whatever the draft computes.

Stages (each reads the previous one's files in --eagle_dir):

* `features`: the target's teacher-forced features over --eagle_sequences of the
  decodes `scripts/distill_lm.py --stages=generate` cached in --out_dir (its
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
  (`specdec.models.eagle.load(directory, target)`).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distill_lm  # pylint: disable=g-import-not-at-top,wrong-import-position

from specdec import pretrained  # pylint: disable=wrong-import-position
from specdec.distributions import SamplingConfig  # pylint: disable=wrong-import-position
from specdec.models import eagle  # pylint: disable=wrong-import-position

NAME = 'smollm2_135m_instruct'
STAGES = ('features', 'train', 'evaluate')

# distill_lm's flags are shared: --out_dir (where its decodes are cached), --seed,
# --gamma and --max_new_tokens; this script's own flags are prefixed eagle_.
_DECODES, _SEED = distill_lm._OUT, distill_lm._SEED  # pylint: disable=protected-access
_GAMMA, _MAX_NEW = distill_lm._GAMMA, distill_lm._MAX_NEW  # pylint: disable=protected-access
_OUT = flags.DEFINE_string('eagle_dir', 'out/distill_eagle', 'Features, weights, logs.')
_STAGES = flags.DEFINE_list('eagle_stages', list(STAGES), f'Any of {STAGES}.')
_TEMPERATURES = flags.DEFINE_list('eagle_temperatures', ['0'],
                                  'Training decodes: 0 (greedy), 1 (sampled) or both.')
_NUM_SEQ = flags.DEFINE_integer('eagle_sequences', 2500, 'Training sequences.')
_SHORTLIST = flags.DEFINE_string(
    'eagle_head_ids',
    str(pretrained.WEIGHTS_DIR / NAME / 'draft' / pretrained.SHORTLIST_FILE),
    "The head's ids: a shortlist.json ({'ids': [...]}).")
_EPOCHS = flags.DEFINE_integer('eagle_epochs', 6, 'Passes over the training sequences.')
_BATCH = flags.DEFINE_integer('eagle_batch', 16, 'Sequences per step.')
_LENGTH = flags.DEFINE_integer('eagle_length', 160, 'Positions per sequence (longer cut).')
_LR = flags.DEFINE_float('eagle_learning_rate', 1e-3, 'Peak AdamW learning rate.')
_WARMUP = flags.DEFINE_integer('eagle_warmup_steps', 50, 'Linear warm-up steps.')
_CLS = flags.DEFINE_float('eagle_cls_weight', 0.5, 'Weight of the cross-entropy term.')
_NOISE = flags.DEFINE_float('eagle_feature_noise', 0.1, 'Uniform noise on input features.')

FEATURE_BATCH = 16


def log(message: str) -> None:
  print(f'[{time.strftime("%H:%M:%S")}] {message}', flush=True)


# ------------------------------------------------------------------------------
# Features.
# ------------------------------------------------------------------------------
def sequences(directories: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
  """(prompt ids, response ids) of every cached decode row, in file order."""
  return [(prompt, response) for d in directories
          for prompt, response, _ in distill_lm.examples(distill_lm.load_decodes(d))]


def extract(target, pad_id: int, seqs: Sequence[tuple], path: str) -> None:
  """Writes the target's features of `seqs` to `path` (.npz): tokens and float16
  features concatenated over sequences, with lengths and prompt lengths."""
  cfg, params = target.config, target.params
  forward = jax.jit(lambda t: distill_lm.final_hidden(cfg, params, t))
  order = np.argsort([len(p) + len(r) for p, r in seqs], kind='stable')
  tokens, feats = [None] * len(seqs), [None] * len(seqs)
  started = time.perf_counter()
  for i in range(0, len(order), FEATURE_BATCH):
    rows = order[i:i + FEATURE_BATCH]
    width = -(-max(len(seqs[j][0]) + len(seqs[j][1]) for j in rows) // 32) * 32
    batch = np.full((FEATURE_BATCH, width), pad_id, np.int32)
    for k, j in enumerate(rows):
      s = np.concatenate(seqs[j])
      batch[k, :len(s)] = s
    hidden = np.asarray(forward(jnp.asarray(batch)))
    for k, j in enumerate(rows):
      n = len(seqs[j][0]) + len(seqs[j][1])
      tokens[j], feats[j] = batch[k, :n], hidden[k, :n].astype(np.float16)
    if i // FEATURE_BATCH % 25 == 0:
      log(f'features: {i + len(rows)}/{len(seqs)} sequences, '
          f'{time.perf_counter() - started:.0f} s')
  np.savez(path, tokens=np.concatenate(tokens), features=np.concatenate(feats),
           lengths=np.array([len(t) for t in tokens]),
           prompt_lengths=np.array([len(p) for p, _ in seqs]))


def load_features(path: str) -> list[tuple[np.ndarray, np.ndarray, int]]:
  """(tokens, float16 features, prompt length) per sequence of `extract`'s file."""
  with np.load(path) as z:  # each key read once: an NpzFile reads it on every access
    tokens, feats, lengths, prompts = (z[k] for k in ('tokens', 'features', 'lengths',
                                                       'prompt_lengths'))
  ends = np.cumsum(lengths)
  return [(tokens[e - n:e], feats[e - n:e], int(p))
          for e, n, p in zip(ends, lengths, prompts)]


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
    mask[k, (prompt - 1 if response_only else 0):n - 1] = 1
  return tokens, feats, mask


def shifted(feats: jax.Array) -> jax.Array:
  """The feature of the position before each one (zeros first)."""
  return jnp.concatenate([jnp.zeros_like(feats[:, :1]), feats[:, :-1]], axis=1)


def make_functions(target, ids: np.ndarray, tx, cls_weight: float, noise: float):
  """(train step, held-out accuracy counts), jitted."""
  cfg = target.config
  module = eagle.FeatureLayer(cfg, len(ids))
  embedding = jnp.asarray(target.params['token_embedder']['embedding'], jnp.float32)
  head = {'embedding': jnp.asarray(eagle.output_rows(target, ids))}
  full_rows = jnp.asarray(eagle.output_rows(target, np.arange(cfg.vocab_size)))
  ids_j = jnp.asarray(ids)

  def apply(params, tokens, previous):
    variables = {'params': dict(params, head=head)}
    return module.apply(variables, jnp.take(embedding, tokens, axis=0), previous)

  def loss_fn(params, tokens, feats, mask, key):
    previous = shifted(feats)
    previous += jax.random.uniform(key, previous.shape, minval=-noise, maxval=noise)
    logits, g = apply(params, tokens, previous)
    regression = jnp.mean(optax.huber_loss(g, feats, delta=1.0), axis=-1)
    log_p = jax.nn.log_softmax(feats @ head['embedding'].T, axis=-1)
    log_q = jax.nn.log_softmax(logits, axis=-1)
    cross = -jnp.sum(jnp.exp(log_p) * log_q, axis=-1)
    total = jnp.maximum(jnp.sum(mask), 1.0)
    per = regression + cls_weight * cross
    return jnp.sum(per * mask) / total, (jnp.sum(regression * mask) / total,
                                         jnp.sum(cross * mask) / total)

  @jax.jit
  def step(params, opt_state, tokens, feats, mask, key):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, tokens, feats, mask, key)
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
    rows = list(data[i:i + batch])
    mask_rows = len(rows)
    rows += [rows[0]] * (batch - len(rows))
    tokens, feats, mask = pack(rows, length, width, response_only=True)
    mask[mask_rows:] = 0
    h, n = hits(params, tokens, feats, mask)
    right, total = right + float(h), total + float(n)
  return right / max(total, 1.0)


def train(target, ids: np.ndarray, data, held_out, out_dir: str) -> dict[str, Any]:
  cfg = target.config
  width, batch, length = cfg.hidden_size, _BATCH.value, _LENGTH.value
  steps_per_epoch = len(data) // batch
  steps = _EPOCHS.value * steps_per_epoch
  tx = optax.chain(optax.clip_by_global_norm(0.5),
                   optax.adamw(optax.warmup_cosine_decay_schedule(
                       0.0, _LR.value, _WARMUP.value, steps, _LR.value * 0.05),
                               b1=0.9, b2=0.95, weight_decay=0.0))
  params = eagle.init_params(cfg, len(ids), jax.random.key(_SEED.value))
  params = {k: v for k, v in params.items() if k != 'head'}
  # The target's final norm: the predicted feature starts on the target's scale.
  params['norm'] = jax.tree.map(jnp.asarray, target.params['final_norm'])
  opt_state = tx.init(params)
  step, hits = make_functions(target, ids, tx, _CLS.value, _NOISE.value)
  rng = np.random.default_rng(_SEED.value)
  key = jax.random.key(_SEED.value + 1)
  history = [dict(epoch=0, accuracy=accuracy(hits, params, held_out, length, width,
                                             batch))]
  log(f'train: {len(data)} sequences, {steps} steps; held-out first-token '
      f'accuracy {history[-1]["accuracy"]:.3f}')
  started = time.perf_counter()
  for epoch in range(_EPOCHS.value):
    order = rng.permutation(len(data))
    for s in range(steps_per_epoch):
      tokens, feats, mask = pack([data[j] for j in order[s * batch:(s + 1) * batch]],
                                 length, width)
      key, sub = jax.random.split(key)
      params, opt_state, loss, (regression, cross) = step(params, opt_state, tokens,
                                                          feats, mask, sub)
      if (s + 1) % 100 == 0:
        log(f'epoch {epoch + 1} step {s + 1}/{steps_per_epoch}: loss {float(loss):.3f} '
            f'(regression {float(regression):.3f}, cross-entropy {float(cross):.3f})')
    history.append(dict(epoch=epoch + 1, loss=float(loss),
                        accuracy=accuracy(hits, params, held_out, length, width, batch),
                        seconds=round(time.perf_counter() - started, 1)))
    log(f'epoch {epoch + 1}: held-out first-token accuracy '
        f'{history[-1]["accuracy"]:.3f}, {history[-1]["seconds"]:.0f} s')
  eagle.save(os.path.join(out_dir, 'draft'), params, ids)
  return dict(sequences=len(data), steps=steps, epochs=_EPOCHS.value, batch=batch,
              learning_rate=_LR.value, cls_weight=_CLS.value, feature_noise=_NOISE.value,
              history=history, minutes=round((time.perf_counter() - started) / 60, 1))


# ------------------------------------------------------------------------------
def main(argv):
  del argv
  for stage in _STAGES.value:
    if stage not in STAGES:
      raise ValueError(f'eagle_stages: unknown stage {stage!r}; have {list(STAGES)}')
  out_dir = _OUT.value
  os.makedirs(out_dir, exist_ok=True)
  target, tok = pretrained.load_lm(NAME)
  train_file = os.path.join(out_dir, 'features_train.npz')
  eval_file = os.path.join(out_dir, 'features_eval.npz')
  summary_file = os.path.join(out_dir, 'summary.json')
  summary = {}
  if os.path.exists(summary_file):
    with open(summary_file) as f:
      summary = json.load(f)

  if 'features' in _STAGES.value:
    dirs = sorted(d for t in _TEMPERATURES.value
                  for d in glob.glob(os.path.join(_DECODES.value, f'gen_train_t{t}*')))
    pool = sequences(dirs)
    if not pool:
      raise ValueError(f'out_dir: no gen_train_t* decodes in {_DECODES.value}')
    pick = np.sort(np.random.default_rng(_SEED.value).permutation(len(pool))[
        :_NUM_SEQ.value])
    started = time.perf_counter()
    extract(target, tok.pad_id, [pool[i] for i in pick], train_file)
    extract(target, tok.pad_id, sequences([os.path.join(_DECODES.value, 'gen_eval_t0')]),
            eval_file)
    summary['features'] = dict(directories=[os.path.basename(d) for d in dirs],
                               pool=len(pool), sequences=len(pick),
                               minutes=round((time.perf_counter() - started) / 60, 1))
    distill_lm.write_json(summary_file, summary)

  ids = np.asarray(json.load(open(_SHORTLIST.value))['ids'], np.int32)
  if 'train' in _STAGES.value:
    data, held_out = load_features(train_file), load_features(eval_file)
    summary['train'] = train(target, ids, data, held_out, out_dir)
    distill_lm.write_json(summary_file, summary)

  if 'evaluate' in _STAGES.value:
    draft = eagle.load(os.path.join(out_dir, 'draft'), target).with_packed_weights()
    batches = distill_lm.load_decodes(os.path.join(_DECODES.value, 'gen_eval_t0'))
    stats = distill_lm.speculative_stats(target, draft, tok, batches,
                                         SamplingConfig(temperature=0.0), _GAMMA.value,
                                         _MAX_NEW.value, _SEED.value)
    log(f'evaluate: {stats}')
    summary['evaluate'] = stats
    distill_lm.write_json(summary_file, summary)


if __name__ == '__main__':
  app.run(main)
