"""scripts/bench_verify.py: both output-layer strategies timed, v and the alpha = 1
bound derived from the timings (tiny settings)."""


import pytest
from script_loader import load_script

bench_verify = load_script("bench_verify")


def test_costs_and_the_perfect_draft_bound():
  result = bench_verify.measure("multi30k_ende", "draft", max_chunk=2, rounds=1, steps=2)
  assert result["t_q_ms"] > 0 and result["t_q2_ms"] > 0
  assert set(result["strategies"]) == {"target, one product", "target, per position",
                                       "target, packed"}
  assert result["draft_packed"]
  assert result["roofline_ms"] > 0 and result["weight_bytes"] > 0
  assert result["roofline_gb_per_s"] == pytest.approx(
      result["weight_bytes"] / result["roofline_ms"] / 1e6)
  for s in result["strategies"].values():
    rows = s["rows"]
    assert [r["k"] for r in rows] == [1, 2]
    assert rows[0]["v"] == 1.0 and "speedup_bound_alpha1" not in rows[0]
    assert s["c"] == pytest.approx(result["t_q_ms"] / s["t1_ms"])
    for r in rows[1:]:
      assert r["v"] == pytest.approx(r["t_ms"] / s["t1_ms"])
      assert r["t_over_roofline"] == pytest.approx(r["t_ms"] / result["roofline_ms"])
      gamma = r["k"] - 1
      assert r["speedup_bound_alpha1"] == pytest.approx(r["k"] / (gamma * s["c"] + r["v"]))
  text = bench_verify.table(result)
  assert "bound at alpha 1" in text and "per position" in text and "roofline" in text


# Slow (23 s, random T5-small weights built and packed): the preset path of a
# benchmark option; the default suite keeps the shipped pair's run above.
@pytest.mark.slow
def test_preset_shapes_instead_of_the_shipped_pair():
  """--target_config / --draft_config: random-weight presets, float32 on a CPU, the
  roofline over the preset's own decoder step weights."""
  result = bench_verify.measure("multi30k_ende", "draft", max_chunk=2, rounds=1, steps=2,
                                target_config="t5_1_1_small",
                                draft_config="t5_1_1_small")
  assert (result["pair"], result["draft"]) == ("t5_1_1_small", "t5_1_1_small")
  import jax.numpy as jnp
  from specdec.models import t5
  cfg = t5.CONFIGS["t5_1_1_small"].replace(dtype=jnp.float32)
  expected = sum(int(w.size) * 4 for w, _ in t5.decode_matrices(
      cfg, t5.random_params(cfg)).values())
  assert result["weight_bytes"] == expected
  assert [r["k"] for r in result["strategies"]["target, one product"]["rows"]] == [1, 2]
  with pytest.raises(ValueError, match="t5_1_1_huge"):
    bench_verify.random_pair("t5_1_1_huge", "t5_1_1_small")
