r"""The paper's Table 3 ("GPT-like" row) and Table 4 for the decoder-only shipped pair.

    python scripts/bench_lm_pair.py [--lmp_prompts=4] [--lmp_max_new_tokens=32] \
        [--lmp_gammas=1,2,3,4,5,6,7,8] [--lmp_repeats=2] [--lmp_json=out/bench_lm_pair.json]

Leviathan, Kalman & Matias (ICML 2023) report, for a 97M "GPT-like" decoder-only
target on lm1b, alpha = 0.03 (unigram draft), 0.05 (bigram) and 0.88 / 0.89 (a 6M
GPT-like draft) at temperature 0 / 1 (Table 3). This measures the same for the pair
`smollm2_135m_instruct` (`specdec.pretrained.load_pair`: the real SmolLM2-135M-Instruct
target and its distilled Llama draft) on the pair's held-out chat prompts (the user
messages, the chat template applied with add_generation_prompt=True, right-padded
with the target's pad_id), float32, on this machine:

* alpha of four drafts at temperatures 0 and 1: a unigram and a bigram draft
  (`specdec.models.ngram`, add-1 smoothing), the distilled draft, and the distilled
  draft mixed with a context n-gram proposal ("distilled+lookup",
  `specdec.models.lookup`: the token that followed the last 2-4 tokens where they
  occurred before in the prompt or output). The n-gram drafts
  count, by default (`--lmp_ngram_corpus=target_outputs`), the target's own greedy
  outputs (`--lmp_ngram_max_new_tokens` each) on the first `--lmp_ngram_prompts`
  training-side prompts of `specdec.lm_prompts.split()` (whose texts are disjoint
  from the held-out ones), each preceded by the target's start token; with
  `--lmp_ngram_corpus=text`, token streams of the shipped CNN/DM articles and
  newstest2014 German references instead. Two estimates of the paper's alpha =
  E[beta], beta = sum_x min(p(x), q(x)) (Definition 3.1): teacher-forced along the
  target's own decodes of the prompts at that temperature
  (`benchmarking.teacher_forced_alpha`: `teacher_forced_betas` with the target's pass
  shared by the drafts; pooled over positions, the paper's way), and
  along speculative decodes at gamma `--lmp_alpha_gamma` (`benchmarking.pooled_alpha`:
  the sampler's own stats; the distilled draft's are the sweep's decodes at that
  gamma);
* c = t_q / t_p(1) of the sweep's draft (`--lmp_sweep_draft`, by default
  distilled+lookup) and v(k) = t_p(k) / t_p(1) for every chunk
  k = gamma + 1 of the sweep (`benchmarking.verify_costs`: each one `extend` inside a
  compiled loop, minimum over interleaved rounds);
* a batch-1 gamma sweep with that draft at each temperature: the baseline
  and speculative decoding at every gamma timed side by side, prompt by prompt, each
  decoder in turn in every round, the minimum of `--lmp_repeats`
  (`benchmarking.time_decodes_paired`); ms/token and the measured speed-up (every
  prompt's prefill included, as in the other benchmarks, and without it: the
  measured prefill of a prompt subtracted, which is the loop that Eq. 1 and
  Theorem 3.8 model), tokens per iteration, Eq. 1's expected tokens from the
  teacher-forced alpha, the predicted speed-up E[tokens] / (gamma c + v(gamma + 1))
  (Theorem 3.8 with the measured v; the paper's v = 1 beside it), measured /
  predicted, the best gamma per temperature, and at temperature 0 whether every
  speculative decode equals the baseline's token for token;
* with `--lmp_skip_layers`, the alpha of the target itself with some decoder layers
  skipped (self-speculative drafts, `llama.Llama.with_layers`);
* Table 4: expected (Eq. 1 from alpha; Theorem 3.8 from alpha and c, the paper's
  "EXP") against empirical (tokens per iteration; the measured speed-up, "EMP") at
  every gamma.

Prints the tables in Markdown and writes them with every number as JSON
(`--lmp_json`) and Markdown (beside it, .md). The default run (4 prompts, 32 new
tokens, gammas 1..8, 2 timed rounds; most of its time is compiling a decode per gamma
and temperature) is sized for ~10 minutes on a 2-core CPU; the timings mean something
only on an otherwise idle machine. Prompts are right-padded to the longest, so one
shape compiles per decoder and every prompt's prefill covers that length.

Every flag is prefixed `lmp_`: the tests import this script with others into one
process, where absl's flags share one registry.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec import benchmarking, data, pretrained, theory
from specdec.distributions import SamplingConfig
from specdec.models import ngram
from specdec.models.base import DecodeModel
from specdec.sample import autoregressive_sample, speculative_sample

PAIR = "smollm2_135m_instruct"
DISTILLED = "distilled"
NGRAM_DRAFTS = ("unigram", "bigram")
# The distilled draft mixed with a context n-gram proposal (`specdec.models.lookup`,
# `pretrained.load_pair(name, draft="draft+lookup")`): the paper has no such row.
LOOKUP = "distilled+lookup"
DRAFTS = NGRAM_DRAFTS + (DISTILLED, LOOKUP)
# Table 3 of the paper, the GPT-like (97M) target on lm1b: alpha per draft and
# temperature; its "distilled" row is the 6M GPT-like draft.
PAPER_TABLE3 = {"target": "GPT-like (97M), lm1b",
                "drafts": {"unigram": "unigram", "bigram": "bigram",
                           DISTILLED: "GPT-like (6M)"},
                "alpha": {"unigram": {"0": 0.03, "1": 0.03},
                          "bigram": {"0": 0.05, "1": 0.05},
                          DISTILLED: {"0": 0.88, "1": 0.89}}}
NGRAM_CORPORA = ("target_outputs", "text")
# Shipped text for the "text" n-gram corpus: what the target is asked about (CNN/DM
# articles) and answers in (newstest2014's German references).
TEXT_SOURCES = ((data.CNNDM_TASK, "article"), (data.WMT_TASK, "de"))

_PAIR = flags.DEFINE_string("lmp_pair", PAIR, "The shipped decoder-only pair.")
_PROMPTS = flags.DEFINE_integer("lmp_prompts", 4, "Held-out prompts (from the first).")
_MAX_NEW = flags.DEFINE_integer("lmp_max_new_tokens", 32, "Tokens generated at most.")
_GAMMAS = flags.DEFINE_list("lmp_gammas", [str(g) for g in range(1, 9)],
                            "The sweep's gammas.")
_TEMPS = flags.DEFINE_list("lmp_temperatures", ["0", "1"], "Temperatures.")
_REPEATS = flags.DEFINE_integer("lmp_repeats", 2, "Timed rounds per sweep decode (min).")
_BATCH = flags.DEFINE_integer("lmp_batch", 8, "Rows per decode of the alpha passes.")
_ALPHA_GAMMA = flags.DEFINE_integer("lmp_alpha_gamma", 4,
                                    "gamma of the speculative decodes that give the "
                                    "empirical alpha of every draft.")
_NGRAM_CORPUS = flags.DEFINE_enum(
    "lmp_ngram_corpus", "target_outputs", list(NGRAM_CORPORA),
    "What the unigram / bigram drafts count: the target's greedy outputs on the "
    "pair's training prompts, or shipped text (CNN/DM articles, newstest2014 German).")
_NGRAM_PROMPTS = flags.DEFINE_integer("lmp_ngram_prompts", 32,
                                      "target_outputs: training prompts decoded.")
_NGRAM_MAX_PROMPT = flags.DEFINE_integer("lmp_ngram_max_prompt_tokens", 200,
                                         "target_outputs: training prompts of at most "
                                         "this many ids.")
_NGRAM_NEW = flags.DEFINE_integer("lmp_ngram_max_new_tokens", 64,
                                  "target_outputs: tokens per training decode.")
_COST_ROUNDS = flags.DEFINE_integer("lmp_cost_rounds", 3, "Interleaved rounds of c, v.")
_COST_REPEATS = flags.DEFINE_integer("lmp_cost_repeats", 2, "Repeats per round (min).")
_COST_STEPS = flags.DEFINE_integer("lmp_cost_steps", 8, "extend calls per timed loop.")
_PACKED = flags.DEFINE_bool(
    "lmp_packed_weights", True, "Target and distilled draft with packed weights "
    "(`llama.Llama.with_packed_weights`: a CPU verifies a chunk reading each weight "
    "once; bfloat16 packs for the draft's bfloat16 values); a no-op where "
    "specdec.kernels is not enabled.")
_SWEEP_DRAFT = flags.DEFINE_enum("lmp_sweep_draft", LOOKUP, [DISTILLED, LOOKUP],
                                 "The draft of the gamma sweep and of c.")
_SEED = flags.DEFINE_integer("lmp_seed", 0, "Sampling keys.")
_SKIP = flags.DEFINE_multi_string(
    "lmp_skip_layers", [], "Also measure alpha for the target with these decoder "
    "layers skipped (comma-separated indices, e.g. 21,23,25,27; repeat the flag for "
    "more): self-speculative drafts (`llama.Llama.with_layers`).")
_JSON = flags.DEFINE_string("lmp_json", "out/bench_lm_pair.json", "JSON output (and .md).")


def temp_key(temperature: float) -> str:
  """'0', '1', '0.7': a temperature as a JSON key."""
  return f"{float(temperature):g}"


# ------------------------------------------------------------------------------
# Prompts and n-gram drafts.
# ------------------------------------------------------------------------------
def chat_ids(tok, messages: Sequence[str]) -> list[list[int]]:
  """Each user message with the chat template and the assistant's generation prompt."""
  return [list(tok.apply_chat_template([{"role": "user", "content": m}],
                                       add_generation_prompt=True)) for m in messages]


def target_output_corpus(target: DecodeModel, prompts: Sequence[Sequence[int]],
                         eos_id: int, max_new_tokens: int, batch: int
                         ) -> list[list[int]]:
  """Per prompt, [the target's start token (the prompt's last), its greedy output up
  to and including EOS]: what a draft sees and must predict when drafting for the
  target (the n-gram drafts take no start token of their own)."""
  inputs = benchmarking.right_pad(prompts, getattr(target, "pad_id", None))
  corpus = []
  greedy = SamplingConfig(temperature=0.0)
  for x, size in benchmarking.batched(inputs, batch):
    out = autoregressive_sample(target, x, jax.random.key(0),
                                max_new_tokens=max_new_tokens, sampling=greedy,
                                eos_id=eos_id)
    start = np.asarray(target.start_tokens(x))
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    corpus += [[int(start[b])] + tokens[b, :lengths[b]].tolist() for b in range(size)]
  return corpus


def text_corpus(tok, eos_id: int, exclude: Sequence[str] = ()) -> list[list[int]]:
  """Token streams of the shipped text (`TEXT_SOURCES`), each ended by EOS; examples
  whose first 64 characters occur in a string of `exclude` (the held-out prompts) are
  left out."""
  corpus = []
  for task, field in TEXT_SOURCES:
    for example in data.load_examples(task):
      text = example[field]
      if text and any(text[:64] in e for e in exclude):
        continue
      corpus.append(tok.encode(text, add_special_tokens=False) + [eos_id])
  return corpus


def ngram_drafts(corpus: Sequence[Sequence[int]], vocab_size: int
                 ) -> dict[str, DecodeModel]:
  """The Table 3 unigram and bigram drafts of a token corpus (add-1 smoothing; no
  start token: both models are fed the target's, the prompt's last token)."""
  return dict(unigram=ngram.Unigram.from_corpus(corpus, vocab_size),
              bigram=ngram.Bigram.from_corpus(corpus, vocab_size, start_token=None))


# ------------------------------------------------------------------------------
# Measurements.
# ------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("max_length",))
def _init(model, inputs, max_length):
  return model.init(inputs, max_length)


def prefill_seconds(models: Mapping[str, DecodeModel], inputs: jax.Array,
                    max_length: int, repeats: int = 2, rounds: int = 3
                    ) -> dict[str, float]:
  """{name: seconds of `model.init(inputs, max_length)`}, the prompt's prefill that
  every decode of `inputs` [1, S] starts with (S - 1 positions, whatever the prompt's
  own length: the padding is fed too); minimum over interleaved rounds."""
  best = {name: float("inf") for name in models}
  for _ in range(rounds):
    for name, model in models.items():
      best[name] = min(best[name], benchmarking.min_seconds(
          lambda m=model: _init(m, inputs, max_length), repeats))
  return best


def _rows(tree, size: int):
  return jax.tree.map(lambda a: np.asarray(a)[:size], tree)


def _concat(trees):
  return jax.tree.map(lambda *xs: np.concatenate(xs), *trees)


def time_sweep(target: DecodeModel, draft: DecodeModel, inputs: Sequence[jax.Array],
               eos_id: int, temperature: float, gammas: Sequence[int],
               max_new_tokens: int, repeats: int, key: jax.Array
               ) -> dict[str, tuple[float, list[Any]]]:
  """The batch-1 decodes of one temperature: the baseline ("baseline") and speculative
  decoding at every gamma ("gamma_<g>") timed side by side, prompt by prompt, each in
  turn in every round (`benchmarking.time_decodes_paired`) over `inputs` (each [1,
  S]). Returns {name: (seconds per generated token, outputs per prompt)}."""
  sampling = SamplingConfig(temperature=temperature)
  decoders = {"baseline": benchmarking.autoregressive_decoder(target, max_new_tokens,
                                                              sampling, eos_id)}
  for g in gammas:
    decoders[f"gamma_{g}"] = benchmarking.speculative_decoder(
        target, draft, g, max_new_tokens, sampling, eos_id)
  return benchmarking.time_decodes_paired(decoders, list(inputs), key, repeats)


def measure_alpha(target: DecodeModel, drafts: Mapping[str, DecodeModel],
                  inputs: np.ndarray, baseline: Sequence[Any], eos_id: int,
                  temperature: float, max_new_tokens: int, batch: int, gamma: int,
                  key: jax.Array, decoded: Mapping[str, Sequence[Any]] | None = None
                  ) -> dict[str, dict[str, Any]]:
  """alpha of every draft at one temperature over `inputs` [N, S] (module doc).

  Args:
    baseline: the target's decodes of the N rows at this temperature, one
      `SampleOutput` of [1, ...] per row (the sweep's): alpha is teacher-forced along
      them.
    decoded: {draft: speculative outputs of the N rows at `gamma`} already made (the
      sweep's); the other drafts decode `inputs` in batches of `batch` here.

  Returns:
    {draft: {"teacher_forced": pooled beta along the target's decodes,
    "teacher_forced_positions", "empirical": `pooled_alpha` of speculative decodes
    at `gamma`, "empirical_positions", "tokens_per_iteration" of those decodes,
    "gamma"}}.
  """
  sampling = SamplingConfig(temperature=temperature)
  betas = {name: [] for name in drafts}
  for i, out in enumerate(baseline):
    x = jnp.asarray(inputs[i:i + 1])
    for name, rows in benchmarking.teacher_forced_alpha(
        target, dict(drafts), x, out.tokens, out.lengths, sampling).items():
      betas[name] += rows
  decoded = dict(decoded or {})
  result = {}
  for name, draft in drafts.items():
    if name in decoded:
      stats = _concat([o.stats for o in decoded[name]])
    else:
      parts = []
      for i, (x, size) in enumerate(benchmarking.batched(inputs, batch)):
        out = speculative_sample(target, draft, x, jax.random.fold_in(key, i),
                                 gamma=gamma, max_new_tokens=max_new_tokens,
                                 sampling=sampling, eos_id=eos_id)
        parts.append(_rows(out.stats, size))
      stats = _concat(parts)
    tf = np.concatenate(betas[name])
    result[name] = dict(teacher_forced=float(tf.mean()) if tf.size else float("nan"),
                        teacher_forced_positions=int(tf.size),
                        empirical=benchmarking.pooled_alpha(stats),
                        empirical_positions=int(np.sum(stats.beta_count)),
                        tokens_per_iteration=benchmarking.pooled_tokens_per_iteration(
                            stats),
                        gamma=gamma)
  return result


def sweep_rows(timed: Mapping[str, tuple[float, list[Any]]], draft_name: str,
               temperature: float, gammas: Sequence[int], alpha: float,
               costs: Mapping[str, Any], prefill: Mapping[str, float] | None = None
               ) -> list[dict[str, Any]]:
  """The sweep's rows from `time_sweep`'s result: `alpha` (teacher-forced) gives
  Eq. 1 and the prediction; `costs` is `benchmarking.verify_costs`' result (c, and v
  at every gamma + 1).

  With `prefill` ({"target": s, "draft": s}, `prefill_seconds`), each row also has
  the decode loop's own figures ("*_decode"): every prompt's prefill (the target's;
  the target's and the draft's for speculative decoding) subtracted from the timed
  seconds, which is what Eq. 1 and Theorem 3.8 model."""
  base_s, base_out = timed["baseline"]
  base_tokens = int(sum(np.sum(o.lengths) for o in base_out))
  rows = []
  for g in gammas:
    spec_s, spec_out = timed[f"gamma_{g}"]
    stats = _concat([o.stats for o in spec_out])
    v = costs["v"][g + 1]
    predicted = benchmarking.predicted_speedup(alpha, g, costs["c"], v)
    row = dict(temperature=float(temperature), draft=draft_name, gamma=int(g),
               alpha=alpha, alpha_empirical=benchmarking.pooled_alpha(stats),
               tokens_per_iteration=benchmarking.pooled_tokens_per_iteration(stats),
               eq1=float(theory.expected_tokens(alpha, g)), c=costs["c"], v=v,
               baseline_ms_per_token=base_s * 1e3, speculative_ms_per_token=spec_s * 1e3,
               speedup=base_s / spec_s, predicted_speedup=predicted,
               predicted_speedup_paper=benchmarking.predicted_speedup(alpha, g,
                                                                      costs["c"]),
               measured_over_predicted=(base_s / spec_s) / predicted,
               baseline_tokens=base_tokens,
               speculative_tokens=int(sum(np.sum(o.lengths) for o in spec_out)),
               nonfinite=int(np.sum(stats.nonfinite)))
    if prefill is not None:
      n = len(base_out)
      base_loop = base_s * base_tokens - n * prefill["target"]
      spec_loop = (spec_s * row["speculative_tokens"]
                   - n * (prefill["target"] + prefill["draft"]))
      row.update(baseline_ms_per_token_decode=base_loop * 1e3 / max(base_tokens, 1),
                 speculative_ms_per_token_decode=(spec_loop * 1e3
                                                  / max(row["speculative_tokens"], 1)))
      row["speedup_decode"] = (row["baseline_ms_per_token_decode"]
                               / row["speculative_ms_per_token_decode"])
      row["measured_over_predicted_decode"] = row["speedup_decode"] / predicted
    if temperature == 0:
      same = [bool(np.array_equal(np.asarray(b.tokens), np.asarray(s.tokens))
                   and np.array_equal(np.asarray(b.lengths), np.asarray(s.lengths)))
              for b, s in zip(base_out, spec_out)]
      row["identical_rows"] = int(sum(same))
      row["identical_to_baseline"] = all(same)
    rows.append(row)
    logging.info("%s", {k: round(x, 3) if isinstance(x, float) else x
                        for k, x in row.items()})
  return rows


def best_gammas(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
  """Per temperature: the gamma of the highest measured speed-up, the gamma of the
  highest predicted one, and (where the rows have it) the gamma of the highest
  speed-up without prefill."""
  out = {}
  for t in sorted({r["temperature"] for r in rows}):
    at = [r for r in rows if r["temperature"] == t]
    best = max(at, key=lambda r: r["speedup"])
    best_pred = max(at, key=lambda r: r["predicted_speedup"])
    out[temp_key(t)] = dict(gamma=best["gamma"], speedup=best["speedup"],
                            predicted_speedup=best["predicted_speedup"],
                            measured_over_predicted=best["measured_over_predicted"],
                            predicted_best_gamma=best_pred["gamma"],
                            predicted_best_speedup=best_pred["predicted_speedup"])
    if all("speedup_decode" in r for r in at):
      best_loop = max(at, key=lambda r: r["speedup_decode"])
      out[temp_key(t)].update(gamma_decode=best_loop["gamma"],
                              speedup_decode=best_loop["speedup_decode"])
  return out


def table4(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """Expected against empirical, per temperature and gamma (the paper's Table 4):
  tokens per iteration (Eq. 1 from alpha) and speed-up (Theorem 3.8 from alpha and c
  with the paper's v = 1, and with the measured v)."""
  return [dict(temperature=r["temperature"], gamma=r["gamma"], alpha=r["alpha"],
               expected_tokens=r["eq1"], empirical_tokens=r["tokens_per_iteration"],
               expected_speedup_paper=r["predicted_speedup_paper"],
               expected_speedup=r["predicted_speedup"], empirical_speedup=r["speedup"])
          for r in rows]


def run(target: DecodeModel, drafts: Mapping[str, DecodeModel],
        prompts: Sequence[Sequence[int]], eos_id: int, *, gammas: Sequence[int],
        temperatures: Sequence[float] = (0.0, 1.0), max_new_tokens: int = 32,
        repeats: int = 2, batch: int = 8, alpha_gamma: int = 4,
        sweep_draft: str = DISTILLED, cost_rounds: int = 3, cost_repeats: int = 2,
        cost_steps: int = 8, seed: int = 0) -> dict[str, Any]:
  """Everything the module doc lists, for any target and same-vocabulary drafts.

  Args:
    target: the target `DecodeModel` (a `llama.Llama` with a pad_id for ragged
      prompts).
    drafts: {name: draft}; alpha is measured for each, the sweep uses `sweep_draft`.
    prompts: token ids per prompt (chat template applied), right-padded here with the
      target's pad_id to the longest.
    eos_id: the token that ends a row.
    gammas: the sweep's gammas; c and v are measured for chunks of gamma + 1.
    temperatures: alpha and the sweep at each.
    max_new_tokens: tokens per decode at most.
    repeats: timed rounds per sweep decode (minimum).
    batch: rows per decode of the alpha passes (the last batch filled with copies).
    alpha_gamma: gamma of the speculative decodes that give the empirical alpha.
    sweep_draft: the draft of the sweep and of c.
    cost_rounds, cost_repeats, cost_steps: `benchmarking.verify_costs`.
    seed: the sampling keys.

  Returns:
    {"settings", "paper_table3", "alpha": {draft: {temperature: {...}}}, "c", "v":
    {gamma + 1: v}, "costs", "sweep": [rows], "best_gamma": {temperature: {...}},
    "table4": [rows], "seconds"}.
  """
  start_time = time.time()
  gammas = [int(g) for g in gammas]
  if not gammas or min(gammas) < 1:
    raise ValueError(f"gammas must be positive ints, got {gammas}")
  if sweep_draft not in drafts:
    raise ValueError(f"sweep_draft: {sweep_draft!r} is not among the drafts "
                     f"{list(drafts)}")
  inputs = benchmarking.right_pad(prompts, getattr(target, "pad_id", None))
  key = jax.random.key(seed)
  draft = drafts[sweep_draft]
  single = [jnp.asarray(inputs[i:i + 1]) for i in range(len(inputs))]
  phases = {}
  clock = time.time()
  costs = benchmarking.verify_costs(target, draft, single[0], [g + 1 for g in gammas],
                                    max_new_tokens + max(gammas) + 1,
                                    repeats=cost_repeats, steps=cost_steps,
                                    rounds=cost_rounds)
  prefill = prefill_seconds(dict(target=target, draft=draft), single[0],
                            max_new_tokens + max(gammas) + 1, cost_repeats,
                            cost_rounds)
  phases["costs"], clock = time.time() - clock, time.time()
  alpha = {name: {} for name in drafts}
  rows = []
  for t in temperatures:
    timed = time_sweep(target, draft, single, eos_id, t, gammas, max_new_tokens,
                       repeats, jax.random.fold_in(key, 1))
    phases[f"sweep_{temp_key(t)}"], clock = time.time() - clock, time.time()
    decoded = ({sweep_draft: timed[f"gamma_{alpha_gamma}"][1]}
               if alpha_gamma in gammas else {})
    per_draft = measure_alpha(target, drafts, inputs, timed["baseline"][1], eos_id, t,
                              max_new_tokens, min(batch, len(inputs)), alpha_gamma,
                              jax.random.fold_in(key, 2), decoded)
    for name, a in per_draft.items():
      alpha[name][temp_key(t)] = a
    logging.info("alpha at temperature %g: %s", t,
                 {n: round(a["teacher_forced"], 3) for n, a in per_draft.items()})
    phases[f"alpha_{temp_key(t)}"], clock = time.time() - clock, time.time()
    rows += sweep_rows(timed, sweep_draft, t, gammas,
                       per_draft[sweep_draft]["teacher_forced"], costs, prefill)
  settings = dict(prompts=len(inputs), prompt_tokens=[len(p) for p in prompts],
                  input_length=int(inputs.shape[1]),
                  pad_id=getattr(target, "pad_id", None), eos_id=eos_id,
                  max_new_tokens=max_new_tokens, gammas=gammas,
                  temperatures=[float(t) for t in temperatures], repeats=repeats,
                  batch=min(batch, len(inputs)), alpha_gamma=alpha_gamma,
                  sweep_draft=sweep_draft, drafts=list(drafts),
                  cost_rounds=cost_rounds, cost_repeats=cost_repeats,
                  cost_steps=cost_steps, seed=seed, backend=jax.default_backend(),
                  devices=[str(d) for d in jax.devices()],
                  dtype=str(getattr(getattr(target, "config", None), "dtype", "float32")))
  return dict(settings=settings, paper_table3=PAPER_TABLE3, alpha=alpha,
              c=costs["c"], v={str(k): v for k, v in costs["v"].items()},
              costs=dict(t_p1=costs["t_p1"], t_q=costs["t_q"],
                         t_p={str(k): s for k, s in costs["t_p"].items()},
                         prefill=prefill),
              sweep=rows, best_gamma=best_gammas(rows), table4=table4(rows),
              phase_seconds=phases, seconds=time.time() - start_time)


# ------------------------------------------------------------------------------
# Reporting.
# ------------------------------------------------------------------------------
def markdown(result: Mapping[str, Any]) -> str:
  """Table 3 beside the paper's, c and v, the sweep, the best gammas, Table 4."""
  s = result["settings"]
  temps = [temp_key(t) for t in s["temperatures"]]
  paper = result["paper_table3"]
  lines = [f"### alpha (Table 3): {s.get('pair', 'target')}, {s['prompts']} held-out "
           f"prompts, {s['max_new_tokens']} new tokens",
           "",
           "| draft | temp | alpha (teacher-forced) | alpha (speculative, gamma "
           f"{s['alpha_gamma']}) | positions | paper: {paper['target']} |",
           "|---|---|---|---|---|---|"]
  for name, per_temp in result["alpha"].items():
    for t in temps:
      a = per_temp[t]
      theirs = paper["alpha"].get(name, {}).get(t)
      label = paper["drafts"].get(name, "")
      lines.append(f"| {name} | {t} | {a['teacher_forced']:.3f} | {a['empirical']:.3f} "
                   f"| {a['teacher_forced_positions']} | "
                   + (f"{theirs:.2f} ({label})" if theirs is not None else "-") + " |")
  v = result["v"]
  prefill = result["costs"]["prefill"]
  lines += ["", f"c = t_q / t_p(1) = {result['c']:.3f} ({s['sweep_draft']}); "
            f"t_p(1) = {result['costs']['t_p1'] * 1e3:.2f} ms; v(k) = t_p(k) / t_p(1): "
            + ", ".join(f"v({k}) = {x:.2f}" for k, x in v.items() if k != "1")
            + f"; prefill of a prompt ({s['input_length']} positions): target "
            f"{prefill['target'] * 1e3:.1f} ms, draft {prefill['draft'] * 1e3:.1f} ms"]
  lines += ["", f"### gamma sweep ({s['sweep_draft']} draft, batch 1)", "",
            "| temp | gamma | alpha | alpha (decode) | tok/iter | Eq. 1 | v | "
            "base ms/tok | spec ms/tok | speed-up | predicted | meas/pred | "
            "speed-up w/o prefill | meas/pred w/o prefill | pred (v = 1) | identical |",
            "|" + "---|" * 16]
  for r in result["sweep"]:
    same = (f"{r['identical_rows']}/{s['prompts']}" if "identical_rows" in r else "-")
    lines.append(
        f"| {r['temperature']:g} | {r['gamma']} | {r['alpha']:.3f} | "
        f"{r['alpha_empirical']:.3f} | {r['tokens_per_iteration']:.2f} | {r['eq1']:.2f} "
        f"| {r['v']:.2f} | {r['baseline_ms_per_token']:.2f} | "
        f"{r['speculative_ms_per_token']:.2f} | {r['speedup']:.2f}x | "
        f"{r['predicted_speedup']:.2f}x | {r['measured_over_predicted']:.2f} | "
        + (f"{r['speedup_decode']:.2f}x | {r['measured_over_predicted_decode']:.2f} | "
           if "speedup_decode" in r else "- | - | ")
        + f"{r['predicted_speedup_paper']:.2f}x | {same} |")
  for t, b in result["best_gamma"].items():
    lines.append(f"\nBest measured gamma at temperature {t}: {b['gamma']} "
                 f"({b['speedup']:.2f}x, predicted {b['predicted_speedup']:.2f}x); "
                 f"best predicted: gamma {b['predicted_best_gamma']} "
                 f"({b['predicted_best_speedup']:.2f}x)"
                 + (f"; best without prefill: gamma {b['gamma_decode']} "
                    f"({b['speedup_decode']:.2f}x)." if "gamma_decode" in b else "."))
  lines += ["", "### Table 4: expected vs empirical", "",
            "| temp | gamma | alpha | tokens/iter expected (Eq. 1) | empirical | "
            "speed-up expected (v = 1, paper) | expected (measured v) | empirical |",
            "|" + "---|" * 8]
  for r in result["table4"]:
    lines.append(f"| {r['temperature']:g} | {r['gamma']} | {r['alpha']:.3f} | "
                 f"{r['expected_tokens']:.2f} | {r['empirical_tokens']:.2f} | "
                 f"{r['expected_speedup_paper']:.2f}x | {r['expected_speedup']:.2f}x | "
                 f"{r['empirical_speedup']:.2f}x |")
  identical = [r.get("identical_to_baseline") for r in result["sweep"]
               if r["temperature"] == 0]
  if identical:
    lines += ["", "Temperature 0: every speculative decode equals the baseline token "
              f"for token: {'yes' if all(identical) else 'NO'}."]
  lines += ["", f"{s['backend']}, {s['dtype']}; ms/token and speed-up include every "
            "prompt's prefill (all prompts right-padded to one length); \"w/o prefill\" "
            "subtracts the measured prefill (the loop that Theorem 3.8 models); min of "
            f"{s['repeats']} timed rounds; alpha teacher-forced along the target's "
            "decodes at each temperature."]
  return "\n".join(lines)


# ------------------------------------------------------------------------------
# The shipped pair.
# ------------------------------------------------------------------------------
def layer_skip_drafts(target, specs: Sequence[str]) -> dict[str, DecodeModel]:
  """{"skip <layers>": the target without those decoder layers} per spec, a
  comma-separated list of layer indices (`--lmp_skip_layers`): the self-speculative
  drafts of Zhang et al. ("Draft & Verify", arXiv:2309.08168), over the target's
  own arrays. Raises app.UsageError naming a malformed spec."""
  num_layers = target.config.num_layers
  drafts = {}
  for spec in specs:
    try:
      skip = sorted({int(i) for i in spec.split(",")})
    except ValueError:
      skip = []
    if not skip or skip[0] < 0 or skip[-1] >= num_layers or len(skip) == num_layers:
      raise app.UsageError(f"--lmp_skip_layers: {spec!r} must list some but not all "
                           f"of the layer indices 0..{num_layers - 1}")
    drafts["skip " + ",".join(map(str, skip))] = target.with_layers(
        [i for i in range(num_layers) if i not in skip])
  return drafts


def training_prompts(tok, num: int, max_tokens: int) -> tuple[list[str], list[list[int]]]:
  """The first `num` training-side prompts of `specdec.lm_prompts.split` (whose
  evaluation texts never occur in them) of at most `max_tokens` ids with the chat
  template: (user messages, ids)."""
  from specdec import lm_prompts  # pylint: disable=g-import-not-at-top
  messages, ids = [], []
  for p in lm_prompts.split()[0]:
    if len(messages) == num:
      break
    x = chat_ids(tok, [p.content])[0]
    if len(x) <= max_tokens:
      messages.append(p.content)
      ids.append(x)
  return messages, ids


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  for name, value in (("prompts", _PROMPTS.value), ("max_new_tokens", _MAX_NEW.value),
                      ("repeats", _REPEATS.value), ("batch", _BATCH.value),
                      ("alpha_gamma", _ALPHA_GAMMA.value)):
    if value < 1:
      raise app.UsageError(f"--lmp_{name} must be >= 1, got {value}")
  try:
    gammas = [int(g) for g in _GAMMAS.value]
    temps = [float(t) for t in _TEMPS.value]
  except ValueError as e:
    raise app.UsageError(f"--lmp_gammas / --lmp_temperatures: {e}") from None
  if not gammas or min(gammas) < 1:
    raise app.UsageError(f"--lmp_gammas must be positive ints, got {_GAMMAS.value}")
  start = time.time()
  target, draft, tok = pretrained.load_pair(_PAIR.value)
  if _PACKED.value:
    target, draft = target.with_packed_weights(), draft.with_packed_weights()
  messages = list(pretrained.lm_eval_prompts(_PAIR.value))[:_PROMPTS.value]
  prompts = chat_ids(tok, messages)
  corpus_kind = _NGRAM_CORPUS.value
  if corpus_kind == "target_outputs":
    _, train = training_prompts(tok, _NGRAM_PROMPTS.value, _NGRAM_MAX_PROMPT.value)
    corpus = target_output_corpus(target, train, tok.eos_id, _NGRAM_NEW.value,
                                  _BATCH.value)
  else:
    corpus = text_corpus(tok, tok.eos_id, exclude=messages)
  drafts = dict(ngram_drafts(corpus, target.vocab_size), **{
      DISTILLED: draft, LOOKUP: pretrained.with_context_lookup(_PAIR.value, draft)},
      **layer_skip_drafts(target, _SKIP.value))
  result = run(target, drafts, prompts, tok.eos_id, gammas=gammas, temperatures=temps,
               max_new_tokens=_MAX_NEW.value, repeats=_REPEATS.value,
               batch=_BATCH.value, alpha_gamma=_ALPHA_GAMMA.value,
               cost_rounds=_COST_ROUNDS.value, cost_repeats=_COST_REPEATS.value,
               cost_steps=_COST_STEPS.value, sweep_draft=_SWEEP_DRAFT.value,
               seed=_SEED.value)
  result["settings"].update(
      pair=_PAIR.value, ngram_corpus=corpus_kind,
      packed_weights=dict(target=getattr(target, "packed", None) is not None,
                          draft=getattr(getattr(draft, "inner", draft), "packed", None)
                          is not None),
      context_lookup=pretrained.lookup_settings(_PAIR.value),
      ngram_corpus_sequences=len(corpus),
      ngram_corpus_tokens=int(sum(len(c) for c in corpus)),
      ngram_corpus_note=(
          f"the target's greedy outputs ({_NGRAM_NEW.value} tokens at most) on the "
          f"first {len(corpus)} training prompts of specdec.lm_prompts.split() (at "
          f"most {_NGRAM_MAX_PROMPT.value} ids)" if corpus_kind ==
          "target_outputs" else "token streams of the shipped CNN/DM articles and "
          "newstest2014 German references, held-out prompts' texts left out"),
      total_seconds=time.time() - start)
  result["examples"] = [dict(prompt=m) for m in messages[:3]]
  table = markdown(result)
  path = _JSON.value
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.splitext(path)[0] + ".md", "w") as f:
    f.write(f"# {_PAIR.value}: Table 3 and Table 4\n\n{table}\n")
  print(table)
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
