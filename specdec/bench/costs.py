"""`python -m specdec.bench costs`: what a step costs, and the speed-up that bounds.

For a pair (shipped or toy, or random-weight presets with `--target-config` /
`--draft-config`): t(k), one target `extend` over a chunk of k tokens for k =
1..max_chunk, for each way the target can compute it ("xla": XLA's products;
"per position": T5's output layer position by position, `T5.per_position_logits`;
"packed": `specdec.backends.cpu`, each decoder weight read once per chunk, where it is
enabled); t_q, one draft step, and the draft's 2-token first step. Beside them the
roofline: the target's decoder step weights streamed once by matrix-vector products
in one compiled program (`bench.roofline.weight_stream_seconds`: bytes / bandwidth). Every
time is one call inside a compiled loop (`costs.extend_seconds`), the rounds
interleaved so that a slow spell of a shared machine hits every setting alike, the
minimum over rounds reported.

From them: v(k) = t(k) / t(1), c = t_q / t(1) (Leviathan, Kalman & Matias 2023,
Section 3.4: the paper's premise is v = 1 on an accelerator with idle parallel
compute), and for each gamma the speed-up of a perfect draft (alpha = 1: gamma + 1
tokens per iteration), (gamma + 1) / (gamma c + v(gamma + 1)) -- Theorem 3.8 at alpha
= 1 with the measured v. No draft of this cost does better at batch 1 on this
machine: where the bound is below 1, speculative decoding cannot win here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec.bench import cli, report, workloads
from specdec.bench.roofline import weight_stream_seconds
from specdec.bench.t5_shapes import random_t5_params, t5_shape_config
from specdec.costs import extend_seconds


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field(
    "multi30k_ende", "A shipped pair or a toy pair (ignored with --target-config)."
  )
  draft: str = cli.field("draft", "The pair's draft.")
  target_config: str = cli.field(
    "", "Random weights of this preset instead: a specdec.models.t5.CONFIGS name (or 'tiny')."
  )
  draft_config: str = cli.field("t5_1_1_small", "With --target-config: the draft's preset.")
  max_chunk: int = cli.field(8, "Chunks of 1..max_chunk tokens (k = gamma + 1).")
  rounds: int = cli.field(5, "Interleaved rounds (minimum reported).")
  steps: int = cli.field(16, "extend calls per compiled loop.")
  seed: int = cli.field(0, "Random weights and prompt (presets, toy pairs).")


def random_pair(target_config: str, draft_config: str, seed: int = 0):
  """(target, draft, inputs [1, 32]): random-weight T5 presets, float32 on a CPU
  (`bench.t5_shapes.t5_shape_config`, `bench.t5_shapes.random_t5_params`)."""
  from specdec.models import t5

  models = []
  for i, name in enumerate((target_config, draft_config)):
    cfg = t5_shape_config(name)
    models.append(t5.T5(cfg, random_t5_params(cfg, seed + 1 + i), per_position_logits=0))
  vocab = models[0].vocab_size
  x = jnp.asarray(np.random.default_rng(seed).integers(2, vocab, size=(1, 32)), jnp.int32)
  return models[0], models[1], x


def _unpacked(model):
  """The model computing with XLA's products (no packed copy, one output product)."""
  if getattr(model, "packed", None) is not None:
    model = model.replace(packed=None)
  if hasattr(model, "per_position_logits"):
    model = model.replace(per_position_logits=0)
  return model


def _decode_matrices(model) -> dict[str, Any]:
  if hasattr(model, "per_position_logits"):
    from specdec.models import t5

    return t5.decode_matrices(model.config, model.params)
  from specdec.models import llama

  return llama.decode_matrices(model.config, model.params)


def strategies(target, max_chunk: int) -> dict[str, Any]:
  """{name: the target computing its chunks that way} (module doc)."""
  base = _unpacked(target)
  out = {"xla": base}
  if hasattr(base, "per_position_logits"):
    out["per position"] = base.replace(per_position_logits=max_chunk)
  packed = base.with_packed_weights()
  if packed.packed is not None:
    out["packed"] = packed
  return out


def run(config: Config) -> dict[str, Any]:
  cli.check_positive(config, "max_chunk", "rounds", "steps")
  if config.target_config:
    target, draft, x = random_pair(config.target_config, config.draft_config, config.seed)
    pair, draft_name = config.target_config, config.draft_config
  else:
    w = workloads.load(config.pair, 1, draft=config.draft, seed=config.seed)
    target, draft = w.target, w.drafts[config.draft]
    x = jnp.asarray(w.inputs[:1])
    pair, draft_name = config.pair, config.draft
  models = strategies(target, config.max_chunk)
  if "packed" in models and hasattr(draft, "with_packed_weights"):
    draft = draft.with_packed_weights()
  models["draft"] = draft
  length = config.max_chunk + 1
  states = {name: m.init(x, length) for name, m in models.items()}
  start = target.start_tokens(x)[:, None]
  settings = [
    (name, k)
    for name in models
    for k in ((1, 2) if name == "draft" else range(1, config.max_chunk + 1))
  ]
  best: dict[tuple[str, int], float] = {}
  for _ in range(config.rounds):
    for name, k in settings:
      seconds = extend_seconds(
        models[name], states[name], jnp.tile(start, (1, k)), repeats=1, steps=config.steps
      )
      best[name, k] = min(best.get((name, k), float("inf")), seconds)
  roofline_s, weight_bytes = weight_stream_seconds(
    _decode_matrices(_unpacked(target)), repeats=max(5, config.rounds)
  )
  t_q = best["draft", 1]
  result = dict(
    config=dataclasses.asdict(config),
    pair=pair,
    draft=draft_name,
    backend=jax.default_backend(),
    devices=[str(d) for d in jax.devices()],
    t_q_ms=t_q * 1e3,
    t_q2_ms=best["draft", 2] * 1e3,
    # A shortlist draft's weights are its inner model's.
    draft_packed=getattr(getattr(draft, "inner", draft), "packed", None) is not None,
    weight_bytes=weight_bytes,
    roofline_ms=roofline_s * 1e3,
    roofline_gb_per_s=weight_bytes / roofline_s / 1e9,
    strategies={},
  )
  for name in [n for n in models if n != "draft"]:
    t1 = best[name, 1]
    rows = []
    for k in range(1, config.max_chunk + 1):
      row = dict(
        k=k,
        t_ms=best[name, k] * 1e3,
        v=best[name, k] / t1,
        t_over_roofline=best[name, k] / roofline_s,
      )
      if k > 1:
        gamma = k - 1
        row["speedup_bound_alpha1"] = k / (gamma * t_q / t1 + row["v"])
      rows.append(row)
    result["strategies"][name] = dict(t1_ms=t1 * 1e3, c=t_q / t1, rows=rows)
  return result


def render(result: dict[str, Any]) -> str:
  head = (
    f"{result['pair']} ({result['draft']}) on {result['backend']}: t_q "
    f"{result['t_q_ms']:.3f} ms, draft 2-token step {result['t_q2_ms']:.3f} ms; "
    f"roofline (the {result['weight_bytes'] / 1e6:.1f} MB of decoder step weights "
    f"streamed once): {result['roofline_ms']:.3f} ms "
    f"({result['roofline_gb_per_s']:.1f} GB/s)"
  )
  names = list(result["strategies"])
  rows = []
  for per_strategy in zip(*(result["strategies"][n]["rows"] for n in names)):
    rows.append(
      [per_strategy[0]["k"]]
      + [
        f"{r['t_ms']:.3f} / {r['v']:.2f} / {r['t_over_roofline']:.2f} / "
        + (f"{r['speedup_bound_alpha1']:.2f}x" if "speedup_bound_alpha1" in r else "-")
        for r in per_strategy
      ]
    )
  lines = [
    head,
    "",
    report.markdown_table(
      ["k = gamma + 1"] + [f"{n}: t(k) ms / v / t(k) / roofline / bound at alpha 1" for n in names],
      rows,
    ),
  ]
  for n in names:
    s = result["strategies"][n]
    bound = max((r.get("speedup_bound_alpha1", 0.0) for r in s["rows"]), default=0.0)
    lines.append(
      f"\n{n}: c = {s['c']:.3f}; best speed-up any draft of this cost could "
      f"give (alpha = 1): {bound:.2f}x"
    )
  return "\n".join(lines)
