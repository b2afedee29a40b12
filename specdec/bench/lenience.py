"""`python -m specdec.bench lenience`: the paper's Table 5 (lenience, Appendix A.5)
for a shipped pair, measured in one run.

    python -m specdec.bench lenience                       # whole Multi30k test set
    python -m specdec.bench lenience --sentences=8 --timed-sentences=2 --repeats=1 \\
        --max-new-tokens=12 --ngram-sentences=2000 --drafts=draft,bigram  # a smoke run

Leviathan, Kalman & Matias (2023), Appendix A.5: with lenience l < 1 a draft x ~ q is
accepted iff r l q(x) < p(x) and a rejection resamples norm(max(0, p - l q)), so that
no token has probability above p(x) / l; at temperature 0 the draft's token is
accepted iff p(x) >= l max(p) (`specdec.sample.speculative_sample(..., lenience=l)`).
For every temperature, draft (the pair's shipped drafts and the unigram and bigram
drafts of Table 3, `specdec.bench.drafts`), gamma and l, on the
pair's Multi30k test sentences:

* alpha_l the paper's way (Section 3.1): the mean over the target's own (baseline)
  outputs, teacher-forced through both models, of beta_l = sum_x min(p(x) / l, q(x))
  (`theory.acceptance`; at temperature 0, [p(x) >= l max p] for the draft's greedy
  token x, and [x = the target's greedy token] at l = 1) -- the Table 5 cells; and
  alpha along the lenient decodes themselves (`SpeculativeStats.alpha_hat`, pooled)
  and from their accept counts;
* the speed-up: baseline and lenient ms per token at batch 1 on --timed_sentences,
  timed side by side (`bench.timing.time_decodes_paired`), the prediction of Theorem
  3.8 refined with the measured c and v (`costs.step_costs`), and Theorem 3.8
  at the paper's c = 0.015, gamma = 8 from our alpha_l (the paper's Table 5 speed-ups
  are that formula at its alphas: 3.3 / 3.3 / 3.9 / 4.9x for 0.75 / 0.75 / 0.8 / 0.87);
* the quality cost, from batched decodes of --sentences: BLEU against the references
  (`specdec.metrics.bleu`, T5's sacrebleu settings), the target's mean log p per
  output token (temperature > 0: the lenient output is no longer the target's, and
  log p measures how far it drifts toward what the target finds likely), distinct
  bigrams over all outputs (diversity: lenience sets no lower bound on any token's
  probability), and at temperature 0 the fraction of outputs equal to the target's
  greedy decode (1 at l = 1).

Prints the markdown (and writes it with the JSON, `--out`), with the paper's Table 5
(T5-XXL on WMT EnDe) beside ours.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import functools
import logging
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec import data, metrics, pretrained, theory, verify
from specdec._checks import check_lenience
from specdec.bench import cli, drafts as drafts_lib, report
from specdec.bench.alpha import pooled_alpha, pooled_tokens_per_iteration
from specdec.bench.inputs import batched, encode_sources
from specdec.bench.timing import time_decodes_paired
from specdec.costs import autoregressive_decoder, speculative_decoder, step_costs
from specdec.distributions import SamplingConfig, greedy_tokens, probabilities

# The paper's Table 5: T5-XXL target on WMT EnDe, alpha at l = 1, 0.5, 0.3, 0.1.
PAPER_LENIENCES = (1.0, 0.5, 0.3, 0.1)
PAPER_TABLE5 = {
  1.0: {
    "unigram": (0.07, 0.1, 0.11, 0.16),
    "bigram": (0.19, 0.23, 0.25, 0.32),
    "T5-small": (0.62, 0.71, 0.76, 0.84),
    "T5-base": (0.68, 0.8, 0.83, 0.90),
  },
  0.0: {"T5-small": (0.75, 0.75, 0.8, 0.87)},
}
# Its temperature-0 speed-ups with T5-small, "at c = 0.015, gamma = 8".
PAPER_SPEEDUPS_T0 = (3.3, 3.3, 3.9, 4.9)
PAPER_C, PAPER_GAMMA = 0.015, 8
NGRAM_DRAFTS = drafts_lib.NGRAM_DRAFTS


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field("multi30k_ende", "A shipped T5 pair.")
  drafts: tuple[str, ...] = cli.field(
    (), "Drafts: the pair's shipped ones, unigram, bigram; empty: all of them."
  )
  leniences: tuple[float, ...] = cli.field(PAPER_LENIENCES, "Leniences l in (0, 1].")
  temperatures: tuple[float, ...] = cli.field((1.0, 0.0), "Sampling temperatures.")
  gammas: tuple[int, ...] = cli.field((PAPER_GAMMA,), "Draft tokens per iteration.")
  sentences: int | None = cli.field(None, "Test sentences for alpha and quality (None: all).")
  batch_size: int = cli.field(64, "Batch of the quality decodes.")
  alpha_batch: int = cli.field(16, "Rows per teacher-forced pass.")
  timed_sentences: int = cli.field(16, "Sentences timed at batch 1.")
  repeats: int = cli.field(3, "Timed rounds per decode (minimum).")
  input_length: int = cli.field(48, "Input tokens (EOS included).")
  max_new_tokens: int = cli.field(48, "Max new tokens.")
  ngram_sentences: int | None = cli.field(
    None, "Multi30k train sentences for the n-gram drafts (None: all)."
  )
  seed: int = cli.field(0, "Sampling seed.")


# ------------------------------------------------------------------------------
# Models and inputs.
# ------------------------------------------------------------------------------
def load_drafts(
  pair: str, names: Sequence[str] | None, vocab, vocab_size: int, ngram_sentences: int | None
) -> dict[str, Any]:
  """The drafts by name: shipped ones from the pair, n-grams from Multi30k train.de
  (`drafts.t5_corpus`: ids of each sentence, then EOS)."""
  shipped = pretrained.drafts(pair)
  names = list(names) if names else list(shipped) + list(NGRAM_DRAFTS)
  unknown = [n for n in names if n not in shipped and n not in NGRAM_DRAFTS]
  if unknown:
    raise ValueError(f"drafts: unknown {unknown}; have {list(shipped) + list(NGRAM_DRAFTS)}")
  out = {name: pretrained.load_model(pair, name) for name in names if name in shipped}
  grams = [name for name in names if name in NGRAM_DRAFTS]
  if grams:
    corpus = drafts_lib.t5_corpus(vocab, "multi30k", limit=ngram_sentences)
    out.update(drafts_lib.ngram_drafts(corpus, vocab_size, grams))
  return {name: out[name] for name in names}


# ------------------------------------------------------------------------------
# alpha_l along the target's own outputs (Section 3.1, with Appendix A.5's beta_l).
# ------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("sampling", "leniences"))
def _lenient_betas(target, draft, inputs, tokens, sampling, leniences):
  """float32[len(leniences), B, T]: beta_l at every position of `tokens`, the one test
  the lenient decode applies there: `verify.beta` at temperature > 0, and at
  temperature 0 `verify.lenient_greedy_step`'s rule (`greedy_step`'s at l = 1)."""
  start = target.start_tokens(inputs)[:, None]
  chunk = jnp.concatenate([start, tokens[:, :-1]], axis=1)
  length = tokens.shape[1]
  p_logits, _ = target.extend(target.init(inputs, length), chunk)
  q_logits, _ = draft.extend(draft.init(inputs, length), chunk)
  out = []
  if sampling.greedy:
    x = greedy_tokens(q_logits)
    # lenient_greedy_step verifies gamma = T drafts against T + 1 positions; the
    # last one only gives the correction token, unused here.
    padded = jnp.concatenate([p_logits, p_logits[:, -1:]], axis=1)
    for lenience in leniences:
      if lenience == 1.0:
        out.append((x == greedy_tokens(p_logits)).astype(jnp.float32))
      else:
        out.append(verify.lenient_greedy_step(padded, x, sampling, lenience)[2])
  else:
    p = probabilities(p_logits, sampling)
    q = probabilities(q_logits, sampling)
    out = [verify.beta(p, q, lenience) for lenience in leniences]
  return jnp.stack(out)


def lenient_alpha(
  target, drafts, inputs, tokens, lengths, sampling, leniences, batch
) -> dict[str, dict[float, float]]:
  """{draft: {l: mean beta_l over the outputs' positions}}, `batch` rows a pass."""
  sums = {d: np.zeros(len(leniences)) for d in drafts}
  count = 0
  for start in range(0, len(tokens), batch):
    x = jnp.asarray(inputs[start : start + batch])
    t = jnp.asarray(tokens[start : start + batch])
    rows = np.asarray(lengths[start : start + batch])
    valid = np.arange(t.shape[1])[None] < rows[:, None]
    count += int(valid.sum())
    for name, draft in drafts.items():
      betas = np.asarray(
        _lenient_betas(target, draft, x, t, sampling=sampling, leniences=tuple(leniences))
      )
      sums[name] += (betas * valid[None]).sum(axis=(1, 2))
  return {
    d: {lenience: float(s[i] / max(count, 1)) for i, lenience in enumerate(leniences)}
    for d, s in sums.items()
  }


# ------------------------------------------------------------------------------
# Quality: batched decodes.
# ------------------------------------------------------------------------------
def decode_all(decode, inputs: np.ndarray, batch: int, key) -> dict[str, Any]:
  """Every input decoded in batches: tokens, lengths, log_probs and stats of the real
  rows, concatenated."""
  parts = []
  for i, (x, size) in enumerate(batched(inputs, batch)):
    out = decode(x, jax.random.fold_in(key, i))
    parts.append(jax.tree.map(lambda a, size=size: np.asarray(a)[:size], out))
  return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def distinct_2(rows: Sequence[Sequence[int]]) -> float:
  """Distinct token bigrams over all outputs / bigrams (diversity; 1 is all different)."""
  pairs = [tuple(r[i : i + 2]) for r in rows for i in range(len(r) - 1)]
  return len(set(pairs)) / max(len(pairs), 1)


def quality(
  vocab,
  out,
  references: Sequence[str],
  temperature: float,
  greedy_rows: Sequence[Sequence[int]] | None = None,
):
  """(quality measures, token rows, texts) of one batched decode against references."""
  rows = [out.tokens[b, : out.lengths[b]].tolist() for b in range(len(out.lengths))]
  texts = [vocab.decode(r) for r in rows]
  tokens = int(out.lengths.sum())
  result = dict(
    bleu=metrics.bleu(list(references), texts)["bleu"],
    tokens=tokens,
    distinct_2=distinct_2(rows),
    mean_log_p=(float(out.log_probs.sum() / max(tokens, 1)) if temperature > 0 else None),
  )
  if greedy_rows is not None:
    result["identical_to_greedy"] = float(np.mean([a == b for a, b in zip(rows, greedy_rows)]))
  return result, rows, texts


# ------------------------------------------------------------------------------
# The run.
# ------------------------------------------------------------------------------
def run_lenience(
  *,
  pair: str,
  draft_names,
  leniences: Sequence[float],
  temperatures: Sequence[float],
  gammas: Sequence[int],
  sentences: int | None,
  batch: int,
  alpha_batch: int,
  timed_sentences: int,
  repeats: int,
  input_length: int,
  max_new_tokens: int,
  ngram_sentences: int | None,
  seed: int,
) -> dict[str, Any]:
  start_time = time.time()
  target, _, vocab = pretrained.load_pair(pair)
  drafts = load_drafts(pair, draft_names, vocab, target.vocab_size, ngram_sentences)
  pairs = pretrained.test_sentences(pair)[:sentences]
  inputs = encode_sources(vocab, [en for en, _ in pairs], input_length)
  references = [de for _, de in pairs]
  timed = [jnp.asarray(x)[None] for x in inputs[:timed_sentences]]
  key = jax.random.key(seed)
  baselines, alphas, rows = [], [], []
  costs: dict[tuple[str, int], dict[str, float]] = {}
  for temperature in temperatures:
    sampling = SamplingConfig(temperature=temperature)
    base = decode_all(
      autoregressive_decoder(target, max_new_tokens, sampling, data.EOS_ID), inputs, batch, key
    )
    base_quality, base_rows, _ = quality(vocab, base, references, temperature)
    baselines.append(dict(temperature=temperature, **base_quality))
    logging.getLogger(__name__).info("temperature %g baseline %s", temperature, base_quality)
    tf = lenient_alpha(
      target, drafts, inputs, base.tokens, base.lengths, sampling, leniences, alpha_batch
    )
    for name in drafts:
      alphas.append(
        dict(
          temperature=temperature,
          draft=name,
          alpha={str(lenience): tf[name][lenience] for lenience in leniences},
        )
      )
      logging.getLogger(__name__).info("temperature %g %s alpha_l %s", temperature, name, tf[name])
    greedy_rows = base_rows if sampling.greedy else None
    for name, draft in drafts.items():
      for gamma in gammas:
        if (name, gamma) not in costs:
          costs[name, gamma] = step_costs(
            target, draft, timed[0], gamma, max_new_tokens + gamma + 1, repeats=max(5, repeats)
          )
        cost = costs[name, gamma]
        decoders = {
          lenience: speculative_decoder(
            target, draft, gamma, max_new_tokens, sampling, data.EOS_ID, lenience=lenience
          )
          for lenience in leniences
        }
        timing = time_decodes_paired(
          dict(
            baseline=autoregressive_decoder(target, max_new_tokens, sampling, data.EOS_ID),
            **{str(lenience): d for lenience, d in decoders.items()},
          ),
          timed,
          key,
          repeats,
        )
        base_s = timing["baseline"][0]
        for lenience, decode in decoders.items():
          out = decode_all(decode, inputs, batch, key)
          spec_quality, _, _ = quality(vocab, out, references, temperature, greedy_rows)
          alpha_decode = pooled_alpha(out.stats)
          accepted = int(out.stats.accepted.sum())
          rejected = int(out.stats.rejected.sum())
          spec_s = timing[str(lenience)][0]
          predicted = float(theory.walltime_improvement(alpha_decode, gamma, cost["c"], cost["v"]))
          row = dict(
            temperature=temperature,
            draft=name,
            gamma=gamma,
            lenience=lenience,
            alpha=tf[name][lenience],
            alpha_decode=alpha_decode,
            alpha_accepts=accepted / max(accepted + rejected, 1),
            tokens_per_iteration=pooled_tokens_per_iteration(out.stats),
            eq1=float(theory.expected_tokens(alpha_decode, gamma)),
            c=cost["c"],
            v=cost["v"],
            baseline_ms_per_token=base_s * 1e3,
            speculative_ms_per_token=spec_s * 1e3,
            speedup=base_s / spec_s,
            predicted_speedup=predicted,
            speedup_paper_c=float(
              theory.walltime_improvement(tf[name][lenience], PAPER_GAMMA, PAPER_C)
            ),
            quality=spec_quality,
            quality_baseline=base_quality,
          )
          rows.append(row)
          logging.getLogger(__name__).info(
            "%s",
            {
              k: (round(v, 3) if isinstance(v, float) else v)
              for k, v in row.items()
              if not k.startswith("quality")
            },
          )
  best = []
  for temperature in temperatures:
    for name in drafts:
      for lenience in leniences:
        sel = [
          r
          for r in rows
          if (r["temperature"], r["draft"], r["lenience"]) == (temperature, name, lenience)
        ]
        top = max(sel, key=lambda r: r["speedup"])
        best.append(
          dict(
            temperature=temperature,
            draft=name,
            lenience=lenience,
            gamma=top["gamma"],
            speedup=top["speedup"],
          )
        )
  device = jax.devices()[0]
  return dict(
    config=dict(
      pair=pair,
      drafts=list(drafts),
      leniences=list(leniences),
      temperatures=list(temperatures),
      gammas=list(gammas),
      sentences=len(pairs),
      timed_sentences=len(timed),
      repeats=repeats,
      input_length=input_length,
      max_new_tokens=max_new_tokens,
      ngram_sentences=ngram_sentences,
      seed=seed,
      device=device.device_kind,
      platform=device.platform,
      cpu_count=os.cpu_count(),
      jax_version=jax.__version__,
      command=" ".join(sys.argv),
    ),
    paper=dict(
      table5={str(t): v for t, v in PAPER_TABLE5.items()},
      leniences=list(PAPER_LENIENCES),
      speedups_t0=list(PAPER_SPEEDUPS_T0),
      speedups_t0_from_theorem_3_8=[
        float(theory.walltime_improvement(a, PAPER_GAMMA, PAPER_C))
        for a in PAPER_TABLE5[0.0]["T5-small"]
      ],
    ),
    baselines=baselines,
    alpha=alphas,
    rows=rows,
    best=best,
    seconds=time.time() - start_time,
  )


# ------------------------------------------------------------------------------
# Markdown.
# ------------------------------------------------------------------------------
def _cells(values) -> list[str]:
  return ["-" if v is None else f"{v:.2f}" for v in values]


def markdown(result: dict[str, Any]) -> str:
  cfg = result["config"]
  leniences = cfg["leniences"]
  paper_l = result["paper"]["leniences"]
  lines = [
    f"# Lenience (Appendix A.5): Table 5 for {cfg['pair']}",
    "",
    f"{cfg['sentences']} Multi30k test sentences (alpha, quality), "
    f"{cfg['timed_sentences']} timed at batch 1; {cfg['device']} "
    f"({cfg['platform']}), {cfg['cpu_count']} CPUs; `{cfg['command']}`.",
    "",
    "## alpha_l (mean beta_l along the target's own outputs), beside the paper's",
    "",
    "Paper rows: T5-XXL target on WMT EnDe (Table 5); ours: the shipped pair "
    "on Multi30k. The paper's draft sizes have no counterpart here beyond their "
    "role.",
    "",
  ]
  alpha_rows = []

  def paper_values(values):
    return [
      values[paper_l.index(lenience)] if lenience in paper_l else None for lenience in leniences
    ]

  for temperature in cfg["temperatures"]:
    paper = result["paper"]["table5"].get(str(float(temperature)), {})
    for a in (a for a in result["alpha"] if a["temperature"] == temperature):
      alpha_rows.append(
        [
          f"{temperature:g}",
          a["draft"],
          *_cells(a["alpha"][str(lenience)] for lenience in leniences),
        ]
      )
      if a["draft"] in paper:
        alpha_rows.append(
          [f"{temperature:g}", f"*paper: {a['draft']}*", *_cells(paper_values(paper[a["draft"]]))]
        )
    for name, values in paper.items():
      if name not in cfg["drafts"]:
        alpha_rows.append([f"{temperature:g}", f"*paper: {name}*", *_cells(paper_values(values))])
  lines.append(
    report.markdown_table(
      ["temperature", "draft"] + [f"l = {lenience:g}" for lenience in leniences], alpha_rows
    )
  )
  lines += [
    "",
    "The paper's temperature-0 speed-ups with T5-small, "
    + " / ".join(f"{s:.1f}x" for s in result["paper"]["speedups_t0"])
    + f", are Theorem 3.8 at c = {PAPER_C}, gamma = {PAPER_GAMMA} from its "
    "alphas: "
    + " / ".join(f"{s:.2f}x" for s in result["paper"]["speedups_t0_from_theorem_3_8"])
    + ". The column 'Thm 3.8 at the paper's c' below is the same formula at our "
    "alpha_l.",
    "",
    "## Speed and quality",
    "",
  ]
  rows = []
  for r in result["rows"]:
    q, qb = r["quality"], r["quality_baseline"]
    log_p = "-" if q["mean_log_p"] is None else f"{q['mean_log_p']:.3f}"
    same = q.get("identical_to_greedy")
    rows.append(
      [
        f"{r['temperature']:g}",
        r["draft"],
        r["gamma"],
        f"{r['lenience']:g}",
        f"{r['alpha']:.3f}",
        f"{r['alpha_decode']:.3f}",
        f"{r['alpha_accepts']:.3f}",
        f"{r['tokens_per_iteration']:.2f}",
        f"{r['baseline_ms_per_token']:.2f}",
        f"{r['speculative_ms_per_token']:.2f}",
        f"{r['speedup']:.2f}x",
        f"{r['predicted_speedup']:.2f}x",
        f"{r['speedup_paper_c']:.2f}x",
        f"{q['bleu']:.1f}",
        f"{qb['bleu']:.1f}",
        log_p,
        f"{q['distinct_2']:.3f}",
        "-" if same is None else f"{same:.2f}",
      ]
    )
  lines.append(
    report.markdown_table(
      [
        "temp",
        "draft",
        "gamma",
        "l",
        "alpha_l",
        "alpha decode",
        "alpha accepts",
        "tok/iter",
        "base ms/tok",
        "spec ms/tok",
        "speed-up",
        "predicted",
        "Thm 3.8 at the paper's c",
        "BLEU",
        "BLEU baseline",
        "mean log p",
        "distinct-2",
        "= greedy",
      ],
      rows,
    )
  )
  lines += [
    "",
    "Baselines (the target alone): "
    + "; ".join(
      f"temperature {b['temperature']:g}: BLEU {b['bleu']:.1f}, distinct-2 "
      f"{b['distinct_2']:.3f}"
      + ("" if b["mean_log_p"] is None else f", mean log p {b['mean_log_p']:.3f}")
      for b in result["baselines"]
    )
    + ".",
    "",
    "alpha_l: teacher-forced along the baseline's outputs (the Table 5 cells); "
    "alpha decode: the decode's own mean beta_l (`SpeculativeStats.alpha_hat`); "
    "alpha accepts: accepted / (accepted + rejected). predicted: Theorem 3.8 "
    "refined with the measured c and v at alpha decode (`specdec.bench.measure`). "
    "At temperature 1 BLEU and log p of sampled outputs vary with the seed.",
  ]
  if len(cfg["gammas"]) > 1:
    lines += [
      "",
      "Best measured gamma per setting: "
      + "; ".join(
        f"t {b['temperature']:g} {b['draft']} l {b['lenience']:g}: gamma {b['gamma']} "
        f"({b['speedup']:.2f}x)"
        for b in result["best"]
      )
      + ".",
    ]
  return "\n".join(lines) + "\n"


def run(config: Config) -> dict[str, Any]:
  """Table 5 of the module doc for `config`."""
  if not config.leniences or not config.temperatures:
    raise ValueError("leniences and temperatures: give at least one value each")
  leniences = [check_lenience(lenience) for lenience in config.leniences]
  if any(t < 0 for t in config.temperatures):
    raise ValueError(f"temperatures must be >= 0, got {config.temperatures}")
  cli.check_positive(
    config, "gammas", "batch_size", "alpha_batch", "timed_sentences", "repeats", "max_new_tokens"
  )
  if config.sentences is not None:
    cli.check_positive(config, "sentences")
  if config.input_length < 2:
    raise ValueError(f"input_length must be >= 2, got {config.input_length}")
  return run_lenience(
    pair=config.pair,
    draft_names=list(config.drafts),
    leniences=leniences,
    temperatures=list(config.temperatures),
    gammas=list(config.gammas),
    sentences=config.sentences,
    batch=config.batch_size,
    alpha_batch=config.alpha_batch,
    timed_sentences=config.timed_sentences,
    repeats=config.repeats,
    input_length=config.input_length,
    max_new_tokens=config.max_new_tokens,
    ngram_sentences=config.ngram_sentences,
    seed=config.seed,
  )


render = markdown
