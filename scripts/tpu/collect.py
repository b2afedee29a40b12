"""Collects the runs of run_table2_specdec.sh into the layout of the paper's Table 2.

    python scripts/tpu/collect.py OUT              # the Table 2 layout
    python scripts/tpu/collect.py OUT --details    # plus one row per run

Reads every metrics.json under OUT (as `specdec.run` writes it: `gamma`, `temperature`,
`alpha_hat`, `speedup`, `task`, ...) and prints a Markdown table with a row per task
and temperature, a column per draft (T5-small, T5-base, T5-large) and cells
"gamma / alpha / speed-up", as in Table 2 of Leviathan, Kalman & Matias (ICML 2023).
alpha is the run's `alpha_hat` (the mean of beta over every decoded position); the
speed-up is the measured wall time of the target alone over that of speculative
decoding (present when the run had BASELINE = True, the default). A missing run, or a
missing value, shows as "-".

The draft of a run is read from its directory name (`<task>_t<temp>_<draft>`, as the
launchers name them), else from its config.gin, else from its draft checkpoint path.
Only the standard library is used.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
import json
import pathlib
import re
import sys
from typing import Any

METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.gin"
# specdec's task names (specdec.data.WMT_TASK, CNNDM_TASK) -> (row key, row label).
TASKS = {
  "specdec_wmt14_ende": ("wmt_ende", "WMT EnDe"),
  "specdec_cnn_dailymail": ("cnndm", "CNN/DM"),
}
TASK_ORDER = ("wmt_ende", "cnndm")
TASK_LABELS = dict(TASKS.values())
TEMPERATURES = (0.0, 1.0)
DRAFTS = ("small", "base", "large")
_RUN_NAME = re.compile(r"(?:^|_)(small|base|large)$")
_CONFIG_DRAFT = re.compile(r"DRAFT_MODULE\s*=\s*%T5_1_1_(SMALL|BASE|LARGE)\b")
_PATH_DRAFT = re.compile(r"t5_1_1_(small|base|large)(?![a-z])")
MISSING = "-"


def _draft_of(run_dir: pathlib.Path, metrics: dict[str, Any]) -> str | None:
  """'small' / 'base' / 'large', or None when nothing says."""
  match = _RUN_NAME.search(run_dir.name)
  if match:
    return match.group(1)
  config = run_dir / CONFIG_FILE
  if config.is_file():
    match = _CONFIG_DRAFT.search(config.read_text(encoding="utf-8"))
    if match:
      return match.group(1).lower()
  match = _PATH_DRAFT.search(str(metrics.get("draft_checkpoint_path", "")))
  return match.group(1) if match else None


def load_runs(
  out_dir: str | pathlib.Path, warn=lambda message: print(message, file=sys.stderr)
) -> dict[tuple[str, float, str], dict[str, Any]]:
  """{(task key, temperature, draft): metrics} of every metrics.json under out_dir.

  Files that are not a Table 2 run (another task, temperature or draft) are skipped
  with a warning; of two runs of one cell, the newer file is kept.
  """
  runs: dict[tuple[str, float, str], dict[str, Any]] = {}
  mtimes: dict[tuple[str, float, str], float] = {}
  for path in sorted(pathlib.Path(out_dir).rglob(METRICS_FILE)):
    try:
      metrics = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
      warn(f"collect.py: skipped {path}: {error}")
      continue
    if not isinstance(metrics, dict):
      warn(f"collect.py: skipped {path}: not a JSON object")
      continue
    task = TASKS.get(metrics.get("task"), (None,))[0]
    temperature = metrics.get("temperature")
    draft = _draft_of(path.parent, metrics)
    if task is None or temperature not in TEMPERATURES or draft is None:
      warn(
        f"collect.py: skipped {path}: not a Table 2 run (task "
        f"{metrics.get('task')!r}, temperature {temperature!r}, draft {draft!r})"
      )
      continue
    key = (task, float(temperature), draft)
    mtime = path.stat().st_mtime
    if key in runs:
      warn(
        f"collect.py: two runs of {key}; keeping the newer "
        f"({path if mtime >= mtimes[key] else runs[key]['_path']})"
      )
      if mtime < mtimes[key]:
        continue
    runs[key] = {**metrics, "_path": str(path)}
    mtimes[key] = mtime
  return runs


def _number(value: Any, fmt: str) -> str:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return MISSING
  return format(value, fmt)


def cell(metrics: dict[str, Any] | None) -> str:
  """'gamma / alpha / speed-up' of one run, e.g. '7 / 0.75 / 3.40X'."""
  if metrics is None:
    return MISSING
  speedup = _number(metrics.get("speedup"), ".2f")
  return " / ".join(
    (
      _number(metrics.get("gamma"), "d"),
      _number(metrics.get("alpha_hat"), ".2f"),
      speedup if speedup == MISSING else f"{speedup}X",
    )
  )


def _temperature(t: float) -> str:
  return f"{t:g}"


def table(runs: dict[tuple[str, float, str], dict[str, Any]]) -> str:
  """The Table 2 layout: rows task x temperature, columns draft."""
  lines = [
    "| Task | Temp | " + " | ".join(f"T5-{d}" for d in DRAFTS) + " |",
    "|---|---|" + "---|" * len(DRAFTS),
  ]
  for task in TASK_ORDER:
    for t in TEMPERATURES:
      cells = [cell(runs.get((task, t, d))) for d in DRAFTS]
      lines.append(f"| {TASK_LABELS[task]} | {_temperature(t)} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _score(metrics: dict[str, Any]) -> str:
  """The task metric: BLEU, or ROUGE-1 / -2 / -Lsum."""
  if "bleu" in metrics:
    return f"BLEU {_number(metrics['bleu'], '.2f')}"
  if "rouge1" in metrics:
    return "R1/R2/RLsum " + "/".join(
      _number(metrics.get(k), ".2f") for k in ("rouge1", "rouge2", "rougeLsum")
    )
  return MISSING


def details(runs: dict[tuple[str, float, str], dict[str, Any]]) -> str:
  """One row per run: statistics, times and scores of both decodes."""
  lines = [
    "| Task | Temp | Draft | examples | gamma | alpha | tok/iter | Eq. 1 | "
    "spec s | base s | speed-up | score | baseline score | equal to baseline |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for task in TASK_ORDER:
    for t in TEMPERATURES:
      for d in DRAFTS:
        m = runs.get((task, t, d))
        if m is None:
          continue
        baseline = m.get("baseline") if isinstance(m.get("baseline"), dict) else {}
        speedup = _number(m.get("speedup"), ".2f")
        lines.append(
          "| "
          + " | ".join(
            (
              TASK_LABELS[task],
              _temperature(t),
              f"T5-{d}",
              _number(m.get("num_examples"), "d"),
              _number(m.get("gamma"), "d"),
              _number(m.get("alpha_hat"), ".3f"),
              _number(m.get("tokens_per_iteration"), ".2f"),
              _number(m.get("expected_tokens_per_iteration"), ".2f"),
              _number(m.get("time_s"), ".1f"),
              _number(baseline.get("time_s"), ".1f"),
              speedup if speedup == MISSING else f"{speedup}X",
              _score(m),
              _score(baseline) if baseline else MISSING,
              _number(m.get("tokens_equal_to_baseline"), ".3f"),
            )
          )
          + " |"
        )
  return "\n".join(lines)


def render(
  out_dir: str | pathlib.Path,
  with_details: bool = False,
  warn=lambda message: print(message, file=sys.stderr),
) -> str:
  runs = load_runs(out_dir, warn)
  text = table(runs)
  found = len(runs)
  total = len(TASK_ORDER) * len(TEMPERATURES) * len(DRAFTS)
  text += f"\n\nCells: gamma / alpha / speed-up. {found} of {total} runs found under {out_dir}."
  if with_details and runs:
    text += "\n\n" + details(runs)
  return text


def main(argv: Iterable[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("out_dir", help="the OUT of run_table2_specdec.sh")
  parser.add_argument("--details", action="store_true", help="also print one row per run")
  args = parser.parse_args(None if argv is None else list(argv))
  if not pathlib.Path(args.out_dir).is_dir():
    print(f"collect.py: no such directory: {args.out_dir}", file=sys.stderr)
    return 2
  if not any(pathlib.Path(args.out_dir).rglob(METRICS_FILE)):
    print(
      f"collect.py: no {METRICS_FILE} under {args.out_dir} (T5X runs write none: "
      "collect the runs of run_table2_specdec.sh)",
      file=sys.stderr,
    )
    return 1
  print(render(args.out_dir, args.details))
  return 0


if __name__ == "__main__":
  sys.exit(main())
