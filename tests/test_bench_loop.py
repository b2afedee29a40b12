"""`bench.loop.loop_costs` and `python -m specdec.bench loop` on tiny random Llamas: the
decode loop timed against its parts (the numbers are a benchmark's; here their
bookkeeping)."""

import math

import jax
import jax.numpy as jnp
import pytest

from specdec.bench import loop as bench_loop
from specdec.costs import speculative_decoder
from specdec.distributions import SamplingConfig
from specdec.models import llama

VOCAB, PAD = 97, 0
GREEDY = SamplingConfig(temperature=0.0)


def tiny(seed):
  cfg = llama.tiny_config(vocab_size=VOCAB, num_layers=1)
  return llama.Llama(cfg, jax.device_put(llama.random_params(cfg, seed=seed)), pad_id=PAD)


@pytest.fixture(scope="module")
def pair():
  return tiny(0), tiny(1)


PROMPT = [5, 17, 33, 8, 61]


@pytest.mark.slow  # A benchmark measurement end to end; runs after the default suite.
def test_a_draft_equal_to_the_target_takes_gamma_plus_one_tokens_per_iteration(pair):
  target, _ = pair
  gamma, new = 2, 7
  r = bench_loop.loop_costs(
    target,
    target,
    jnp.asarray([PROMPT]),
    gamma,
    new,
    GREEDY,
    jax.random.key(0),
    rounds=1,
    repeats=1,
  )
  # Every draft token is accepted: 3 tokens per iteration, the last iteration cut.
  assert r["tokens"] == new
  assert r["iterations"] == math.ceil(new / (gamma + 1))
  assert r["tokens_per_iteration"] == pytest.approx(new / r["iterations"])


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_loop_costs_bookkeeping(pair):
  target, draft = pair
  gamma, new = 3, 6
  key = jax.random.key(1)
  for sampling in (GREEDY, SamplingConfig(temperature=1.0)):
    r = bench_loop.loop_costs(
      target, draft, jnp.asarray([PROMPT]), gamma, new, sampling, key, rounds=1, repeats=1
    )
    out = speculative_decoder(target, draft, gamma, new, sampling, None)(jnp.asarray([PROMPT]), key)
    assert r["iterations"] == int(out.stats.iterations[0])
    assert r["tokens"] == new
    # On a tiny model the differences of timings are noise around 0; their
    # sign is a benchmark's business, their arithmetic is checked below.
    for f in bench_loop.MS_FIELDS + ("prefill_target", "prefill_draft"):
      assert math.isfinite(r[f]), f
    assert r["prefill_target"] > 0 and r["prefill_draft"] >= 0
    assert r["overhead"] == pytest.approx(
      r["spec_iteration"] - r["target_chunk"] - r["draft_steps"]
    )
    assert r["speedup"] == pytest.approx(
      r["baseline_token"] * r["tokens_per_iteration"] / r["spec_iteration"]
    )
    assert r["predicted"] == pytest.approx(
      r["tokens_per_iteration"] * r["target_step"] / (r["target_chunk"] + r["draft_steps"])
    )
    assert r["measured_over_predicted"] == pytest.approx(r["speedup"] / r["predicted"])


def test_loop_costs_wants_one_row(pair):
  target, draft = pair
  with pytest.raises(ValueError, match="inputs"):
    bench_loop.loop_costs(
      target, draft, jnp.asarray([PROMPT, PROMPT]), 2, 4, GREEDY, jax.random.key(0)
    )


@pytest.mark.slow  # The benchmark command end to end; runs after the default suite.
def test_the_subcommand_runs_on_a_toy_pair():
  result = bench_loop.run(
    bench_loop.Config(
      pair="toy_llama",
      gammas=(1,),
      temperatures=(0.0,),
      prompts=1,
      max_new_tokens=4,
      rounds=1,
      repeats=1,
    )
  )
  (row,) = result["rows"]
  assert (row["temperature"], row["gamma"], row["prompts"]) == (0.0, 1, 1)
  assert row["tokens"] == 4 and row["iterations"] >= 2
  assert row["v"] == pytest.approx(row["target_chunk"] / row["target_step"])
  assert "meas/pred" in bench_loop.render(result)
  with pytest.raises(ValueError, match="gammas"):
    bench_loop.run(bench_loop.Config(pair="toy_llama", gammas=(0,)))


# Slow (20 s of compiles): the pooling over prompts; `loop_costs`, whose rows it
# pools, is checked in the default suite above.
@pytest.mark.slow
def test_pooled_rows_pool_prompts_and_render_every_row(pair):
  target, draft = pair
  rows = bench_loop.pooled_rows(target, draft, [PROMPT, PROMPT[:3]], [1, 2], [0.0], 5, 1, 1, 0)
  assert [(r["temperature"], r["gamma"]) for r in rows] == [(0.0, 1), (0.0, 2)]
  for r in rows:
    parts = r["per_prompt"]
    assert r["iterations"] == sum(p["iterations"] for p in parts)
    assert r["tokens"] == 10
    assert r["spec_iteration"] == pytest.approx(
      sum(p["spec_iteration"] * p["iterations"] for p in parts) / r["iterations"]
    )
    assert r["v"] == pytest.approx(r["target_chunk"] / r["target_step"])
    assert r["c"] == pytest.approx(r["draft_steps"] / r["gamma"] / r["target_step"])
    # The prediction from the parts is Theorem 3.8's form with c and v.
    assert r["predicted"] == pytest.approx(
      r["tokens_per_iteration"] / (r["gamma"] * r["c"] + r["v"])
    )
  table = bench_loop.render(dict(rows=rows))
  assert table.count("\n") == 1 + len(rows)
  assert "meas/pred" in table
