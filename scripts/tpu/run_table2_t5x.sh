#!/usr/bin/env bash
# The paper's Table 2 (Leviathan, Kalman & Matias, ICML 2023) under T5X: `python -m
# t5x.infer` with configs/runs/infer.gin and then each run file (this order: T5X's own
# infer.gin, which infer.gin includes, declares TASK_FEATURE_LENGTHS required and the run
# file sets it). T5-XXL target, T5-small / -base / -large drafts, WMT EnDe and CNN/DM,
# temperatures 0 and 1, each run file's gamma. 12 runs.
#
#   TARGET_CKPT=gs://BUCKET/t5_1_1_xxl_ft/checkpoint_N \
#   SMALL_CKPT=gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000 \
#   BASE_CKPT=gs://t5-data/pretrained_models/t5x/t5_1_1_base/checkpoint_1000000 \
#   LARGE_CKPT=gs://t5-data/pretrained_models/t5x/t5_1_1_large/checkpoint_1000000 \
#   OUT=/data/table2_t5x scripts/tpu/run_table2_t5x.sh [--dry_run]
#
# T5X restores the target from TARGET_CHECKPOINT_PATH; the draft is added to the same
# train state at restore time by specdec.t5x.insert_draft_checkpoint, whose path is
# DRAFT_CHECKPOINT_PATH. Checkpoints and OUT may be gs:// or local. Each run writes
# T5X's <task>-<MODE>.jsonl-00000-of-00001 and config.gin to $OUT/<run>, and its log to
# $OUT/<run>.log; a run whose .jsonl exists is skipped (FORCE=1 reruns it).
#
# Optional: DRY_RUN=1 (or --dry_run) prints the 12 commands and runs nothing;
# NUM_PARTITIONS (default 4, the chips of a TPU-v4-8 host: T5X needs the batch, 1, to
# divide its data axis, so the models are partitioned over every chip; 1 on a one-GPU
# host); MODE (default predict_with_aux: predictions plus per-example scores, iterations,
# accepted and alpha_hat; predict: predictions only); TASKS="wmt_ende" or "cnndm" (one
# task per invocation, for per-task fine-tuned checkpoints); PYTHON (default python).
set -euo pipefail

usage() {
  sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

DRY_RUN="${DRY_RUN:-0}"
for arg in "$@"; do
  case "${arg}" in
    --dry_run|--dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_table2_t5x.sh: unknown argument ${arg}" >&2; usage >&2; exit 2 ;;
  esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python}"
TASKS="${TASKS:-wmt_ende cnndm}"
FORCE="${FORCE:-0}"
NUM_PARTITIONS="${NUM_PARTITIONS:-4}"
MODE="${MODE:-predict_with_aux}"

missing=()
for name in TARGET_CKPT SMALL_CKPT BASE_CKPT LARGE_CKPT OUT; do
  if [[ -z "${!name:-}" ]]; then missing+=("${name}"); fi
done
if (( ${#missing[@]} )); then
  echo "run_table2_t5x.sh: set ${missing[*]} (TARGET_CKPT, SMALL_CKPT, BASE_CKPT," \
       "LARGE_CKPT: T5X checkpoint directories, gs:// or local, of T5-XXL, -small," \
       "-base, -large; OUT: the output directory). See docs/reproducing_table2.md." >&2
  exit 2
fi
for name in TARGET_CKPT SMALL_CKPT BASE_CKPT LARGE_CKPT OUT; do
  if [[ "${!name}" == *"'"* ]]; then
    echo "run_table2_t5x.sh: ${name} must not contain a single quote: ${!name}" >&2
    exit 2
  fi
done
if [[ ! "${NUM_PARTITIONS}" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_table2_t5x.sh: NUM_PARTITIONS must be a positive integer, got" \
       "${NUM_PARTITIONS}" >&2
  exit 2
fi
case "${MODE}" in
  predict|predict_with_aux) ;;
  *) echo "run_table2_t5x.sh: MODE must be predict or predict_with_aux, got ${MODE}" >&2
     exit 2 ;;
esac
case "${OUT}" in /*|*://*) ;; *) OUT="${PWD}/${OUT}" ;; esac
for task in ${TASKS}; do
  case "${task}" in
    wmt_ende|cnndm) ;;
    *) echo "run_table2_t5x.sh: TASKS: unknown task ${task} (wmt_ende, cnndm)" >&2
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

# Whether T5X's merged output of a run exists (local OUT only; gs:// runs always run).
done_already() {
  [[ "${OUT}" != *://* ]] && compgen -G "${OUT}/$1/*-${MODE}.jsonl-*" > /dev/null
}

for task in ${TASKS}; do
  for temp in 0 1; do
    for draft in small base large; do
      run="${task}_t${temp}_${draft}"
      gin_file="configs/runs/${run}.gin"
      if [[ ! -f "${REPO}/${gin_file}" ]]; then
        echo "run_table2_t5x.sh: missing ${REPO}/${gin_file}" >&2
        exit 1
      fi
      cmd=("${PYTHON}" -m t5x.infer "--gin_search_paths=${REPO}"
           "--gin_file=configs/runs/infer.gin"
           "--gin_file=${gin_file}"
           "--gin.OUTPUT_DIR='${OUT}/${run}'"
           "--gin.TARGET_CHECKPOINT_PATH='${TARGET_CKPT}'"
           "--gin.DRAFT_CHECKPOINT_PATH='$(draft_ckpt "${draft}")'"
           "--gin.infer.mode='${MODE}'"
           "--gin.partitioning.PjitPartitioner.num_partitions=${NUM_PARTITIONS}")
      if [[ "${DRY_RUN}" == 1 ]]; then
        show "${cmd[@]}"
        continue
      fi
      if [[ "${FORCE}" != 1 ]] && done_already "${run}"; then
        echo "== ${run}: T5X output exists in ${OUT}/${run}, skipped (FORCE=1 reruns)" >&2
        continue
      fi
      log="${OUT}/${run}.log"
      if [[ "${OUT}" == *://* ]]; then
        log="/tmp/table2_t5x_${run}.log"
      else
        mkdir -p "${OUT}"
      fi
      echo "== ${run}: $(show "${cmd[@]}")" >&2
      "${cmd[@]}" 2>&1 | tee "${log}"
    done
  done
done
