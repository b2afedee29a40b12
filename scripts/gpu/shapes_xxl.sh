#!/usr/bin/env bash
# Table 2's shapes on one GPU, in bfloat16: T5-XXL (11B) target, T5-small draft, batch 1,
# random weights drawn on the device (`python -m specdec.bench costs --target-config`):
# t(k) for chunks k = 1..MAX_CHUNK, c, v(k), the roofline and the alpha = 1 bound.
# Prints the device, a device-to-device copy (the memory-bandwidth ceiling the 'GB/s'
# column is read against), then the costs table; writes everything under OUT_DIR.
#
#   OUT_DIR=out/gpu scripts/gpu/shapes_xxl.sh            # PYTHON (default python3)
#   DRAFTS="t5_1_1_small t5_1_1_base" ...                 # more drafts, in turn
#   BUDGET_S=300 ...                                      # start no draft after this
#   TARGET=tiny DRAFTS=tiny PYTHON=.venv/bin/python ...   # a dry run on a CPU
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT_DIR:-out/gpu}"
TARGET="${TARGET:-t5_1_1_xxl}"
DRAFTS="${DRAFTS:-t5_1_1_small}"
MAX_CHUNK="${MAX_CHUNK:-8}"
BUDGET_S="${BUDGET_S:-300}"
mkdir -p "${OUT_DIR}"
export PYTHONPATH="${PWD}${PYTHONPATH:+:${PYTHONPATH}}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv || true
"${PYTHON}" - <<'PY' 2>&1 | tee "${OUT_DIR}/bandwidth.txt"
import time
import jax, jax.numpy as jnp
print("jax", jax.__version__, jax.devices())
x = jax.random.normal(jax.random.key(0), (1024, 1024, 1024), jnp.bfloat16)  # 2 GiB
copy = jax.jit(lambda a: a + 1)
copy(x).block_until_ready()
times = []
for _ in range(20):
  t = time.perf_counter(); copy(x).block_until_ready(); times.append(time.perf_counter() - t)
gb = 2 * x.size * x.dtype.itemsize / 1e9
print(f"read+write {gb:.2f} GB: min {min(times) * 1e3:.2f} ms, {gb / min(times):.0f} GB/s")
PY
for draft in ${DRAFTS}; do
  if (( SECONDS > BUDGET_S )); then
    echo "shapes_xxl.sh: ${SECONDS} s spent; ${draft} not started"; break
  fi
  start=${SECONDS}
  "${PYTHON}" -m specdec.bench costs --target-config="${TARGET}" \
      --draft-config="${draft}" --max-chunk="${MAX_CHUNK}" --rounds=3 \
      --out="${OUT_DIR}/${draft}/costs.json" 2>&1 | tee "${OUT_DIR}/${draft}.log"
  echo "shapes_xxl.sh: ${draft}: $(( SECONDS - start )) s"
done
