r"""What verifying gamma + 1 tokens costs here, and the speed-up that bounds.

    python scripts/bench_verify.py [--model_pair=multi30k_ende] [--max_chunk=8] \
        [--rounds=5] [--output=out/bench_verify.json]
    python scripts/bench_verify.py --target_config=t5_1_1_large \
        --draft_config=t5_1_1_small --rounds=3 --output=out/bench_verify_large.json

For the shipped pair: t(k), one target `extend` over a chunk of k tokens, for
k = 1..max_chunk, with XLA's products (the output layer as one [k, E] x [E, V]
product, and position by position: `T5.per_position_logits`) and with packed
weights (`T5.with_packed_weights`: `specdec.kernels` reads each decoder weight once
per chunk, the default on a CPU); t_q, one draft step, and the draft's 2-token first
step (the draft packed too where the target is). Beside them the roofline: the
decoder's step weights streamed once by matrix-vector products in one compiled
program (`specdec.benchmarking.weight_stream_seconds`, ms and GB/s). Every time is one call inside a compiled loop
(`specdec.benchmarking.extend_seconds`), the rounds interleaved so that a slow spell of
a shared machine hits every setting alike, and the minimum over rounds reported.

From them: v(k) = t(k) / t(1), c = t_q / t(1), and for each gamma the speed-up with a
perfect draft (alpha = 1: gamma + 1 tokens per iteration),
(gamma + 1) / (gamma c + v(gamma + 1)) -- Theorem 3.8 at alpha = 1 with the measured v.
No draft of this cost can do better at batch 1 on this machine: where the bound is
below 1, speculative decoding cannot beat the baseline here, whatever the acceptance.
(The paper's premise is v = 1 on an accelerator with idle parallel compute.)

With `--target_config` and `--draft_config` (`specdec.models.t5.CONFIGS` names, e.g.
the paper's T5-XXL / T5-small, or T5-large here) the same for those shapes with
random weights (float32 on a CPU, the presets' dtype elsewhere) on 32 random input
tokens, instead of the shipped pair.
"""

from __future__ import annotations

import json
import os

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from specdec import benchmarking, data, pretrained
from specdec.models import t5

_PAIR = flags.DEFINE_string("model_pair", "multi30k_ende", "A shipped pair.")
_DRAFT = flags.DEFINE_string("which_draft", "draft", "Which shipped draft.")
_MAX_CHUNK = flags.DEFINE_integer("max_chunk", 8, "Chunks of 1..max_chunk tokens.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved rounds (minimum reported).")
_STEPS = flags.DEFINE_integer("steps", 32, "Calls per compiled loop.")
_OUTPUT = flags.DEFINE_string("output", "out/bench_verify.json", "JSON output.")
_TARGET_CFG = flags.DEFINE_string("target_config", None, "A t5.CONFIGS name: random-"
                                  "weight shapes instead of --model_pair.")
_DRAFT_CFG = flags.DEFINE_string("draft_config", "t5_1_1_small",
                                 "The draft's t5.CONFIGS name (with --target_config).")


def random_pair(target_config: str, draft_config: str, seed: int = 0):
  """(target, draft, inputs [1, 32]): random-weight T5 presets, float32 on a CPU
  (`benchmarking.t5_shape_config`, `benchmarking.random_t5_params`)."""
  models = []
  for i, name in enumerate((target_config, draft_config)):
    cfg = benchmarking.t5_shape_config(name)
    models.append(t5.T5(cfg, benchmarking.random_t5_params(cfg, seed + 1 + i),
                        per_position_logits=0))
  x = jnp.asarray(np.random.default_rng(seed).integers(2, 32000, size=(1, 32)),
                  jnp.int32)
  return models[0], models[1], x


def measure(pair: str, draft_name: str, max_chunk: int, rounds: int, steps: int,
            target_config: str | None = None, draft_config: str = "t5_1_1_small"
            ) -> dict:
  if target_config:
    target, draft, x = random_pair(target_config, draft_config)
    pair, draft_name = target_config, draft_config
  else:
    target, draft, vocab = pretrained.load_pair(pair, per_position_logits=0,
                                                draft=draft_name)
    x = jnp.asarray(vocab.encode_padded(
        data.TRANSLATE_PREFIX + pretrained.test_sentences(pair)[0][0], 48))[None]
  length = max_chunk + 1
  models = {"target, one product": target,
            "target, per position": target.replace(per_position_logits=max_chunk)}
  packed = target.with_packed_weights()
  if packed.packed is not None:
    models["target, packed"] = packed
    draft = draft.with_packed_weights()
  models["draft"] = draft
  states = {name: m.init(x, length) for name, m in models.items()}
  chunks = {"draft": (1, 2)}
  settings = [(name, k) for name in models
              for k in chunks.get(name, range(1, max_chunk + 1))]
  best = {}
  for _ in range(rounds):
    for name, k in settings:
      seconds = benchmarking.extend_seconds(models[name], states[name],
                                            jnp.zeros((1, k), jnp.int32), repeats=1,
                                            steps=steps)
      best[name, k] = min(best.get((name, k), float("inf")), seconds)
  roofline_s, weight_bytes = benchmarking.weight_stream_seconds(
      t5.decode_matrices(target.config, target.params), repeats=max(5, rounds))
  t_q = best["draft", 1]
  result = dict(pair=pair, draft=draft_name, backend=jax.default_backend(),
                t_q_ms=t_q * 1e3, t_q2_ms=best["draft", 2] * 1e3,
                draft_packed=draft.packed is not None, weight_bytes=weight_bytes,
                roofline_ms=roofline_s * 1e3,
                roofline_gb_per_s=weight_bytes / roofline_s / 1e9, strategies={})
  for name in [n for n in models if n != "draft"]:
    t1 = best[name, 1]
    rows = []
    for k in range(1, max_chunk + 1):
      row = dict(k=k, t_ms=best[name, k] * 1e3, v=best[name, k] / t1,
                 t_over_roofline=best[name, k] / roofline_s)
      if k > 1:
        gamma = k - 1
        row["speedup_bound_alpha1"] = k / (gamma * t_q / t1 + row["v"])
      rows.append(row)
    result["strategies"][name] = dict(t1_ms=t1 * 1e3, c=t_q / t1, rows=rows)
  return result


def table(result: dict) -> str:
  lines = [f"{result['pair']} ({result['draft']}) on {result['backend']}: t_q "
           f"{result['t_q_ms']:.3f} ms, draft 2-token step {result['t_q2_ms']:.3f} ms; "
           f"roofline (the {result['weight_bytes'] / 1e6:.1f} MB of decoder step "
           f"weights streamed once): {result['roofline_ms']:.3f} ms "
           f"({result['roofline_gb_per_s']:.1f} GB/s)", ""]
  names = list(result["strategies"])
  lines.append("| k = gamma + 1 | " + " | ".join(
      f"{n}: t(k) ms / v / t(k) / roofline / bound at alpha 1" for n in names) + " |")
  lines.append("|---|" + "---|" * len(names))
  rows = zip(*(result["strategies"][n]["rows"] for n in names))
  for per_strategy in rows:
    cells = [f"{r['t_ms']:.3f} / {r['v']:.2f} / {r['t_over_roofline']:.2f} / "
             + (f"{r['speedup_bound_alpha1']:.2f}x" if "speedup_bound_alpha1" in r
                else "-") for r in per_strategy]
    lines.append(f"| {per_strategy[0]['k']} | " + " | ".join(cells) + " |")
  for n in names:
    s = result["strategies"][n]
    bound = max(r.get("speedup_bound_alpha1", 0.0) for r in s["rows"])
    lines.append(f"\n{n}: c = {s['c']:.3f}; best speed-up any draft of this cost could "
                 f"give (alpha = 1): {bound:.2f}x")
  return "\n".join(lines)


def main(argv):
  del argv
  result = measure(_PAIR.value, _DRAFT.value, _MAX_CHUNK.value, _ROUNDS.value,
                   _STEPS.value, _TARGET_CFG.value, _DRAFT_CFG.value)
  text = table(result)
  print(text)
  os.makedirs(os.path.dirname(_OUTPUT.value) or ".", exist_ok=True)
  with open(_OUTPUT.value, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  app.run(main)
