"""`python -m specdec.bench lenience` (specdec.bench.lenience): Table 5 of the paper
(Appendix A.5) on the shipped pair; the lenient sampler itself is tested in
test_lenience.py."""

import numpy as np
import pytest

from specdec.bench import lenience


@pytest.mark.parametrize(
  "bad, match",
  [
    (dict(leniences=(0.0,)), "lenience"),
    (dict(temperatures=(-1.0,)), "temperatures"),
    (dict(gammas=(0,)), "gammas"),
    (dict(sentences=0), "sentences"),
    (dict(input_length=1), "input_length"),
  ],
)
def test_bad_settings_are_named(bad, match):
  with pytest.raises(ValueError, match=match):
    lenience.run(lenience.Config(**bad))


@pytest.mark.slow
def test_the_subcommand_runs_on_a_tiny_setting():
  """Table 5 end to end on the shipped pair, four sentences (minutes)."""
  result = lenience.run(
    lenience.Config(
      drafts=("bigram",),
      temperatures=(1.0, 0.0),
      leniences=(1.0, 0.3),
      gammas=(2,),
      sentences=4,
      timed_sentences=1,
      repeats=1,
      max_new_tokens=8,
      batch_size=4,
      alpha_batch=4,
      ngram_sentences=500,
    )
  )
  assert len(result["rows"]) == 2 * 2  # temperatures x leniences
  for a in result["alpha"]:
    # beta_l falls with l at every position, so its mean does too.
    assert 0 <= a["alpha"]["1.0"] <= a["alpha"]["0.3"] <= 1
  for r in result["rows"]:
    assert r["speedup"] > 0 and 0 <= r["alpha_decode"] <= 1
    if r["temperature"] == 0 and r["lenience"] == 1.0:
      assert r["quality"]["identical_to_greedy"] == 1.0  # l = 1 is exact greedy
  np.testing.assert_allclose(
    result["paper"]["speedups_t0_from_theorem_3_8"], result["paper"]["speedups_t0"], atol=0.05
  )
  assert "Table 5" in lenience.render(result)


def test_render_sets_the_papers_row_beside_ours():
  result = dict(
    config=dict(
      leniences=[1.0, 0.3],
      pair="p",
      sentences=4,
      timed_sentences=1,
      device="cpu",
      platform="cpu",
      cpu_count=2,
      command="x",
      temperatures=[0.0],
      drafts=["bigram"],
      gammas=[2],
    ),
    paper=dict(
      leniences=list(lenience.PAPER_LENIENCES),
      table5={"0.0": {"T5-small": [0.75, 0.75, 0.8, 0.87]}},
      speedups_t0=[3.3] * 4,
      speedups_t0_from_theorem_3_8=[3.3] * 4,
    ),
    alpha=[dict(temperature=0.0, draft="bigram", alpha={"1.0": 0.1, "0.3": 0.2})],
    rows=[],
    baselines=[],
    best=[],
  )
  text = lenience.render(result)
  assert "| 0 | bigram | 0.10 | 0.20 |" in text
  assert "| 0 | *paper: T5-small* | 0.75 | 0.80 |" in text
