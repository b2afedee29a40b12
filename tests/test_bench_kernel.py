"""scripts/bench_kernel.py: its program computes the chained products (so none is
skipped) and its JSON has t(k), v(k), GB/s and GFLOP/s for every shape and row count."""

import json
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
from script_loader import load_script

ROOT = pathlib.Path(__file__).parents[1]
bench_kernel = load_script("bench_kernel")


def test_stack_program_chains_every_product():
  shapes = [(8, 40), (40, 8)]
  rng = np.random.default_rng(0)
  ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
  from specdec import kernels
  packed = [kernels.pack(jnp.asarray(w)) for w in ws]
  x = rng.standard_normal((3, 8)).astype(np.float32)
  got = bench_kernel.stack_program(shapes, steps=2)(jnp.asarray(x), packed)
  h = x
  for _ in range(2):
    g = h
    for w in ws:
      g = np.tile(g, (1, -(-w.shape[0] // g.shape[1])))[:, :w.shape[0]] @ w * 1e-3
    h = g[:, :x.shape[1]] + x
  np.testing.assert_allclose(np.asarray(got), h, rtol=1e-4, atol=1e-7)


def test_json_fields(tmp_path):
  out = tmp_path / "k.json"
  proc = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "bench_kernel.py"),
       "--kernel_shapes=t5_large_logits", "--kernel_rows=1,2", "--kernel_rounds=1",
       "--kernel_steps=1", f"--kernel_json={out}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads(out.read_text())["shapes"]["t5_large_logits"]
  assert r["weight_bytes"] == 4 * 1024 * 32128 * 4
  for k in ("1", "2"):
    assert set(r["rows"][k]) == {"seconds", "v", "gb_per_s", "gflop_per_s"}
    assert r["rows"][k]["seconds"] > 0
  assert r["rows"]["1"]["v"] == 1.0
