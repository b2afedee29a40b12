"""`python -m specdec.bench demo` (and `make demo`): the paper's Table 2 in shape, on
the shipped pairs.

    python -m specdec.bench demo [--quick | --full] [--tasks=ende,cnndm,chat] ...

Three tasks, each at temperatures 0 and 1, batch 1, as in Table 2 of Leviathan,
Kalman & Matias (ICML 2023):

* **EnDe**: the T5 pair `multi30k_ende` translates Multi30k test_2016 sentences;
* **CNN/DM**: SmolLM2-135M-Instruct (`smollm2_135m_instruct`) summarizes CNN/DM test
  articles that no shipped draft was trained on (`demo_prompts.CNNDM_ARTICLES`);
* **Chat**: the same pair answers the demo's own prompts (`lm_prompts.DEMO_PROMPTS`).

Per task and temperature, three decoders run side by side on the same inputs: the
autoregressive baseline, speculative decoding with the fixed gamma the pair's model
card names, and with the pair's `AutoGamma` rule (its measured costs and prior). One
row each shows alpha, c and v (measured in this run), the card's gamma and the
measured speed-up against Theorem 3.8's prediction, the same for AutoGamma, and
whether the temperature-0 outputs equal the baseline's; two or three outputs per task
follow the table.

Every decoder compiles once per temperature: a task's inputs share one shape (T5's
encoder length; the decoder-only prompts right-padded to one length for both of its
tasks, which the models' bucketed prefill makes nearly free), so the two SmolLM2
tasks run the same compiled programs. All programs are lowered ahead of time
(`sample.lower_speculative_sample`) and compiled in parallel threads before any is
timed; the footnote reports compile time apart from decoding. The command line keeps
compiled programs in JAX's persistent cache (`specdec.bench.compile_cache`), so a
second run compiles nothing.

`--quick`: temperature 0 and two inputs per task. `--full`: more inputs, longer
outputs and more timed rounds (the README's results table).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import concurrent.futures
import dataclasses
import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec import adaptive, pretrained, sample, theory
from specdec.bench import adaptive as bench_adaptive, cli, compile_cache, demo_prompts, report
from specdec.bench.alpha import pooled_alpha, pooled_tokens_per_iteration
from specdec.costs import step_costs
from specdec.data import EOS_ID, TRANSLATE_PREFIX
from specdec.data.lm_prompts import right_pad
from specdec.distributions import SamplingConfig

TASKS = ("ende", "cnndm", "chat")
TASK_NAMES = {"ende": "EnDe", "cnndm": "CNN/DM", "chat": "Chat"}
T5_PAIR = "multi30k_ende"
LM_PAIR = "smollm2_135m_instruct"
TASK_PAIRS = {"ende": T5_PAIR, "cnndm": LM_PAIR, "chat": LM_PAIR}
PAIRS = (LM_PAIR, T5_PAIR)

# Settings of the three sizes: (sentences, articles, chat prompts, temperatures,
# LM new tokens, T5 new tokens, timed rounds).
PRESETS = {
  "quick": dict(
    num_sentences=2,
    num_articles=1,
    num_prompts=2,
    temperatures=(0.0,),
    lm_max_new_tokens=48,
    max_new_tokens=40,
    repeats=1,
  ),
  "default": dict(
    num_sentences=8,
    num_articles=3,
    num_prompts=4,
    temperatures=(0.0, 1.0),
    lm_max_new_tokens=48,
    max_new_tokens=40,
    repeats=1,
  ),
  "full": dict(
    num_sentences=64,
    num_articles=len(demo_prompts.CNNDM_ARTICLES),
    num_prompts=8,
    temperatures=(0.0, 1.0),
    lm_max_new_tokens=96,
    max_new_tokens=40,
    repeats=3,
  ),
}
# The shortest pad length of the decoder-only prompts (a power of two holds them all).
LM_MIN_PROMPT_LENGTH = 64


@dataclasses.dataclass(frozen=True)
class Config:
  quick: bool = cli.field(
    False, "Temperature 0 only and two inputs per task (one article): the short check."
  )
  full: bool = cli.field(
    False, "More inputs, 96 new tokens for SmolLM2 and 3 timed rounds: the README's results table."
  )
  tasks: tuple[str, ...] = cli.field(TASKS, f"Tasks to run, of {', '.join(TASKS)}.")
  temperatures: tuple[float, ...] | None = cli.field(
    None, "Sampling temperatures; none: the preset's, 0,1 (--quick: 0)."
  )
  num_sentences: int | None = cli.field(
    None, "EnDe: Multi30k test sentences; none: the preset's, 8 (--quick 2, --full 64)."
  )
  num_articles: int | None = cli.field(
    None, "CNN/DM: held-out test articles; none: the preset's, 3 (--quick 1, --full 7)."
  )
  num_prompts: int | None = cli.field(
    None, "Chat: demo prompts; none: the preset's, 4 (--quick 2, --full 8)."
  )
  lm_max_new_tokens: int | None = cli.field(
    None, "CNN/DM and Chat: tokens generated at most; none: the preset's, 48 (--full 96)."
  )
  max_new_tokens: int | None = cli.field(
    None, "EnDe: tokens generated at most; none: the preset's, 40."
  )
  repeats: int | None = cli.field(
    None, "Timed rounds of each decode, the minimum counts; none: the preset's, 1 (--full 3)."
  )
  lm_draft: str = cli.field(
    "draft+lookup",
    "SmolLM2's draft: 'draft' (distilled) or "
    "'draft+lookup' (mixed with a context n-gram proposal).",
  )
  draft: str = cli.field(
    "best",
    "EnDe's draft: a shipped draft ('draft', "
    "'draft_distilled'), or 'best': per temperature the one of "
    "the higher measured alpha (model card).",
  )
  gamma: int | None = cli.field(
    None, "Fixed gamma of every task; default: per task and temperature, the model card's best."
  )
  input_length: int = cli.field(48, "EnDe: encoder length (padded).")
  seed: int = cli.field(0, "Sampling seed.")
  plot: str = cli.field("", "A PNG of predicted and measured speed-ups ('' for none).")
  progress: bool = cli.field(True, "Show a progress bar (stderr).")


def settings(config: Config) -> dict[str, Any]:
  """The preset `config` names (quick, full, or the default), with every option it
  sets explicitly taking precedence."""
  if config.quick and config.full:
    raise ValueError("quick: --quick and --full exclude each other")
  preset = PRESETS["quick" if config.quick else "full" if config.full else "default"]
  out = {k: (v if getattr(config, k) is None else getattr(config, k)) for k, v in preset.items()}
  out["temperatures"] = tuple(float(t) for t in out["temperatures"])
  return out


def _check(config: Config, s: dict[str, Any]) -> None:
  bad = [t for t in config.tasks if t not in TASKS]
  if bad or not config.tasks:
    raise ValueError(f"tasks: {list(config.tasks)} must be some of {list(TASKS)}")
  if not s["temperatures"] or any(not 0.0 <= t < float("inf") for t in s["temperatures"]):
    raise ValueError(f"temperatures must be finite and >= 0, got {s['temperatures']}")
  for name in (
    "num_sentences",
    "num_articles",
    "num_prompts",
    "lm_max_new_tokens",
    "max_new_tokens",
    "repeats",
  ):
    if s[name] < 1:
      raise ValueError(f"{name} must be >= 1, got {s[name]}")
  if config.input_length < 2:
    raise ValueError(f"input_length must be >= 2, got {config.input_length}")
  if config.gamma is not None and config.gamma < 1:
    raise ValueError(f"gamma must be >= 1, got {config.gamma}")
  base, _ = pretrained.split_lookup(config.lm_draft)
  if base != "draft":
    raise ValueError(f"lm_draft: 'draft' or 'draft+lookup', got {config.lm_draft!r}")
  if config.draft != "best" and pretrained.split_lookup(config.draft)[1]:
    raise ValueError(f"draft: EnDe's drafts have no '+lookup', got {config.draft!r}")


# ------------------------------------------------------------------------------
# Inputs.
# ------------------------------------------------------------------------------
def encode_inputs(vocab, sentences: list[str], length: int) -> list[jax.Array]:
  """Each English sentence as T5 encoder ids [1, length] (prefix, EOS, padding)."""
  return [jnp.asarray(vocab.encode_padded(TRANSLATE_PREFIX + s, length))[None] for s in sentences]


def lm_inputs(
  tokenizer, prompts: Sequence[str], pad_id: int, length: int | None = None
) -> list[jax.Array]:
  """Each user message through the chat template, right-padded with `pad_id` to
  `length` (None: the smallest power of two >= LM_MIN_PROMPT_LENGTH that holds the
  longest): [1, length] each, one compiled shape for the whole set."""
  ids = [
    tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
    for p in prompts
  ]
  if length is None:
    length = pad_length(max(len(i) for i in ids))
  return [jnp.asarray(right_pad([i], pad_id, length)) for i in ids]


def pad_length(longest: int) -> int:
  """The smallest power of two >= LM_MIN_PROMPT_LENGTH that is >= `longest`."""
  n = LM_MIN_PROMPT_LENGTH
  while n < longest:
    n *= 2
  return n


def measured_best_gamma(pair: str, temperature: float, draft: str = "draft") -> int:
  """The gamma of the highest measured speed-up at this temperature on the pair's own
  test set (`scripts/research/evaluate_pair.py`, in the model card), or 1 if none is
  recorded. A decoder-only pair's "+lookup" draft takes its own ("context_lookup" in
  the card) where the card has one."""
  info = pretrained.pair_info(pair)
  _, lookup = pretrained.split_lookup(draft)
  key = f"{temperature:g}"
  if lookup and "best_gamma" in info.get("context_lookup", {}):
    return int(info["context_lookup"]["best_gamma"].get(key, 1))
  if "best_gamma" in info:  # decoder-only pairs: {temperature: gamma}
    return int(info["best_gamma"].get(key, 1))
  for row in info.get("metrics", {}).get("best", {}).get("multi30k_test_2016", []):
    if row["temperature"] == temperature:
      return int(row["gamma"])
  return 1


@dataclasses.dataclass
class _Task:
  """One task's inputs and what its outputs are shown with."""

  name: str
  pair: str
  inputs: list[jax.Array]
  eos_id: int
  max_new_tokens: int
  examples: list[dict[str, str]]  # per input: its source text (and reference)
  decode_text: Callable[[Any], str]


class _Models:
  """The shipped pairs' models, each loaded once: {(pair, draft): (target, draft)}."""

  def __init__(self):
    self._pairs: dict[str, Any] = {}
    self._drafts: dict[tuple[str, str], Any] = {}

  def pair(self, pair: str):
    """(target, its default draft, tokenizer) of `pair`, loaded once."""
    if pair not in self._pairs:
      self._pairs[pair] = tuple(pretrained.load_pair(pair))
    return self._pairs[pair]

  def draft(self, pair: str, name: str):
    """Draft `name` of `pair` ('draft', another shipped draft, or one "+lookup")."""
    if (pair, name) not in self._drafts:
      base, lookup = pretrained.split_lookup(name)
      if base == "draft":
        model = self.pair(pair)[1]
      else:
        model = tuple(pretrained.load_pair(pair, draft=base))[1]
      self._drafts[(pair, name)] = pretrained.with_context_lookup(pair, model) if lookup else model
    return self._drafts[(pair, name)]


def _lm_text(tok, output) -> str:
  """A row's generated text, the EOS that ended it left out."""
  ids = np.asarray(output.tokens[0, : int(output.lengths[0])]).tolist()
  return tok.decode(ids[:-1] if ids and ids[-1] == tok.eos_id else ids)


def _tasks(config: Config, s: dict[str, Any], models: _Models) -> list[_Task]:
  out = []
  lm = [t for t in config.tasks if TASK_PAIRS[t] == LM_PAIR]
  if lm:
    target, _, tok = models.pair(LM_PAIR)
    prompts = {
      "cnndm": demo_prompts.cnndm_prompts(s["num_articles"]),
      "chat": demo_prompts.chat_prompts(s["num_prompts"]),
    }
    # One pad length for both tasks: they run the same compiled decoders.
    longest = max(
      len(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True))
      for t in lm
      for p in prompts[t]
    )
    length = pad_length(longest)
  for name in config.tasks:
    if name == "ende":
      _, _, vocab = models.pair(T5_PAIR)
      sentences = pretrained.test_sentences(T5_PAIR)[: s["num_sentences"]]
      out.append(
        _Task(
          name,
          T5_PAIR,
          encode_inputs(vocab, [en for en, _ in sentences], config.input_length),
          EOS_ID,
          s["max_new_tokens"],
          [dict(source=en, reference=de) for en, de in sentences],
          lambda o, vocab=vocab: vocab.decode(
            np.asarray(o.tokens[0, : int(o.lengths[0])]).tolist()
          ),
        )
      )
    else:
      out.append(
        _Task(
          name,
          LM_PAIR,
          lm_inputs(tok, prompts[name], target.pad_id, length),
          tok.eos_id,
          s["lm_max_new_tokens"],
          [dict(source=p) for p in prompts[name]],
          lambda o, tok=tok: _lm_text(tok, o),
        )
      )
  return out


# ------------------------------------------------------------------------------
# Compiling and timing.
# ------------------------------------------------------------------------------
def compile_all(
  lowered: dict[Any, sample.LoweredDecode], tick: Callable[[], None], workers: int | None = None
) -> dict[Any, Callable]:
  """Every lowered decode compiled (or read from the persistent cache), `workers` at
  a time (None: one per CPU core, at most 4): XLA compiles a program on one thread and
  releases Python's lock while it does. {key: (decode(inputs, rng), seconds its
  compile took)}."""
  if workers is None:
    workers = max(1, min(4, os.cpu_count() or 1))
  out: dict[Any, Callable] = {}

  def timed(program: sample.LoweredDecode) -> tuple[Callable, float]:
    start = time.perf_counter()
    return program.compile(), time.perf_counter() - start

  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    futures = {pool.submit(timed, program): key for key, program in lowered.items()}
    for future in concurrent.futures.as_completed(futures):
      out[futures[future]] = future.result()
      tick()
  return out


def _time_decoders(
  decoders: dict[str, Callable],
  inputs: list[jax.Array],
  key: jax.Array,
  repeats: int,
  tick: Callable[[], None],
) -> dict[str, tuple[float, list]]:
  """Every (compiled) decoder on every input, side by side (each in turn, input by
  input, so that a slow spell of the machine falls on all alike): per decoder
  (seconds per generated token: the sum over inputs of each one's minimum over
  `repeats` timed calls, over the tokens; the outputs of the first round)."""
  best = {name: [] for name in decoders}
  outs = {name: [] for name in decoders}
  for i, x in enumerate(inputs):
    k = jax.random.fold_in(key, i)
    times = {name: float("inf") for name in decoders}
    for r in range(repeats):
      for name, decode in decoders.items():
        start = time.perf_counter()
        out = jax.block_until_ready(decode(x, k))
        times[name] = min(times[name], time.perf_counter() - start)
        if r == 0:
          outs[name].append(out)
        tick()
    for name in decoders:
      best[name].append(times[name])
  return {
    name: (
      sum(best[name]) / max(int(sum(int(np.sum(o.lengths)) for o in outs[name])), 1),
      outs[name],
    )
    for name in decoders
  }


def _pooled(outputs) -> Any:
  return jax.tree.map(lambda *xs: np.concatenate(xs), *[o.stats for o in outputs])


def _identical(base_out: list, spec_out: list) -> bool:
  return all(bool(jnp.array_equal(b.tokens, s.tokens)) for b, s in zip(base_out, spec_out))


def _nonfinite(outputs: list) -> int:
  return int(sum(int(np.sum(o.stats.nonfinite)) for o in outputs))


def _row(
  task: _Task,
  temperature: float,
  draft_name: str,
  gamma: int,
  costs: dict,
  rule: adaptive.AutoGamma,
  timed: dict,
) -> dict[str, Any]:
  """One Table-2-style row: the fixed gamma's alpha, c, v, measured and predicted
  speed-up (Theorem 3.8 with the measured v), AutoGamma's, and at temperature 0
  whether both speculative decodes equal the baseline."""
  base_s, base_out = timed["baseline"]
  fixed_s, fixed_out = timed["fixed"]
  auto_s, auto_out = timed["auto"]
  stats = _pooled(fixed_out)
  alpha = pooled_alpha(stats)
  predicted = float(theory.walltime_improvement(alpha, gamma, costs["c"], costs["v"]))
  auto_stats = _pooled(auto_out)
  counts = np.sum(np.asarray(auto_stats.gamma_counts), axis=0)
  auto_predicted = bench_adaptive.speedup_in_steps(rule, auto_out, base_out)
  row = dict(
    task=task.name,
    pair=task.pair,
    temperature=temperature,
    draft=draft_name,
    inputs=len(task.inputs),
    gamma=gamma,
    alpha=alpha,
    c=costs["c"],
    v=costs["v"],
    tokens_per_iteration=pooled_tokens_per_iteration(stats),
    eq1_tokens_per_iteration=float(theory.expected_tokens(alpha, gamma)),
    baseline_ms_per_token=base_s * 1e3,
    speculative_ms_per_token=fixed_s * 1e3,
    speedup=base_s / fixed_s,
    predicted_speedup=predicted,
    measured_over_predicted=base_s / fixed_s / predicted,
    auto_gammas=list(rule.gammas),
    auto_histogram={str(g): int(n) for g, n in zip(rule.gammas, counts)},
    auto_ms_per_token=auto_s * 1e3,
    auto_speedup=base_s / auto_s,
    auto_predicted_speedup=auto_predicted,
    auto_measured_over_predicted=base_s / auto_s / auto_predicted,
    costs=costs,
    nonfinite_positions=_nonfinite(base_out + fixed_out + auto_out),
  )
  if temperature == 0.0:
    row["identical_fixed"] = _identical(base_out, fixed_out)
    row["identical_auto"] = _identical(base_out, auto_out)
    row["identical_to_baseline"] = row["identical_fixed"] and row["identical_auto"]
  return row


class _Bar:
  """One progress bar for the whole demo (tqdm, on stderr), or nothing."""

  def __init__(self, total: int, enabled: bool):
    self._bar = None
    if enabled:
      self._bar = cli.progress_bar(total=total, desc="demo", unit="step", dynamic_ncols=True)

  def describe(self, text: str) -> None:
    if self._bar is not None:
      self._bar.set_description(text)

  def set_total(self, total: int) -> None:
    if self._bar is not None:
      self._bar.total = total
      self._bar.refresh()

  def tick(self, n: int = 1) -> None:
    if self._bar is not None:
      self._bar.update(n)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


def _decode_steps(s: dict[str, Any], plan: list[dict[str, Any]]) -> int:
  """Progress steps after the programs: a cost measurement and 3 decoders x repeats
  x inputs calls per task and temperature."""
  return sum(1 + 3 * s["repeats"] * len(item["task"].inputs) for item in plan)


def _plan(
  config: Config, s: dict[str, Any], tasks: list[_Task], models: _Models
) -> tuple[list[dict[str, Any]], dict[Any, Callable[[], sample.LoweredDecode]]]:
  """Per task and temperature: its draft, gamma, rule and the keys of its three
  decoders' programs; and one lowering per distinct program (the two SmolLM2 tasks
  share theirs), {key: () -> `sample.LoweredDecode`}."""
  plan, programs = [], {}
  key = jax.random.key(config.seed)
  for task in tasks:
    target = models.pair(task.pair)[0]
    x = task.inputs[0]
    for temperature in s["temperatures"]:
      if task.pair == LM_PAIR:
        draft_name = config.lm_draft
      else:
        draft_name = (
          pretrained.best_draft(task.pair, temperature) if config.draft == "best" else config.draft
        )
      draft = models.draft(task.pair, draft_name)
      gamma = (
        measured_best_gamma(task.pair, temperature, draft_name)
        if config.gamma is None
        else config.gamma
      )
      rule = pretrained.auto_gamma(task.pair, temperature, 1, draft_name)
      common = dict(
        max_new_tokens=task.max_new_tokens,
        sampling=SamplingConfig(temperature=temperature),
        eos_id=task.eos_id,
      )
      shape = (task.pair, temperature, x.shape, task.max_new_tokens, task.eos_id)
      keys = dict(
        baseline=("baseline", *shape),
        fixed=("speculative", draft_name, gamma, *shape),
        auto=("speculative", draft_name, rule, *shape),
      )
      programs.setdefault(
        keys["baseline"],
        functools.partial(sample.lower_autoregressive_sample, target, x, key, **common),
      )
      for name, choice in (("fixed", gamma), ("auto", rule)):
        programs.setdefault(
          keys[name],
          functools.partial(
            sample.lower_speculative_sample, target, draft, x, key, gamma=choice, **common
          ),
        )
      plan.append(
        dict(
          task=task,
          temperature=temperature,
          draft_name=draft_name,
          draft=draft,
          gamma=gamma,
          rule=rule,
          programs=keys,
        )
      )
  return plan, programs


def _compile_rank(key: tuple) -> int:
  """Programs ordered by their expected compile time: AutoGamma rules by their number
  of gammas (each has its own verification and draft branch), then a fixed gamma, then
  the baseline."""
  if key[0] != "speculative":
    return 1
  choice = key[2]
  return 0 if isinstance(choice, int) else -len(choice.gammas)


def _program_name(key: tuple) -> str:
  """A program's key as text: 'pair baseline|gamma=g|AutoGamma(...) temperature t'."""
  kind, rest = key[0], key[1:]
  if kind == "speculative":
    draft, choice, rest = rest[0], rest[1], rest[2:]
    what = (
      f"{draft} gamma={choice}"
      if isinstance(choice, int)
      else f"{draft} AutoGamma{tuple(choice.gammas)}"
    )
  else:
    what = "baseline"
  return f"{rest[0]} {what} temperature {rest[1]:g}"


def run(config: Config) -> dict[str, Any]:
  """The demo: {"rows": one per task and temperature, "examples": {task: outputs},
  "seconds": {load, compile, decode, total, programs: per program its trace and
  lower and its compile seconds}, "settings": ...}. Every decode program is
  lowered, then all are compiled (in parallel threads) before any is timed: the
  compile time is apart from the decoding. Raises RuntimeError when a temperature-0
  decode differs from the baseline (it must not)."""
  s = settings(config)
  _check(config, s)
  if config.draft != "best" and config.draft not in pretrained.drafts(T5_PAIR):
    raise ValueError(
      f"draft must be 'best' or one of {list(pretrained.drafts(T5_PAIR))}, got {config.draft!r}"
    )
  start = time.perf_counter()
  pairs = list(dict.fromkeys(TASK_PAIRS[t] for t in config.tasks))
  bar = _Bar(len(pairs), config.progress)
  try:
    models = _Models()
    bar.describe("loading the pairs")
    for pair in pairs:
      models.pair(pair)
      bar.tick()
    tasks = _tasks(config, s, models)
    load_s = time.perf_counter() - start
    plan, programs = _plan(config, s, tasks, models)
    bar.set_total(len(pairs) + 2 * len(programs) + _decode_steps(s, plan))
    bar.describe(f"compiling {len(programs)} decode programs")
    lowered, lower_s = {}, {}
    for name, lower in programs.items():
      begin = time.perf_counter()
      lowered[name] = lower()
      lower_s[name] = time.perf_counter() - begin
      bar.tick()
    # The longest compiles first (a rule's: one verification per gamma), so that no
    # long one is left to run alone at the end.
    order = sorted(lowered, key=_compile_rank)
    compiled = compile_all({name: lowered[name] for name in order}, bar.tick)
    program_seconds = [
      dict(program=_program_name(name), trace_and_lower=lower_s[name], compile=compiled[name][1])
      for name in programs
    ]
    compile_s = time.perf_counter() - start - load_s
    rows, examples, costs_cache = [], {}, {}
    key = jax.random.key(config.seed)
    for item in plan:
      task, temperature, gamma = item["task"], item["temperature"], item["gamma"]
      bar.describe(f"{TASK_NAMES[task.name]}, temperature {temperature:g}")
      target = models.pair(task.pair)[0]
      # c and v depend on the models, gamma and the cache's shape, not on the
      # temperature: measured once per pair, draft, gamma and input shape.
      cost_key = (task.pair, item["draft_name"], gamma, task.inputs[0].shape, task.max_new_tokens)
      if cost_key not in costs_cache:
        costs_cache[cost_key] = step_costs(
          target,
          item["draft"],
          task.inputs[0],
          gamma,
          task.max_new_tokens + gamma + 1,
          repeats=2,
          steps=8,
          rounds=2,
        )
      bar.tick()
      timed = _time_decoders(
        {name: compiled[k][0] for name, k in item["programs"].items()},
        task.inputs,
        jax.random.fold_in(key, len(rows)),
        s["repeats"],
        bar.tick,
      )
      rows.append(
        _row(
          task,
          temperature,
          item["draft_name"],
          gamma,
          costs_cache[cost_key],
          item["rule"],
          timed,
        )
      )
      if temperature == s["temperatures"][0]:
        examples[task.name] = [
          dict(e, output=task.decode_text(o))
          for e, o in zip(task.examples[:3], timed["fixed"][1][:3])
        ]
  finally:
    bar.close()
  total = time.perf_counter() - start
  result = dict(
    rows=rows,
    examples=examples,
    seconds=dict(
      load=load_s,
      compile=compile_s,
      decode=total - load_s - compile_s,
      total=total,
      programs=program_seconds,
    ),
    settings=dict(
      s,
      tasks=list(config.tasks),
      lm_draft=config.lm_draft,
      cnndm_articles=list(demo_prompts.CNNDM_ARTICLES[: s["num_articles"]]),
      lm_prompt_length=next((int(t.inputs[0].shape[1]) for t in tasks if t.pair == LM_PAIR), None),
      backend=jax.devices()[0].platform,
      compilation_cache=compile_cache.current(),
    ),
  )
  if config.plot:
    os.makedirs(os.path.dirname(os.path.abspath(config.plot)), exist_ok=True)
    save_plot(result, config.plot)
  differ = [
    f"{r['task']} ({r['draft']})"
    for r in rows
    if r["temperature"] == 0.0 and not r["identical_to_baseline"]
  ]
  if differ:
    raise RuntimeError(f"temperature 0 output differs from the baseline: {differ}")
  return result


# ------------------------------------------------------------------------------
# Output.
# ------------------------------------------------------------------------------
def _ratio(measured: float, predicted: float) -> str:
  return f"{measured:.2f}x / {predicted:.2f}x"


def format_table(result: dict[str, Any]) -> str:
  rows = []
  for r in result["rows"]:
    chosen = " ".join(f"{g}:{n}" for g, n in r["auto_histogram"].items() if n)
    same = (
      "-" if "identical_to_baseline" not in r else "yes" if r["identical_to_baseline"] else "NO"
    )
    rows.append(
      [
        TASK_NAMES.get(r["task"], r["task"]),
        r["draft"],
        report.temp_key(r["temperature"]),
        f"{r['alpha']:.2f}",
        f"{r['c']:.3f}",
        f"{r['v']:.2f}",
        str(r["gamma"]),
        _ratio(r["speedup"], r["predicted_speedup"]),
        chosen or "-",
        _ratio(r["auto_speedup"], r["auto_predicted_speedup"]),
        same,
      ]
    )
  return report.markdown_table(
    [
      "task",
      "draft",
      "temp",
      "alpha",
      "c",
      "v",
      "gamma",
      "speed-up (meas / pred)",
      "AutoGamma gamma:iterations",
      "AutoGamma (meas / pred)",
      "T=0 identical",
    ],
    rows,
  )


def _footnote(result: dict[str, Any]) -> str:
  s, t = result["settings"], result["seconds"]
  tasks = []
  for row in result["rows"]:
    name = row["task"]
    if any(name == x.split(":")[0] for x in tasks):
      continue
    what = dict(
      ende=f"{row['inputs']} Multi30k test_2016 sentences, T5 pair "
      f"{T5_PAIR}, {s['max_new_tokens']} new tokens at most",
      cnndm=f"{row['inputs']} held-out CNN/DM test articles (file indices "
      f"{', '.join(map(str, s['cnndm_articles']))}), SmolLM2-135M-"
      f"Instruct, {s['lm_max_new_tokens']} new tokens at most",
      chat=f"{row['inputs']} demo prompts, SmolLM2-135M-Instruct, "
      f"{s['lm_max_new_tokens']} new tokens at most",
    )[name]
    if name != "ende" and s.get("lm_prompt_length"):
      what += f", prompts right-padded to {s['lm_prompt_length']} tokens"
    tasks.append(f"{name}: {what}")
  cache = s["compilation_cache"] or "off (SPECDEC_CACHE_DIR)"
  return "\n".join(
    [
      f"Batch 1, {s['backend']}, float32; {'; '.join(tasks)}.",
      "alpha: pooled over the fixed-gamma decodes; c = t_q / t_p1 and v = "
      "t_p(gamma+1) / t_p1, each step timed inside a compiled loop in this run; "
      "gamma: the model card's best; predicted = E[tokens] / (gamma c + v) (Theorem "
      "3.8 with the measured v; the paper's premise is v = 1); AutoGamma predicted "
      "with the gammas it chose and the card's costs; speed-ups: baseline ms/token "
      f"over speculative, the minimum of {s['repeats']} timed round(s) per input.",
      f"Time: {t['total']:.0f} s in all: loading {t['load']:.0f} s, compiling "
      f"{t['compile']:.0f} s (tracing, lowering and compiling every decode loop), "
      f"decoding and timing {t['decode']:.0f} s. Compilation cache: {cache}.",
    ]
  )


def _render_examples(result: dict[str, Any]) -> list[str]:
  lines = []
  for task, examples in result["examples"].items():
    lines.append(
      f"\n{TASK_NAMES.get(task, task)} (temperature "
      f"{result['settings']['temperatures'][0]:g}, speculative):"
    )
    for e in examples[:3]:
      source = e["source"] if len(e["source"]) <= 160 else e["source"][:157] + "..."
      if "reference" in e:
        lines.append(f"  EN   {source}\n  REF  {e['reference']}\n  OUT  {e['output']}")
      else:
        lines.append(f"  IN   {source}\n  OUT  {e['output']}")
  return lines


def render(result: dict[str, Any]) -> str:
  lines = [
    "Speculative decoding on the shipped pairs: the paper's Table 2 in shape",
    "",
    format_table(result),
    "",
    _footnote(result),
  ]
  for row in result["rows"]:
    if row["nonfinite_positions"]:
      lines.append(
        f"WARNING: {row['task']}, temperature {row['temperature']:g}: "
        f"{row['nonfinite_positions']} decoded positions had non-finite "
        "logits (NaN, +inf or no finite value): the model is broken there"
      )
  return "\n".join(lines + _render_examples(result))


def save_plot(result: dict[str, Any], path: str) -> None:
  """Predicted speed-up against gamma per row (its alpha, c and v), and the measured
  one at the card's gamma."""
  from specdec import _optional

  matplotlib = _optional.require("matplotlib", "bench", purpose="the plot")
  matplotlib.use("Agg")
  plt = _optional.require("matplotlib.pyplot", "bench", purpose="the plot")
  gammas = np.arange(1, 9)
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in result["rows"]:
    curve = theory.walltime_improvement(r["alpha"], gammas, r["c"], v=r["v"])
    label = f"{TASK_NAMES.get(r['task'], r['task'])}, temp {r['temperature']:g}"
    (line,) = ax.plot(gammas, curve, label=f"predicted, {label} (alpha {r['alpha']:.2f})")
    ax.plot([r["gamma"]], [r["speedup"]], "o", color=line.get_color(), label=f"measured, {label}")
  ax.axhline(1.0, color="gray", lw=0.5)
  ax.set_xlabel("gamma")
  ax.set_ylabel("speed-up over the baseline")
  ax.set_title(f"the demo's tasks on {result['settings']['backend']}")
  ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
