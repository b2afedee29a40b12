r"""`python -m specdec.bench identity`: how often greedy speculative decoding
reproduces the greedy decode, and why not.

At temperature 0, speculative decoding (Leviathan et al. 2023, Section 2.3) outputs the
target's greedy decode *if* a (gamma + 1)-token verification chunk gives the same
argmax as single steps. Its logits equal single steps' only up to float rounding
(`specdec.models.t5.T5.extend`), so a near-tie of the top two logits can flip (issue
11, section 4). This decodes prompts with a shipped target in float32 and in bfloat16,
greedily with the baseline and with speculative decoding for each draft and gamma, and
reports

* the identity rate: rows identical token for token (and in length);
* at each mismatch, the first differing position j and, from a teacher-forced
  single-step pass of the target over the baseline's tokens: the gap between its top
  two logits there, the margin by which it prefers the baseline's token over the
  speculative one, and the largest |chunk - single-step| logit difference at j over
  every position j can take in a verification chunk (chunks of gamma + 1 starting at
  j - o, o = 0..gamma, the prefix fed in single steps: the sampler's own chunk history
  is one of many, so this is the rounding's scale, not its exact value), with whether
  some chunk's argmax is the speculative token;
* per dtype and gamma, over all rows and positions, the largest |chunk - single| logit
  difference (chunks of gamma + 1 from position 0) and how many positions have a top-2
  gap below it (the positions where a flip is possible).

Two model families, one measurement (`measure` sees only `DecodeModel`s, whose
`start_tokens` say what the teacher-forced passes feed first):

* `--pair=multi30k_ende` (default): the shipped T5 pair
  (`pretrained.load_pair`) on Multi30k test_2016 sentences, with the shipped draft `--draft`.
* `--pair=smollm2_135m_instruct`: the decoder-only SmolLM2-135M-Instruct
  (`pretrained.load_lm`, a `llama.Llama` reading right-padded prompts) on chat prompts
  "Summarize: <the first sentences of a CNN/DM article>" and "Translate to German:
  <a newstest2014 source>" (alternating, at most `--max-prompt-tokens` tokens
  with the chat template), with same-vocabulary drafts (`--lm-drafts`): 'bigram'
  (`ngram.Bigram`, estimated from the tokenized text of the shipped articles and
  German newstest2014 references that are not prompts) and 'tiny_llama' (a random
  `llama.tiny_config` Llama over the target's vocabulary: nearly every draft is
  rejected, so verification chunks start at every position).

It prints a table and writes JSON (`--out`). Check runs:

  python -m specdec.bench identity --num-sentences=2 --out=/tmp/identity.json
  python -m specdec.bench identity --pair=smollm2_135m_instruct --num-sentences=2 \
      --max-new-tokens=8 --dtypes=float32 --out=/tmp/identity_lm.json

Full runs (bfloat16 is emulated on a CPU, ~6x slower than float32 there):

  python -m specdec.bench identity --num-sentences=1000
  python -m specdec.bench identity --pair=smollm2_135m_instruct \
      --dtypes=float32,bfloat16 --num-sentences=8 --max-new-tokens=32 --gammas=4 \
      --out=out/identity_smollm2.json
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec import data, pretrained
from specdec.bench import cli, drafts as drafts_lib, report
from specdec.data.lm_prompts import right_pad
from specdec.models import llama
from specdec.models.base import DecodeModel

T5_PAIR, LM_PAIR = "multi30k_ende", "smollm2_135m_instruct"
# Per family: (prompts, max_new_tokens, gammas) when the flags leave them unset. The
# LM's are small because a 135M model decodes at ~40-80 ms/token in float32 on a CPU.
DEFAULTS = {T5_PAIR: (1000, 40, ["4", "7"]), LM_PAIR: (8, 32, ["4"])}
LM_DRAFTS = ("bigram", "tiny_llama")
LM_TASKS = ("cnndm", "wmt_ende")
# The chat prompts' instructions, before the shipped text.
LM_INSTRUCTIONS = {"cnndm": "Summarize: ", "wmt_ende": "Translate to German: "}


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field(T5_PAIR, f"A shipped target: {', '.join(DEFAULTS)}.")
  draft: str = cli.field("draft_distilled", "T5 pair: which shipped draft.")
  lm_drafts: tuple[str, ...] = cli.field(LM_DRAFTS, f"LM target: drafts, of {list(LM_DRAFTS)}.")
  lm_tasks: tuple[str, ...] = cli.field(
    LM_TASKS, f"LM target: prompt kinds, alternating, of {list(LM_TASKS)}."
  )
  max_prompt_tokens: int = cli.field(
    96, "LM target: prompt tokens at most (chat template included)."
  )
  num_sentences: int | None = cli.field(
    None, "Prompts (from the first); default 1000 (T5) or 8 (LM)."
  )
  gammas: tuple[int, ...] | None = cli.field(
    None, "Draft tokens per iteration; default 4,7 (T5) or 4 (LM)."
  )
  dtypes: tuple[str, ...] = cli.field(
    ("float32", "bfloat16"), "Parameter and activation dtypes of the models."
  )
  batch: int = cli.field(32, "Prompts per decode call.")
  max_new_tokens: int | None = cli.field(
    None, "Tokens generated at most; default 40 (T5), 32 (LM)."
  )
  input_length: int = cli.field(48, "T5: encoder length (padded).")
  per_position_logits: int | None = cli.field(
    None,
    "T5: the target's `T5.per_position_logits`; default: "
    "`pretrained.load_model`'s (6 on a CPU, 0 elsewhere).",
  )
  seed: int = cli.field(0, "LM target: the 'tiny_llama' draft's seed.")


GREEDY = specdec.SamplingConfig(temperature=0.0)


# ------------------------------------------------------------------------------
# What a model family supplies: prompts, EOS, and its models in a dtype.
# ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Workload:
  """A target's prompts and models: all `measure` needs, whatever the family.

  Attributes:
    pair: the target's (pair's) name.
    prompts: the prompts in words, for the table's title.
    inputs: int32[N, S], the prompts as the target's `init` reads them (T5: encoder
      tokens padded with 0; a `llama.Llama`: right-padded with its pad_id).
    eos_id: the token that ends a row.
    load: dtype -> (target, {draft name: draft}), `DecodeModel`s of one vocabulary.
  """

  pair: str
  prompts: str
  inputs: np.ndarray
  eos_id: int
  load: Callable[[Any], tuple[DecodeModel, dict[str, DecodeModel]]]


def t5_workload(
  pair: str, draft: str, num: int, input_length: int, per_position_logits: int | None
) -> Workload:
  """The shipped T5 pair on its first `num` Multi30k test_2016 sentences."""
  sentences = pretrained.test_sentences(pair)[:num]
  vocab = data.Vocabulary()
  inputs = np.stack(
    [vocab.encode_padded(data.TRANSLATE_PREFIX + en, input_length) for en, _ in sentences]
  )

  def load(dtype):
    target, d, _ = pretrained.load_pair(
      pair, dtype=dtype, per_position_logits=per_position_logits, draft=draft
    )
    return target, {draft: d}

  return Workload(
    pair=pair,
    prompts=f"{len(inputs)} Multi30k test_2016 sentences",
    inputs=inputs,
    eos_id=data.EOS_ID,
    load=load,
  )


def fitting_prefix(text: str, fits: Callable[[str], bool]) -> str | None:
  """The longest prefix of `text` in whole sentences that `fits`, else in whole words
  of the first sentence; None when not even one word fits."""
  sentences = re.split(r"(?<=[.!?])\s+", text.strip())
  best = None
  for n in range(1, len(sentences) + 1):
    candidate = " ".join(sentences[:n])
    if not fits(candidate):
      break
    best = candidate
  if best is None:
    words = sentences[0].split()
    for n in range(1, len(words) + 1):
      if not fits(" ".join(words[:n])):
        break
      best = " ".join(words[:n])
  return best


def lm_texts(task: str) -> list[tuple[str, str]]:
  """(prompt source, draft corpus text) per shipped example of `task`: a CNN/DM
  article and itself, or a newstest2014 English source and its German reference
  (the language the target answers in)."""
  examples = data.load_examples({"cnndm": data.CNNDM_TASK, "wmt_ende": data.WMT_TASK}[task])
  if task == "cnndm":
    return [(e["article"], e["article"]) for e in examples]
  return [(e["en"], e["de"]) for e in examples]


def lm_prompts(
  tok, tasks: Sequence[str], num: int, max_prompt_tokens: int
) -> tuple[list[list[int]], list[str], list[str]]:
  """`num` chat prompts of at most `max_prompt_tokens` ids, the tasks taken in turn,
  each its next shipped example that fits; and the corpus of every other example.

  Returns:
    (prompts: token ids, one list per prompt; their user messages; corpus texts of
    the examples not used as prompts).
  """

  def ids(content: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": content}])

  sources = {task: lm_texts(task) for task in tasks}
  used = {task: set() for task in tasks}
  cursor = {task: 0 for task in tasks}
  prompts, messages = [], []
  while len(prompts) < num:
    task = tasks[len(prompts) % len(tasks)]
    instruction = LM_INSTRUCTIONS[task]
    while True:
      if cursor[task] >= len(sources[task]):
        raise ValueError(
          f"num_sentences: only {len(prompts)} {task} prompts fit "
          f"max_prompt_tokens={max_prompt_tokens}, {num} asked"
        )
      index = cursor[task]
      cursor[task] += 1
      text = fitting_prefix(
        sources[task][index][0],
        lambda t, instruction=instruction: len(ids(instruction + t)) <= max_prompt_tokens,
      )
      if text is not None:
        break
    used[task].add(index)
    messages.append(instruction + text)
    prompts.append(ids(messages[-1]))
  corpus = [
    target for task in tasks for i, (_, target) in enumerate(sources[task]) if i not in used[task]
  ]
  return prompts, messages, corpus


def tiny_llama_draft(target: llama.Llama, dtype, seed: int) -> llama.Llama:
  """A random `llama.tiny_config` Llama over the target's vocabulary and padding."""
  cfg = llama.tiny_config(
    vocab_size=target.vocab_size,
    tie_word_embeddings=True,
    max_position_embeddings=target.config.max_position_embeddings,
    dtype=dtype,
  )
  return llama.Llama(cfg, jax.device_put(llama.random_params(cfg, seed)), pad_id=target.pad_id)


def lm_workload(
  name: str,
  drafts: Sequence[str],
  tasks: Sequence[str],
  num: int,
  max_prompt_tokens: int,
  seed: int = 0,
  load_lm: Callable[..., tuple[llama.Llama, Any]] = pretrained.load_lm,
) -> Workload:
  """A decoder-only target on chat prompts of shipped text (module doc).

  Args:
    name: passed to `load_lm`.
    drafts: of `LM_DRAFTS`.
    tasks: of `LM_TASKS`, taken in turn.
    num: prompts.
    max_prompt_tokens: ids per prompt at most, chat template included.
    seed: the 'tiny_llama' draft's parameters.
    load_lm: (name, dtype=...) -> (llama.Llama, tokenizer), `pretrained.load_lm`'s
      signature; the tokenizer needs `apply_chat_template`, `encode(text,
      add_special_tokens=False)` and `eos_id`.
  """
  for d in drafts:
    if d not in LM_DRAFTS:
      raise ValueError(f"lm_drafts: unknown draft {d!r}; have {list(LM_DRAFTS)}")
  for t in tasks:
    if t not in LM_TASKS:
      raise ValueError(f"lm_tasks: unknown task {t!r}; have {list(LM_TASKS)}")
  if not drafts or not tasks:
    raise ValueError("lm_drafts and lm_tasks must each name at least one")
  target, tok = load_lm(name, dtype=jnp.float32)
  prompts, _, corpus = lm_prompts(tok, list(tasks), num, max_prompt_tokens)
  inputs = right_pad(prompts, target.pad_id)
  bigram = None
  if "bigram" in drafts:
    # No start token: both models are fed the target's start token, the prompt's
    # last; the draft's row for it is learnt from the corpus like any other.
    bigram = drafts_lib.ngram_drafts(
      [tok.encode(text, add_special_tokens=False) + [tok.eos_id] for text in corpus],
      target.vocab_size,
      ["bigram"],
      start_token=None,
    )["bigram"]

  def load(dtype):
    model = target if jnp.dtype(dtype) == jnp.float32 else load_lm(name, dtype=dtype)[0]
    out = {}
    for d in drafts:
      out[d] = bigram if d == "bigram" else tiny_llama_draft(model, dtype, seed)
    return model, out

  counts = ", ".join(
    f"{sum(1 for i in range(num) if tasks[i % len(tasks)] == t)} {t}" for t in tasks
  )
  return Workload(
    pair=name,
    prompts=f"{num} chat prompts ({counts}, <= {max_prompt_tokens} tokens)",
    inputs=inputs,
    eos_id=tok.eos_id,
    load=load,
  )


# ------------------------------------------------------------------------------
# The measurement, for any DecodeModel.
# ------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("chunk",))
def teacher_forced(
  model: DecodeModel, inputs: jax.Array, decoder_tokens: jax.Array, *, chunk: int
) -> jax.Array:
  """float32 logits [B, L, V] of `decoder_tokens` [B, L] (see `decoder_inputs`) fed
  after `model.init(inputs)` in chunks of `chunk` (the last one padded with token 0,
  whose logits are dropped)."""
  batch, length = decoder_tokens.shape
  num_chunks = -(-length // chunk)
  padded = jnp.pad(decoder_tokens, ((0, 0), (0, num_chunks * chunk - length)))
  chunks = jnp.moveaxis(padded.reshape(batch, num_chunks, chunk), 1, 0)

  def step(state, tokens):
    logits, state = model.extend(state, tokens)
    return state, logits.astype(jnp.float32)

  _, logits = jax.lax.scan(step, model.init(inputs, num_chunks * chunk), chunks)
  return jnp.moveaxis(logits, 0, 1).reshape(batch, -1, logits.shape[-1])[:, :length]


@functools.partial(jax.jit, static_argnames=("chunk",))
def chunk_logits_at(
  model: DecodeModel, inputs: jax.Array, decoder_tokens: jax.Array, start: jax.Array, *, chunk: int
) -> jax.Array:
  """float32 logits [chunk, V] of one row: `decoder_tokens` [1, L] up to `start` fed
  one at a time, then the chunk `decoder_tokens[0, start:start + chunk]` in one call
  (`decoder_tokens` must hold start + chunk tokens)."""

  def single(i, state):
    token = jax.lax.dynamic_slice_in_dim(decoder_tokens, i, 1, axis=1)
    return model.extend(state, token)[1]

  state = jax.lax.fori_loop(0, start, single, model.init(inputs, decoder_tokens.shape[1]))
  tokens = jax.lax.dynamic_slice_in_dim(decoder_tokens, start, chunk, axis=1)
  return model.extend(state, tokens)[0][0].astype(jnp.float32)


def decoder_inputs(tokens: np.ndarray, start: np.ndarray) -> np.ndarray:
  """[B, L] output tokens -> the tokens fed to predict them: [start_b, y_1..y_L-1],
  start = the model's `start_tokens` [B] (T5: 0; a causal LM: the prompt's last)."""
  start = np.asarray(start, tokens.dtype).reshape(-1, 1)
  return np.concatenate([np.broadcast_to(start, (len(tokens), 1)), tokens[:, :-1]], axis=1)


def top2_gap(logits: np.ndarray) -> np.ndarray:
  """[..., V] -> top-1 minus top-2 logit [...]."""
  top = np.sort(logits, axis=-1)[..., -2:]
  return top[..., 1] - top[..., 0]


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
  """The first position where rows a and b differ (tokens are 0 past a row's length,
  so a length difference is a token difference), or None."""
  diff = np.flatnonzero(a != b)
  return int(diff[0]) if diff.size else None


def decode_batch(
  target: DecodeModel,
  drafts: Mapping[str, DecodeModel],
  inputs: jax.Array,
  gammas: list[int],
  max_new_tokens: int,
  eos_id: int,
) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, int]]]:
  """Greedy decodes of `inputs` [B, S]: output tokens [B, max_new_tokens] of the
  baseline ('baseline') and of speculative decoding with each draft at each gamma
  ('draft/gamma'); and per speculative decode, (accepted, drafted) tokens in all."""
  key = jax.random.key(0)
  outputs = {
    "baseline": np.asarray(
      specdec.autoregressive_sample(
        target, inputs, key, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_id=eos_id
      ).tokens
    )
  }
  acceptance = {}
  for name, draft in drafts.items():
    for g in gammas:
      out = specdec.speculative_sample(
        target,
        draft,
        inputs,
        key,
        gamma=g,
        max_new_tokens=max_new_tokens,
        sampling=GREEDY,
        eos_id=eos_id,
      )
      outputs[f"{name}/{g}"] = np.asarray(out.tokens)
      acceptance[f"{name}/{g}"] = (int(out.stats.accepted.sum()), int(out.stats.drafted.sum()))
  return outputs, acceptance


def mismatch_report(
  target: DecodeModel,
  inputs: np.ndarray,
  base: np.ndarray,
  spec: np.ndarray,
  logits: np.ndarray,
  j: int,
  gamma: int,
) -> dict[str, Any]:
  """One row's mismatch at its first differing position j (see the module doc).

  Args:
    target: the target model.
    inputs: int32[1, S], the row's input (T5: encoder tokens; an LM: its prompt).
    base: int32[L], the baseline's tokens.
    spec: int32[L], the speculative tokens.
    logits: float32[V], the single-step logits at j.
    j: the position.
    gamma: the speculative decode's gamma.
  """
  base_token, spec_token = int(base[j]), int(spec[j])
  top = np.argsort(logits)[::-1][:2]
  tokens = np.zeros((1, len(base) + gamma + 1), np.int32)
  start = np.asarray(target.start_tokens(jnp.asarray(inputs)))
  tokens[0, : len(base)] = decoder_inputs(base[None], start)[0]
  chunk_diffs, chunk_argmaxes = [], []
  for offset in range(min(gamma, j) + 1):
    chunked = np.asarray(
      chunk_logits_at(
        target, jnp.asarray(inputs), jnp.asarray(tokens), jnp.int32(j - offset), chunk=gamma + 1
      )
    )[offset]
    chunk_diffs.append(float(np.max(np.abs(chunked - logits))))
    chunk_argmaxes.append(int(np.argmax(chunked)))
  return dict(
    position=j,
    baseline_token=base_token,
    speculative_token=spec_token,
    single_top2=[int(t) for t in top],
    single_top2_gap=float(top2_gap(logits)),
    single_margin_baseline_over_speculative=float(logits[base_token] - logits[spec_token]),
    max_abs_chunk_minus_single=max(chunk_diffs),
    chunk_argmax_is_speculative_token=spec_token in chunk_argmaxes,
    chunk_argmaxes=chunk_argmaxes,
  )


def generated_mask(tokens: np.ndarray, eos_id: int) -> np.ndarray:
  """bool[B, L]: the positions up to and including each row's EOS (all without)."""
  after_eos = np.cumsum(tokens == eos_id, axis=1) - (tokens == eos_id)
  return after_eos == 0


def measure(
  target: DecodeModel,
  drafts: Mapping[str, DecodeModel],
  inputs: np.ndarray,
  gammas: list[int],
  batch: int,
  max_new_tokens: int,
  eos_id: int,
) -> dict[str, Any]:
  """Decodes `inputs` [N, S] in batches of `batch` (the last padded with copies of
  row 0, then dropped) and compares; see the module doc.

  Returns:
    {'decode_seconds', 'positions' (generated positions compared), 'min_top2_gap',
    'median_top2_gap', 'gammas': {gamma: chunk/single statistics, draft-independent},
    'drafts': {draft name: {gamma: identity rate, acceptance and mismatches}}}.
  """
  decode_s, gaps = 0.0, []
  per_gamma = {str(g): dict(diffs=[], below=0) for g in gammas}
  per_run = {f"{d}/{g}": dict(mismatches=[], accepted=0, drafted=0) for d in drafts for g in gammas}
  for lo in range(0, len(inputs), batch):
    rows = inputs[lo : lo + batch]
    x = jnp.asarray(np.concatenate([rows, np.repeat(rows[:1], batch - len(rows), 0)]))
    start = time.perf_counter()
    outputs, acceptance = decode_batch(target, drafts, x, gammas, max_new_tokens, eos_id)
    decode_s += time.perf_counter() - start
    base = outputs["baseline"][: len(rows)]
    # Teacher-forced over the baseline's tokens; positions past a row's EOS are
    # never compared.
    d = jnp.asarray(decoder_inputs(outputs["baseline"], np.asarray(target.start_tokens(x))))
    single = np.asarray(teacher_forced(target, x, d, chunk=1))[: len(rows)]
    valid = generated_mask(base, eos_id)
    batch_gaps = top2_gap(single)[valid]
    gaps.append(batch_gaps)
    for g in gammas:
      chunked = np.asarray(teacher_forced(target, x, d, chunk=g + 1))[: len(rows)]
      diff = np.max(np.abs(chunked - single), axis=-1)[valid]
      stats = per_gamma[str(g)]
      stats["diffs"].append(diff)
      stats["below"] += int((batch_gaps < diff.max()).sum())
    # Acceptance counts the padded copies too: they decode like row 0.
    for run, stats in per_run.items():
      stats["accepted"] += acceptance[run][0]
      stats["drafted"] += acceptance[run][1]
      g = int(run.rsplit("/", 1)[1])
      spec = outputs[run][: len(rows)]
      for i in range(len(rows)):
        j = first_difference(base[i], spec[i])
        if j is not None:
          stats["mismatches"].append(
            dict(
              row=lo + i,
              **mismatch_report(target, rows[i : i + 1], base[i], spec[i], single[i, j], j, g),
            )
          )
  gaps = np.concatenate(gaps)
  result = {
    "decode_seconds": decode_s,
    "positions": int(gaps.size),
    "min_top2_gap": float(gaps.min()),
    "median_top2_gap": float(np.median(gaps)),
    "gammas": {},
    "drafts": {},
  }
  for g, stats in per_gamma.items():
    diffs = np.concatenate(stats["diffs"])
    result["gammas"][g] = dict(
      max_abs_chunk_minus_single=float(diffs.max()),
      median_abs_chunk_minus_single=float(np.median(diffs)),
      # Per batch, positions whose top-2 gap is below that batch's largest
      # difference: where rounding of that size could flip the argmax.
      positions_with_gap_below_max_diff=stats["below"],
    )
  for run, stats in per_run.items():
    name, g = run.rsplit("/", 1)
    mismatches = stats["mismatches"]
    result["drafts"].setdefault(name, {})[g] = dict(
      rows=len(inputs),
      identical=len(inputs) - len(mismatches),
      identity_rate=1.0 - len(mismatches) / len(inputs),
      acceptance=stats["accepted"] / max(stats["drafted"], 1),
      mismatches=mismatches,
    )
  return result


def format_table(results: dict[str, Any]) -> str:
  head = (
    f"{results['pair']} target, {results['prompts']}, greedy, batch "
    f"{results['batch']}, {results['max_new_tokens']} new tokens, "
    f"{results['backend']}"
  )
  rows, details = [], []
  for dtype, r in results["dtypes"].items():
    for name, runs in r["drafts"].items():
      for g, m in runs.items():
        c = r["gammas"][g]
        rows.append(
          [
            dtype,
            name,
            g,
            f"{m['identical']}/{m['rows']}",
            f"{m['identity_rate']:.3f}",
            f"{m['acceptance']:.2f}",
            f"{c['max_abs_chunk_minus_single']:.2e}",
            f"{c['positions_with_gap_below_max_diff']}/{r['positions']}",
            f"{r['min_top2_gap']:.2e}",
          ]
        )
        details += [
          [
            dtype,
            name,
            g,
            x["row"],
            x["position"],
            x["baseline_token"],
            x["speculative_token"],
            f"{x['single_top2_gap']:.2e}",
            f"{x['single_margin_baseline_over_speculative']:.2e}",
            f"{x['max_abs_chunk_minus_single']:.2e}",
            x["chunk_argmax_is_speculative_token"],
          ]
          for x in m["mismatches"]
        ]
  text = (
    head
    + "\n"
    + report.markdown_table(
      [
        "dtype",
        "draft",
        "gamma",
        "identical",
        "rate",
        "acceptance",
        "max abs(chunk - single)",
        "positions with top-2 gap below it",
        "min top-2 gap",
      ],
      rows,
    )
  )
  if details:
    text += (
      "\n\nMismatches (single-step logits at the first differing position "
      "j):\n"
      + report.markdown_table(
        [
          "dtype",
          "draft",
          "gamma",
          "row",
          "j",
          "base tok",
          "spec tok",
          "top-2 gap",
          "margin base - spec",
          "max abs(chunk - single) at j",
          "chunk gives spec",
        ],
        details,
      )
    )
  return text


def run_workload(
  workload: Workload, dtypes: Sequence[str], gammas: list[int], batch: int, max_new_tokens: int
) -> dict[str, Any]:
  """`measure` in each dtype; the results with the settings."""
  batch = min(batch, len(workload.inputs))
  results = {
    "pair": workload.pair,
    "prompts": workload.prompts,
    "num_sentences": len(workload.inputs),
    "batch": batch,
    "max_new_tokens": max_new_tokens,
    "input_length": int(workload.inputs.shape[1]),
    "backend": jax.default_backend(),
    "dtypes": {},
  }
  for dtype in dtypes:
    target, drafts = workload.load(jnp.dtype(dtype))
    r = measure(target, drafts, workload.inputs, gammas, batch, max_new_tokens, workload.eos_id)
    if hasattr(target, "per_position_logits"):
      r["target_per_position_logits"] = target.per_position_logits
    results["dtypes"][dtype] = r
  return results


def run(config: Config) -> dict[str, Any]:
  """The identity measurement of the module doc, with the family's defaults."""
  if config.pair not in DEFAULTS:
    raise ValueError(f"pair: {config.pair!r} is not one of {list(DEFAULTS)}")
  default_num, default_new, default_gammas = DEFAULTS[config.pair]
  config = dataclasses.replace(
    config,
    num_sentences=config.num_sentences or default_num,
    max_new_tokens=config.max_new_tokens or default_new,
    gammas=config.gammas or tuple(int(g) for g in default_gammas),
  )
  cli.check_positive(
    config, "num_sentences", "batch", "max_new_tokens", "max_prompt_tokens", "gammas"
  )
  for dtype in config.dtypes:
    if dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtypes: float32 or bfloat16, got {dtype!r}")
  if config.pair == T5_PAIR:
    workload = t5_workload(
      config.pair,
      config.draft,
      config.num_sentences,
      config.input_length,
      config.per_position_logits,
    )
  else:
    workload = lm_workload(
      config.pair,
      config.lm_drafts,
      config.lm_tasks,
      config.num_sentences,
      config.max_prompt_tokens,
      seed=config.seed,
    )
  return run_workload(
    workload, config.dtypes, list(config.gammas), config.batch, config.max_new_tokens
  )


render = format_table
