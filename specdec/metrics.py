"""T5's task metrics (t5.evaluation.metrics), for the paper's WMT EnDe and CNN/DM runs.

Same definitions as T5, so that scores compare with T5's published numbers: corpus BLEU
from sacrebleu with its "intl" tokenizer and exponential smoothing, and ROUGE-1/2/Lsum
F-measures from rouge-score, aggregated with its bootstrap (the mid estimate, x100).
Both libraries are imported when a metric runs, so `import specdec.metrics` needs
neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specdec import _optional

ROUGE_KEYS = ("rouge1", "rouge2", "rougeLsum")


def _check_pairs(targets: Sequence[str], predictions: Sequence[str]) -> None:
  if len(targets) != len(predictions):
    raise ValueError(
      f"targets ({len(targets)}) and predictions ({len(predictions)}) must have the same length"
    )
  if not targets:
    raise ValueError("targets: no examples to score")
  for name, texts in (("targets", targets), ("predictions", predictions)):
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
      raise TypeError(f"{name}[{bad[0]}] must be a str, got {type(texts[bad[0]]).__name__}")


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """{'bleu': corpus BLEU in [0, 100]} with one reference per example (T5's `bleu`)."""
  _check_pairs(targets, predictions)
  sacrebleu = _optional.require("sacrebleu", "t5x", "bench", purpose="BLEU")
  score = sacrebleu.corpus_bleu(
    list(predictions),
    [list(targets)],
    smooth_method="exp",
    smooth_value=0.0,
    force=False,
    lowercase=False,
    tokenize="intl",
    use_effective_order=False,
  )
  return {"bleu": float(score.score)}


def _prepare_summary(summary: str) -> str:
  # T5's rule: a newline after each " . " so that rougeLsum splits sentences.
  return summary.replace(" . ", " .\n")


def rouge(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """{'rouge1', 'rouge2', 'rougeLsum'}: bootstrap mid F-measures x100 (T5's `rouge`).

  The bootstrap resamples with numpy's global generator, as in T5, so the last digits
  can vary between calls; identical texts always score 100.
  """
  _check_pairs(targets, predictions)
  rouge_scorer = _optional.require("rouge_score.rouge_scorer", "t5x", "bench", purpose="ROUGE")
  scoring = _optional.require("rouge_score.scoring", "t5x", "bench", purpose="ROUGE")
  scorer = rouge_scorer.RougeScorer(rouge_types=list(ROUGE_KEYS))
  aggregator = scoring.BootstrapAggregator()
  for target, prediction in zip(targets, predictions):
    aggregator.add_scores(
      scorer.score(target=_prepare_summary(target), prediction=_prepare_summary(prediction))
    )
  result = aggregator.aggregate()
  return {key: float(result[key].mid.fmeasure * 100) for key in ROUGE_KEYS}


METRICS: dict[str, Callable[[Sequence[str], Sequence[str]], dict[str, float]]] = {
  "bleu": bleu,
  "rouge": rouge,
}


def metric_fn(name: str) -> Callable[[Sequence[str], Sequence[str]], dict[str, float]]:
  """The metric called `name` ('bleu' or 'rouge')."""
  if name not in METRICS:
    raise ValueError(f"metric: unknown metric {name!r}; known: {sorted(METRICS)}")
  return METRICS[name]


def longest_word_run(text: str) -> int:
  """The most times one whitespace-separated word repeats in a row in `text` (0 for
  an empty text): a degenerate decode's signature ("grünen grünen grünen ...")."""
  words, best, run = text.split(), 0, 0
  for i, word in enumerate(words):
    run = run + 1 if i and word == words[i - 1] else 1
    best = max(best, run)
  return best
