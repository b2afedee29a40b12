r"""The verification kernel alone: k rows by a model's stack of weight matrices.

    python scripts/bench_kernel.py [--kernel_shapes=smollm2,t5_large_mlp] \
        [--kernel_rows=1,2,3,4,5,8] [--kernel_rounds=5] [--kernel_json=out/bench_kernel.json]

Speculative decoding (Leviathan, Kalman & Matias, ICML 2023) verifies gamma + 1 tokens
in one target call, and its premise is that this costs about one step (v = 1). On a
CPU at batch 1 a step is bound by reading the weights, so each [k, in] x [in, out]
product should cost what k = 1 costs. This times `specdec.kernels.packed_matmul`
alone over the weight shapes of one decoder step, chained in one compiled program
(random float32 weights, packed once; every product's output feeds the next, so none
is skipped): t(k), v(k) = t(k) / t(1), the weights' streaming rate in GB/s and the
multiply-adds in GFLOP/s. Rounds interleave the row counts; the minimum is reported.

Shapes ([in, out] per matrix):
  * smollm2: SmolLM2-135M, 30 x (q 576x576, k, v 576x192, o 576x576, gate, up
    576x1536, down 1536x576) and the tied 576 x 49152 output layer (538 MB);
  * t5_large_mlp: 24 x (wi_0, wi_1 1024x2816, wo 2816x1024) (0.83 GB);
  * t5_large_attention: 144 x 1024x1024 (self- and cross-attention q, k, v, o; 0.60 GB);
  * t5_large_logits: 4 x 1024x32128 (the output layer, 4 copies; 0.53 GB).
"""

from __future__ import annotations

import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from specdec import benchmarking, kernels

_LLAMA_LAYER = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536),
                (576, 1536), (1536, 576)]
SHAPES = {
    "smollm2": _LLAMA_LAYER * 30 + [(576, 49152)],
    "t5_large_mlp": [(1024, 2816), (1024, 2816), (2816, 1024)] * 24,
    "t5_large_attention": [(1024, 1024)] * 144,
    "t5_large_logits": [(1024, 32128)] * 4,
}

_SHAPES = flags.DEFINE_list("kernel_shapes", list(SHAPES), f"Of {list(SHAPES)}.")
_ROWS = flags.DEFINE_list("kernel_rows", ["1", "2", "3", "4", "5", "8"],
                          "Rows k (tokens at batch 1); the first is the reference.")
_ROUNDS = flags.DEFINE_integer("kernel_rounds", 5, "Interleaved rounds (minimum).")
_STEPS = flags.DEFINE_integer("kernel_steps", 4, "Passes over the stack per call.")
_JSON = flags.DEFINE_string("kernel_json", "out/bench_kernel.json", "JSON output.")


def stack_program(shapes, steps: int):
  """A jitted f(x [k, d], packed) running x through every matrix, `steps` times."""

  def run(x, packed):
    def body(_, h):
      for (d_in, d_out), p in zip(shapes, packed):
        reps = -(-d_in // h.shape[1])
        y = kernels.packed_matmul(jnp.tile(h, (1, reps))[:, :d_in], p, d_out)
        h = y * 1e-3  # keeps the values small; the next product depends on this one
      return h[:, :x.shape[1]] + x
    return jax.lax.fori_loop(0, steps, body, x)

  return jax.jit(run)


def measure(name: str, rows: list[int], rounds: int, steps: int) -> dict:
  shapes = SHAPES[name]
  rng = np.random.default_rng(0)
  packed = [kernels.pack(jnp.asarray(rng.standard_normal(s, np.float32) * 0.02))
            for s in shapes]
  f = stack_program(shapes, steps)
  xs = {k: jnp.ones((k, 64), jnp.float32) for k in rows}
  for k in rows:
    jax.block_until_ready(f(xs[k], packed))
  times = {k: [] for k in rows}
  for _ in range(rounds):
    for k in rows:
      t = time.perf_counter()
      jax.block_until_ready(f(xs[k], packed))
      times[k].append((time.perf_counter() - t) / steps)
  weight_bytes = sum(a * b * 4 for a, b in shapes)
  macs = sum(a * b for a, b in shapes)
  t1 = min(times[rows[0]])
  out = dict(matrices=len(shapes), weight_bytes=weight_bytes, rows={})
  for k in rows:
    t = min(times[k])
    out["rows"][str(k)] = dict(seconds=t, v=t / t1, gb_per_s=weight_bytes / t / 1e9,
                               gflop_per_s=2 * k * macs / t / 1e9)
  return out


def main(argv):
  del argv
  rows = [int(r) for r in _ROWS.value]
  results = dict(kernel=kernels.enabled(), device=str(jax.devices()[0]),
                 rounds=_ROUNDS.value, steps=_STEPS.value, shapes={})
  lines = ["| shapes | k | t(k) ms | v(k) | GB/s | GFLOP/s |", "|---|---|---|---|---|---|"]
  for name in _SHAPES.value:
    if name not in SHAPES:
      raise ValueError(f"kernel_shapes: unknown {name!r}; have {list(SHAPES)}")
    r = measure(name, rows, _ROUNDS.value, _STEPS.value)
    results["shapes"][name] = r
    for k, m in r["rows"].items():
      lines.append(f"| {name} | {k} | {m['seconds'] * 1e3:.2f} | {m['v']:.2f} | "
                   f"{m['gb_per_s']:.1f} | {m['gflop_per_s']:.1f} |")
  if not results["kernel"]:
    lines.append("(the kernel is off or unavailable: these are XLA's products)")
  print("\n".join(lines))
  benchmarking.write_json(_JSON.value, results)


if __name__ == "__main__":
  app.run(main)
