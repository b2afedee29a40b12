#!/usr/bin/env bash
# The paper's Table 2 (Leviathan, Kalman & Matias, ICML 2023) with `python -m specdec.run`:
# T5-XXL target, T5-small / -base / -large drafts, WMT EnDe and CNN/DM, temperatures 0
# and 1, each run file's gamma (configs/runs/<task>_t<temp>_<draft>.gin). 12 runs.
#
#   TARGET_CKPT=/ckpt/t5_1_1_xxl/checkpoint_1000000 \
#   SMALL_CKPT=/ckpt/t5_1_1_small/checkpoint_1000000 \
#   BASE_CKPT=/ckpt/t5_1_1_base/checkpoint_1000000 \
#   LARGE_CKPT=/ckpt/t5_1_1_large/checkpoint_1000000 \
#   OUT=/data/table2_specdec scripts/tpu/run_table2_specdec.sh [--dry_run]
#
# Checkpoints are local T5X checkpoint directories (specdec.run reads local files only:
# copy gs:// checkpoints first, e.g. `gsutil -m cp -r gs://... /ckpt/`). Each run writes
# predictions.jsonl, metrics.json and config.gin to $OUT/<run>, and its log to
# $OUT/<run>.log; a run whose metrics.json exists is skipped (FORCE=1 reruns it).
#
# Optional: DRY_RUN=1 (or --dry_run) prints the 12 commands and runs nothing;
# TASKS="wmt_ende" or TASKS="cnndm" runs one task only (for per-task fine-tuned
# checkpoints: one invocation per task); PYTHON (default python).
set -euo pipefail

usage() {
  sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

DRY_RUN="${DRY_RUN:-0}"
for arg in "$@"; do
  case "${arg}" in
    --dry_run|--dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_table2_specdec.sh: unknown argument ${arg}" >&2; usage >&2; exit 2 ;;
  esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python}"
TASKS="${TASKS:-wmt_ende cnndm}"
FORCE="${FORCE:-0}"

missing=()
for name in TARGET_CKPT SMALL_CKPT BASE_CKPT LARGE_CKPT OUT; do
  if [[ -z "${!name:-}" ]]; then missing+=("${name}"); fi
done
if (( ${#missing[@]} )); then
  echo "run_table2_specdec.sh: set ${missing[*]} (TARGET_CKPT, SMALL_CKPT, BASE_CKPT," \
       "LARGE_CKPT: local T5X checkpoint directories of T5-XXL, -small, -base," \
       "-large; OUT: the output directory). See docs/reproducing_table2.md." >&2
  exit 2
fi
for name in TARGET_CKPT SMALL_CKPT BASE_CKPT LARGE_CKPT OUT; do
  value="${!name}"
  if [[ "${value}" == *"'"* ]]; then
    echo "run_table2_specdec.sh: ${name} must not contain a single quote: ${value}" >&2
    exit 2
  fi
  if [[ "${name}" != OUT && "${value}" == *://* ]]; then
    echo "run_table2_specdec.sh: ${name}=${value} is not a local path; specdec.run" \
         "reads local checkpoints only (copy it first: gsutil -m cp -r ${value} DIR)" >&2
    exit 2
  fi
done
case "${OUT}" in /*) ;; *) OUT="${PWD}/${OUT}" ;; esac
for task in ${TASKS}; do
  case "${task}" in
    wmt_ende|cnndm) ;;
    *) echo "run_table2_specdec.sh: TASKS: unknown task ${task} (wmt_ende, cnndm)" >&2
       exit 2 ;;
  esac
done

# One shell word per argument, quoted only where needed, for printing.
show() {
  local out=() word
  for word in "$@"; do
    if [[ "${word}" =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then
      out+=("${word}")
    elif [[ "${word}" != *[\"\$\`\\!]* ]]; then
      out+=("\"${word}\"")
    else
      out+=("$(printf '%q' "${word}")")
    fi
  done
  echo "${out[*]}"
}

draft_ckpt() {
  case "$1" in
    small) echo "${SMALL_CKPT}" ;;
    base) echo "${BASE_CKPT}" ;;
    large) echo "${LARGE_CKPT}" ;;
  esac
}

for task in ${TASKS}; do
  for temp in 0 1; do
    for draft in small base large; do
      run="${task}_t${temp}_${draft}"
      gin_file="configs/runs/${run}.gin"
      if [[ ! -f "${REPO}/${gin_file}" ]]; then
        echo "run_table2_specdec.sh: missing ${REPO}/${gin_file}" >&2
        exit 1
      fi
      cmd=("${PYTHON}" -m specdec.run "--gin_search_paths=${REPO}"
           "--gin_file=${gin_file}"
           "--gin.OUTPUT_DIR='${OUT}/${run}'"
           "--gin.TARGET_CHECKPOINT_PATH='${TARGET_CKPT}'"
           "--gin.DRAFT_CHECKPOINT_PATH='$(draft_ckpt "${draft}")'")
      if [[ "${DRY_RUN}" == 1 ]]; then
        show "${cmd[@]}"
        continue
      fi
      if [[ "${FORCE}" != 1 && -f "${OUT}/${run}/metrics.json" ]]; then
        echo "== ${run}: ${OUT}/${run}/metrics.json exists, skipped (FORCE=1 reruns)" >&2
        continue
      fi
      mkdir -p "${OUT}"
      echo "== ${run}: $(show "${cmd[@]}")" >&2
      "${cmd[@]}" 2>&1 | tee "${OUT}/${run}.log"
    done
  done
done

if [[ "${DRY_RUN}" != 1 ]]; then
  echo "== done; the table: ${PYTHON} ${REPO}/scripts/tpu/collect.py ${OUT}" >&2
fi
