"""`python -m specdec.bench costs` (specdec.bench.costs): every way of computing a
chunk timed, v and the alpha = 1 bound derived from the timings (tiny settings)."""

import pytest

from specdec.bench import costs


def _check(result, names):
  assert result["t_q_ms"] > 0 and result["t_q2_ms"] > 0
  assert set(result["strategies"]) == set(names)
  assert result["roofline_ms"] > 0 and result["weight_bytes"] > 0
  assert result["roofline_gb_per_s"] == pytest.approx(
    result["weight_bytes"] / result["roofline_ms"] / 1e6
  )
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
  text = costs.render(result)
  assert "bound at alpha 1" in text and "roofline" in text


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_shipped_pair_with_every_strategy():
  result = costs.run(costs.Config(max_chunk=2, rounds=1, steps=2))
  packed = {"packed"} if result["draft_packed"] else set()
  _check(result, {"xla", "per position"} | packed)


@pytest.mark.slow  # The benchmark command end to end; runs after the default suite.
def test_a_decoder_only_toy_pair_has_no_per_position_strategy():
  result = costs.run(costs.Config(pair="toy_llama", max_chunk=2, rounds=1, steps=2))
  assert "per position" not in result["strategies"] and "xla" in result["strategies"]
  with pytest.raises(ValueError, match="max_chunk"):
    costs.run(costs.Config(max_chunk=0))


# Slow (23 s, random T5-small weights built and packed): the preset path.
@pytest.mark.slow
def test_preset_shapes_instead_of_the_shipped_pair():
  result = costs.run(
    costs.Config(
      target_config="t5_1_1_small", draft_config="t5_1_1_small", max_chunk=2, rounds=1, steps=2
    )
  )
  assert (result["pair"], result["draft"]) == ("t5_1_1_small", "t5_1_1_small")
  import jax.numpy as jnp

  from specdec.models import t5

  cfg = t5.CONFIGS["t5_1_1_small"].replace(dtype=jnp.float32)
  expected = sum(
    int(w.size) * 4 for w, _ in t5.decode_matrices(cfg, t5.random_params(cfg)).values()
  )
  assert result["weight_bytes"] == expected
  with pytest.raises(ValueError, match="t5_1_1_huge"):
    costs.random_pair("t5_1_1_huge", "t5_1_1_small")
