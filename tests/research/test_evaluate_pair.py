"""scripts/research/evaluate_pair.py: the quality figures of a test set's outputs."""

import pytest

import evaluate_pair

pytestmark = pytest.mark.research


def test_quality_scores_bleu_and_both_degeneration_rates():
  refs = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch.",
    "Kinder laufen am Strand.",
  ]
  same = evaluate_pair.quality(refs, refs, [False] * 4)
  assert same["bleu"] == pytest.approx(100.0)
  assert same["length_limit_rate"] == 0.0 and same["repeat_rate"] == 0.0
  assert same["sentences"] == 4
  hyps = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde Hunde Hunde Hunde",
    "Eine Frau liest ein Buch.",
    "Kinder Kinder Kinder laufen",
  ]
  q = evaluate_pair.quality(hyps, refs, [False, True, False, False])
  assert q["bleu"] < 100.0
  assert q["length_limit_rate"] == 0.25  # one of four ran to the limit
  assert q["repeat_rate"] == 0.25  # one repeats a word 4 times; 3 does not count
