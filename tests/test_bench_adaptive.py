"""`python -m specdec.bench adaptive`: its run() on a toy pair, its table and JSON."""

import json

import numpy as np
import pytest

from specdec import adaptive
from specdec.bench import __main__ as bench_main, adaptive as bench_adaptive


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_run_times_baseline_fixed_gammas_and_adaptive_side_by_side():
  config = bench_adaptive.Config(
    pair="toy_llama",
    temperatures=(0.0,),
    batches=(1, 2),
    fixed_gammas=(1, 3),
    num_prompts=2,
    max_new_tokens=8,
    repeats=1,
  )
  result = bench_adaptive.run(config)
  rows = result["rows"]
  assert [(r["temperature"], r["batch"]) for r in rows] == [(0.0, 1), (0.0, 2)]
  for r in rows:
    assert set(r["fixed_ms"]) == {"1", "3"} and r["best_fixed_gamma"] in (1, 3)
    assert r["best_fixed_ms"] == min(r["fixed_ms"].values())
    assert np.isclose(r["adaptive_speedup"], r["baseline_ms"] / r["adaptive_ms"])
    assert sum(r["gamma_histogram"].values()) > 0
    assert r["predicted_speedup"] > 0 and r["predicted_speedup_model"] > 0
    # measured / predicted is the decode loop's: both prefills come off.
    assert r["prefill_s"]["baseline"] > 0 and r["prefill_s"]["adaptive"] > 0
    assert np.isclose(r["measured_over_predicted"], r["loop_speedup"] / r["predicted_speedup"])
  assert len(rows[0]["per_prompt"]) == 2 and "per_prompt" not in rows[1]
  text = bench_adaptive.render(result)
  assert "adaptive / best fixed" in text and "toy_llama" in text


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_command_line_writes_json_and_markdown(tmp_path, capsys):
  out = tmp_path / "adaptive.json"
  assert (
    bench_main.main(
      [
        "adaptive",
        "--pair=toy_t5",
        "--temperatures=1",
        "--fixed-gammas=2",
        "--num-prompts=1",
        "--max-new-tokens=6",
        "--repeats=1",
        f"--out={out}",
      ]
    )
    == 0
  )
  result = json.loads(out.read_text())
  assert result["rows"][0]["pair"] == "toy_t5"
  assert (tmp_path / "adaptive.md").read_text().startswith("| pair |")
  assert "wrote" in capsys.readouterr().out


def test_the_shipped_pairs_ship_their_step_costs():
  for pair, drafts in (
    ("smollm2_135m_instruct", ("draft", "draft+lookup")),
    ("multi30k_ende", ("draft", "draft_distilled")),
  ):
    for draft in drafts:
      for temperature in (0.0, 1.0):
        costs = bench_adaptive.shipped_costs(pair, 1, draft, temperature)
        assert isinstance(costs, adaptive.StepCosts), (pair, draft)
        assert costs.batch == 1 and costs.c > 0 and costs.v_of(9) >= 1.0
        # The loop's own iterations, timed at every gamma of the default set.
        assert [g for g, _ in costs.iteration] == list(adaptive.DEFAULT_GAMMAS), (pair, draft)


def test_auto_gamma_is_the_pairs_measured_costs_with_its_measured_alpha_as_prior():
  from specdec import pretrained

  for pair, draft in (
    ("multi30k_ende", "draft_distilled"),
    ("smollm2_135m_instruct", "draft+lookup"),
  ):
    for temperature in (0.0, 1.0):
      costs = pretrained.step_costs(pair, draft, batch=1, temperature=temperature)
      rule = pretrained.auto_gamma(pair, temperature, draft=draft)
      # The pair's set (pair.json "auto_gammas", else the default), less the gammas
      # no alpha would choose at these costs.
      shipped = pretrained.shipped_gammas(pair)
      assert rule.gammas == adaptive.useful_gammas(
        shipped, [costs.cost(g) for g in shipped], rule.margin
      )
      assert set(rule.gammas) <= set(shipped) and 0 in rule.gammas
      assert rule.costs == tuple(costs.cost(g) for g in rule.gammas)
      assert rule.prior == pretrained.measured_alpha(pair, draft, temperature)
      assert 0.0 < rule.prior < 1.0
  assert pretrained.step_costs("smollm2_135m_instruct", "draft+lookup", batch=3).batch <= 3
  # The T5 pair's measured set ({0, 1}: pair.json says why); an explicit set wins.
  info = pretrained.pair_info("multi30k_ende")
  assert pretrained.shipped_gammas("multi30k_ende") == (0, 1) and info["auto_gammas_why"]
  assert pretrained.shipped_gammas("smollm2_135m_instruct") == adaptive.DEFAULT_GAMMAS
  assert (
    3
    in pretrained.auto_gamma("multi30k_ende", 0.0, draft="draft_distilled", gammas=(0, 1, 3)).gammas
  )
  with pytest.raises(ValueError, match="draft"):
    pretrained.auto_gamma("multi30k_ende", 0.0, draft="nope")
  with pytest.raises(ValueError, match="temperature"):
    pretrained.step_costs("multi30k_ende", "draft", 1, temperature=-1.0)


def test_step_costs_are_the_ones_timed_nearest_the_temperature(tmp_path, monkeypatch):
  from specdec import pretrained
  from specdec.pretrained import costs as pair_costs

  def entry(temperature, batch, cost):
    return json.loads(
      adaptive.StepCosts(
        c=0.1, v=((2, 1.1),), batch=batch, iteration=((0, 1.0), (1, cost)), temperature=temperature
      ).to_json()
    )

  table = {
    "draft": {
      "0.0": {"1": entry(0.0, 1, 1.2), "4": entry(0.0, 4, 1.5)},
      "1.0": {"1": entry(1.0, 1, 1.3)},
    }
  }
  (tmp_path / "costs.json").write_text(json.dumps(table))
  # A pair "p" with one draft, whose weights are tmp_path.
  monkeypatch.setattr(pair_costs, "pair_dir", lambda name: tmp_path)
  monkeypatch.setattr(pair_costs, "check_draft", lambda name, draft: None)

  def timed(temperature, batch=1):
    costs = pretrained.step_costs("p", "draft", batch, temperature)
    return costs.temperature, costs.batch

  assert timed(0.0) == (0.0, 1) and timed(0.0, batch=8) == (0.0, 4)
  # A sampled decode gets the sampled loop's costs, at any positive temperature.
  assert timed(1.0) == (1.0, 1) and timed(0.3) == (1.0, 1)
  # The batch size first: temperature 1 was not timed at 4, temperature 0 was.
  assert timed(2.0, batch=8) == (0.0, 4) and timed(1.0, batch=4) == (0.0, 4)
  # Greedy costs only: every temperature uses them.
  del table["draft"]["1.0"]
  (tmp_path / "costs.json").write_text(json.dumps(table))
  assert timed(1.0) == (0.0, 1)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_every_batch_size_reads_the_costs_and_prior_of_the_draft_it_decodes_with(monkeypatch):
  """The greedy check once named its loop variable like the draft: every batch size
  after the first then asked for the costs and the prior of a draft named 'adaptive'."""
  asked, costs = [], adaptive.StepCosts(c=0.1, v=((2, 1.1), (9, 1.5)))
  monkeypatch.setattr(
    bench_adaptive,
    "shipped_costs",  # given: nothing is calibrated
    lambda pair, batch, draft="draft", temperature=0.0: asked.append(draft) or costs,
  )
  monkeypatch.setattr(
    bench_adaptive, "measured_alpha", lambda pair, draft, temperature: asked.append(draft)
  )
  bench_adaptive.run(
    bench_adaptive.Config(
      pair="toy_llama",
      temperatures=(0.0,),
      batches=(1, 2),
      fixed_gammas=(1,),
      num_prompts=2,
      max_new_tokens=4,
      repeats=1,
    )
  )
  assert asked == ["draft"] * 4


def test_the_bootstrap_intervals_hold_the_ratios_and_widen_with_their_spread():
  from types import SimpleNamespace

  out = lambda n: [SimpleNamespace(lengths=np.asarray([10]))] * n
  rng = np.random.default_rng(0)
  base = list(rng.uniform(1.0, 2.0, 16))
  steady = {
    "baseline": (base, out(16)),
    "adaptive": ([b / 2 for b in base], out(16)),
    "gamma=1": ([b / 1.5 for b in base], out(16)),
    "gamma=2": ([b / 1.6 for b in base], out(16)),
  }
  r = bench_adaptive._bootstrap(steady, (1, 2))
  assert np.allclose(r["adaptive_speedup_interval"], [2.0, 2.0])
  assert np.allclose(r["adaptive_over_best_fixed_interval"], [1.25, 1.25])
  # Per-input ratios that scatter (sampled text): an interval around the total ratio.
  noisy = dict(steady, adaptive=([b / rng.uniform(1.0, 3.0) for b in base], out(16)))
  lo, hi = bench_adaptive._bootstrap(noisy, (1, 2))["adaptive_speedup_interval"]
  total = sum(base) / sum(noisy["adaptive"][0])
  assert lo < total < hi and hi - lo > 0.1


def test_step_costs_name_an_empty_batch_table(tmp_path, monkeypatch):
  from specdec.pretrained import costs

  (tmp_path / "costs.json").write_text(json.dumps({"draft": {"0.0": {}}}))
  monkeypatch.setattr(costs, "pair_dir", lambda name: tmp_path)
  monkeypatch.setattr(costs, "check_draft", lambda name, draft: None)
  with pytest.raises(ValueError, match="no batch sizes"):
    costs.step_costs("p", "draft", 1, 0.0)
