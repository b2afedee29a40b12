"""Measures a shipped T5 pair and writes its measurements into pair.json and its card.

    python scripts/research/evaluate_pair.py [--pair=multi30k_ende] \
        [--multi30k_dir=../shared/data/multi30k] [--out_dir=out/evaluate_pair]

On Multi30k test_2016 (the pair's own test set) and WMT newstest2014 (the paper's,
shipped in `specdec.data`; out of this pair's domain):
  * BLEU (sacrebleu's default corpus BLEU) of the target's greedy translations, batched,
    and two degeneration rates: the share of outputs that hit the length limit, and
    the share that repeat one word 4 or more times in a row;
  * alpha (the paper's mean beta) of every shipped draft at temperatures 0 and 1, and of
    the unigram and bigram drafts (Table 3) estimated from the Multi30k train targets;
  * a batch-1 sweep over gamma: alpha, tokens per iteration, measured speed-up over
    the autoregressive baseline, and the speed-up predicted from the measured alpha,
    c and v (Theorem 3.8 refined), and the best gamma.
Writes the measurements into pair.json's "metrics", renders MODEL_CARD.md
(`pair_card.py`), and writes the translations and the sweep under --out_dir
(evaluation.json, sweep.md). Run it on a quiet machine: the sweep is timed.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec import data, metrics as metrics_lib, pretrained, theory
from specdec.bench import alpha as alpha_lib
from specdec.bench.inputs import batched, encode_sources
from specdec.bench.timing import time_decodes_paired
from specdec.costs import autoregressive_decoder, speculative_decoder, step_costs
from specdec.distributions import SamplingConfig
from specdec.drafts import ngram
from specdec.sample import autoregressive_sample, speculative_sample

import pair_card

FLAGS = flags.FLAGS

DATASETS = {
  # name: (input length, max new tokens)
  "multi30k_test_2016": (48, 48),
  "newstest2014": (128, 128),
}
GREEDY = SamplingConfig(temperature=0.0)
RUN = 4  # A word repeated this many times in a row counts as degenerate.


def define_flags() -> None:
  flags.DEFINE_string("pair", "multi30k_ende", "A shipped T5 pair.")
  flags.DEFINE_string(
    "multi30k_dir",
    "../shared/data/multi30k",
    "Multi30k raw files (train.de for the n-gram drafts).",
  )
  flags.DEFINE_string("out_dir", "out/evaluate_pair", "Translations and sweep outputs.")
  flags.DEFINE_list("gammas", [str(g) for g in range(1, 9)], "Sweep gammas.")
  flags.DEFINE_integer("sweep_sentences", 16, "Sentences per sweep setting.")
  flags.DEFINE_integer("newstest_sentences", 1000, "newstest2014 sentences (0: all).")
  flags.DEFINE_integer("batch_size", 128, "Batch for BLEU and alpha decodes.")
  flags.DEFINE_integer("alpha_sentences", 512, "Sentences for alpha.")
  flags.DEFINE_integer("repeats", 3, "Timed rounds per sweep decode (min).")
  flags.DEFINE_bool("sweep", True, "Run the timed batch-1 gamma sweep.")
  flags.DEFINE_string(
    "expected_json",
    "tests/data/multi30k_ende_expected.json",
    "Where to record the target's greedy translations of the first "
    "test_2016 sentences, which the tests compare against ('' for "
    "none).",
  )


def write_expected(path: str, target, vocab, sentences: list[str]) -> None:
  """The target's greedy translations of `sentences`, decoded as the tests decode
  them (one batch, inputs padded to 48, 48 new tokens), into `path`."""
  inputs = jnp.asarray(encode_sources(vocab, sentences, 48))
  out = autoregressive_sample(
    target, inputs, jax.random.key(0), max_new_tokens=48, sampling=GREEDY, eos_id=data.EOS_ID
  )
  record = dict(
    note="Greedy translations of the shipped multi30k_ende target "
    "(max_new_tokens 48, input length 48), recorded when the pair was "
    "shipped (scripts/research/evaluate_pair.py).",
    sources=list(sentences),
    translations=[vocab.decode(r.tolist()) for r in np.asarray(out.tokens)],
  )
  with open(path, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2, ensure_ascii=False)
    f.write("\n")


def load_dataset(pair: str, name: str, limit: int = 0) -> list[tuple[str, str]]:
  if name == "multi30k_test_2016":
    pairs = pretrained.test_sentences(pair)
  else:
    pairs = [(e["en"], e["de"]) for e in data.load_examples(data.WMT_TASK)]
  return pairs[:limit] if limit else pairs


def greedy_translations(target, vocab, inputs, max_new, batch) -> tuple[list[str], list[bool]]:
  """The target's greedy outputs, and whether each ran to `max_new` without EOS."""
  texts, hit_limit = [], []
  for x, size in batched(inputs, batch):
    result = autoregressive_sample(
      target, x, jax.random.key(0), max_new_tokens=max_new, sampling=GREEDY, eos_id=data.EOS_ID
    )
    tokens, lengths = np.asarray(result.tokens)[:size], np.asarray(result.lengths)[:size]
    for row, n in zip(tokens, lengths):
      texts.append(vocab.decode(row[:n].tolist()))
      hit_limit.append(bool(n >= max_new and data.EOS_ID not in row[:n].tolist()))
  return texts, hit_limit


def quality(hyps: list[str], refs: list[str], hit_limit: list[bool]) -> dict:
  """BLEU and the degeneration rates of one test set's greedy outputs."""
  import sacrebleu  # Evaluation-time only.

  runs = [metrics_lib.longest_word_run(h) for h in hyps]
  return dict(
    bleu=float(sacrebleu.corpus_bleu(hyps, [refs]).score),
    length_limit_rate=float(np.mean(hit_limit)),
    repeat_rate=float(np.mean([r >= RUN for r in runs])),
    sentences=len(hyps),
  )


def pooled_alpha(target, draft, inputs, max_new, batch, temperature, gamma=4) -> float:
  beta_sum, beta_count = 0.0, 0
  for i, (x, size) in enumerate(batched(inputs, batch)):
    out = speculative_sample(
      target,
      draft,
      x,
      jax.random.key(i),
      gamma=gamma,
      max_new_tokens=max_new,
      sampling=SamplingConfig(temperature=temperature),
      eos_id=data.EOS_ID,
    )
    beta_sum += float(np.sum(out.stats.beta_sum[:size]))
    beta_count += int(np.sum(out.stats.beta_count[:size]))
  return beta_sum / max(beta_count, 1)


def ngram_drafts(vocab, multi30k_dir: str, vocab_size: int):
  german = data.read_lines(os.path.join(multi30k_dir, "train.de"))
  corpus = [vocab.encode(s) + [data.EOS_ID] for s in german]
  return dict(
    unigram=ngram.Unigram.from_corpus(corpus, vocab_size),
    bigram=ngram.Bigram.from_corpus(corpus, vocab_size),
  )


def sweep(target, drafts, vocab, sentences, input_len, max_new, gammas, repeats):
  """The batch-1 gamma sweep; `drafts` maps each temperature to (name, draft)."""
  inputs = [
    jnp.asarray(x)[None] for x in encode_sources(vocab, [s for s, _ in sentences], input_len)
  ]
  rows = []
  key = jax.random.key(1)
  for temperature, (draft_name, draft) in drafts.items():
    sampling = SamplingConfig(temperature=temperature)
    baseline = autoregressive_decoder(target, max_new, sampling, data.EOS_ID)
    for gamma in gammas:
      costs = step_costs(target, draft, inputs[0], gamma, max_new + gamma + 1)
      timed = time_decodes_paired(
        dict(
          baseline=baseline,
          speculative=speculative_decoder(target, draft, gamma, max_new, sampling, data.EOS_ID),
        ),
        inputs,
        key,
        repeats,
      )
      (base_s, base_out), (spec_s, spec_out) = timed["baseline"], timed["speculative"]
      stats = jax.tree.map(lambda *xs: np.concatenate(xs), *[o.stats for o in spec_out])
      alpha = alpha_lib.pooled_alpha(stats)
      predicted = float(theory.walltime_improvement(alpha, gamma, costs["c"], costs["v"]))
      row = dict(
        temperature=temperature,
        draft=draft_name,
        gamma=gamma,
        alpha=alpha,
        tokens_per_iteration=alpha_lib.pooled_tokens_per_iteration(stats),
        eq1=float(theory.expected_tokens(alpha, gamma)),
        c=costs["c"],
        v=costs["v"],
        baseline_ms_per_token=base_s * 1e3,
        speculative_ms_per_token=spec_s * 1e3,
        speedup=base_s / spec_s,
        predicted_speedup=predicted,
        predicted_speedup_paper=float(theory.walltime_improvement(alpha, gamma, costs["c"])),
        measured_over_predicted=(base_s / spec_s) / predicted,
      )
      if temperature == 0.0:
        row["identical_to_baseline"] = all(
          bool(jnp.array_equal(b.tokens, s.tokens)) for b, s in zip(base_out, spec_out)
        )
      rows.append(row)
      logging.warning(
        "%s", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}
      )
  return rows


def best_rows(rows: list[dict]) -> list[dict]:
  """Per temperature, the sweep row of the highest measured speed-up."""
  temps = sorted({r["temperature"] for r in rows})
  return [
    max((r for r in rows if r["temperature"] == t), key=lambda r: r["speedup"]) for t in temps
  ]


def markdown_sweep(results: dict) -> str:
  lines = []
  for name, rows in results.items():
    lines += [
      f"\n### {name}\n",
      "| temp | draft | gamma | alpha | tok/iter | Eq. 1 | c | v | base ms/tok | "
      "spec ms/tok | speed-up | predicted | meas/pred |",
      "|" + "---|" * 13,
    ]
    for r in rows:
      lines.append(
        f"| {r['temperature']:g} | {r['draft']} | {r['gamma']} | {r['alpha']:.3f} | "
        f"{r['tokens_per_iteration']:.2f} | {r['eq1']:.2f} | {r['c']:.3f} | "
        f"{r['v']:.2f} | {r['baseline_ms_per_token']:.2f} | "
        f"{r['speculative_ms_per_token']:.2f} | {r['speedup']:.2f}x | "
        f"{r['predicted_speedup']:.2f}x | {r['measured_over_predicted']:.2f} |"
      )
  return "\n".join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start = time.time()
  pair = FLAGS.pair
  target, _, vocab = pretrained.load_pair(pair)
  shipped = {d: pretrained.load_model(pair, d) for d in pretrained.drafts(pair)}
  drafts = dict(**shipped, **ngram_drafts(vocab, FLAGS.multi30k_dir, target.vocab_size))
  metrics = dict(bleu={}, quality={}, alpha={k: {} for k in drafts}, sentences={}, best={})
  translations, sweeps = {}, {}
  for name, (input_len, max_new) in DATASETS.items():
    pairs = load_dataset(pair, name, FLAGS.newstest_sentences if name == "newstest2014" else 0)
    inputs = encode_sources(vocab, [s for s, _ in pairs], input_len)
    hyps, hit_limit = greedy_translations(target, vocab, inputs, max_new, FLAGS.batch_size)
    q = quality(hyps, [r for _, r in pairs], hit_limit)
    metrics["quality"][name] = q
    metrics["bleu"][name] = q["bleu"]
    translations[name] = [
      dict(en=s, de=r, output=h, hit_limit=limit)
      for (s, r), h, limit in zip(pairs, hyps, hit_limit)
    ]
    logging.warning("%s %s", name, q)
    alpha_inputs = inputs[: FLAGS.alpha_sentences]
    metrics["sentences"][name] = dict(bleu=len(pairs), alpha=len(alpha_inputs))
    for draft_name, d in drafts.items():
      metrics["alpha"][draft_name][name] = {
        str(int(t)): pooled_alpha(target, d, alpha_inputs, max_new, FLAGS.batch_size, t)
        for t in (0.0, 1.0)
      }
      logging.warning("%s alpha %s %s", name, draft_name, metrics["alpha"][draft_name][name])
    if FLAGS.sweep:
      # Each temperature with the shipped draft of the higher alpha on Multi30k.
      chosen = {
        t: (b, shipped[b]) for t in (0.0, 1.0) for b in [pretrained.best_draft(pair, t, metrics)]
      }
      sweeps[name] = sweep(
        target,
        chosen,
        vocab,
        pairs[: FLAGS.sweep_sentences],
        input_len,
        max_new,
        [int(g) for g in FLAGS.gammas],
        FLAGS.repeats,
      )
      metrics["best"][name] = best_rows(sweeps[name])
  if FLAGS.expected_json:
    write_expected(
      FLAGS.expected_json, target, vocab, [en for en, _ in pretrained.test_sentences(pair)[:4]]
    )
  metrics["seconds"] = time.time() - start
  info_path = pretrained.pair_dir(pair) / "pair.json"
  info = pretrained.pair_info(pair)
  info["metrics"] = metrics
  with open(info_path, "w") as f:
    json.dump(info, f, indent=2)
    f.write("\n")
  pair_card.write_card(pair)
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "evaluation.json"), "w") as f:
    json.dump(dict(metrics=metrics, translations=translations, sweeps=sweeps), f, indent=2)
  table = markdown_sweep(sweeps)
  with open(os.path.join(FLAGS.out_dir, "sweep.md"), "w") as f:
    f.write(table + "\n")
  print(json.dumps({k: v for k, v in metrics.items() if k != "best"}, indent=2))
  print(table)


if __name__ == "__main__":
  define_flags()
  app.run(main)
