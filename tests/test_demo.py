"""The README's main job runs end to end (tiny settings)."""

import json

from specdec import demo, pretrained


def test_the_demo_runs_on_two_sentences(tmp_path):
  result = demo.run("multi30k_ende", num_sentences=2, gamma=2, max_new_tokens=8,
                    input_length=48, repeats=1, seed=0, progress=False)
  assert [r["temperature"] for r in result["rows"]] == [0.0, 1.0]
  # Each temperature runs the shipped draft of the higher measured alpha.
  assert [r["draft"] for r in result["rows"]] == [
      pretrained.best_draft("multi30k_ende", t) for t in (0.0, 1.0)]
  assert all(r["gamma"] == 2 and r["costs"]["v"] > 0 for r in result["rows"])
  assert result["rows"][0]["identical_to_baseline"]
  for row in result["rows"]:
    assert 0.0 <= row["alpha"] <= 1.0
    assert 1.0 <= row["tokens_per_iteration"] <= 3.0
    assert row["speedup"] > 0 and row["predicted_speedup"] > 0
    assert row["nonfinite_positions"] == 0
  assert len(result["examples"]) == 2
  table = demo.format_table(result)
  assert "meas/pred" in table
  demo.save_plot(result, str(tmp_path / "plot.png"))
  assert (tmp_path / "plot.png").stat().st_size > 1000
  json.dumps(result)
