"""scripts/tpu: the Table 2 launchers, collect.py and docs/reproducing_table2.md;
CITATION.cff.

Fast: the launchers only print their commands here (DRY_RUN=1); nothing is decoded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
TPU = REPO / "scripts" / "tpu"
SCRIPTS = {"t5x": TPU / "run_table2_t5x.sh", "specdec": TPU / "run_table2_specdec.sh"}
COLLECT = TPU / "collect.py"
GUIDE = REPO / "docs" / "reproducing_table2.md"
TASKS = ("wmt_ende", "cnndm")
DRAFTS = ("small", "base", "large")
RUNS = [f"{task}_t{temp}_{draft}" for task in TASKS for temp in (0, 1) for draft in DRAFTS]
CKPTS = {
  "TARGET_CKPT": "/ckpt/t5_1_1_xxl/checkpoint_1000000",
  "SMALL_CKPT": "/ckpt/t5_1_1_small/checkpoint_1000000",
  "BASE_CKPT": "/ckpt/t5 base/checkpoint_1000000",  # a space survives quoting
  "LARGE_CKPT": "/ckpt/t5_1_1_large/checkpoint_1000000",
}
# Variables the launchers read; cleared so that the caller's environment cannot leak in.
LAUNCHER_VARS = (
  "TARGET_CKPT",
  "SMALL_CKPT",
  "BASE_CKPT",
  "LARGE_CKPT",
  "OUT",
  "DRY_RUN",
  "TASKS",
  "PYTHON",
  "FORCE",
  "NUM_PARTITIONS",
  "MODE",
)
GIN_PATH = re.compile(r"configs/[A-Za-z0-9_/]+\.gin")

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


def _env(**overrides: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
  env.update(overrides)
  return env


def _launch(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    ["bash", str(SCRIPTS[script]), *args],
    capture_output=True,
    text=True,
    timeout=60,
    env=_env(**env),
    cwd=REPO,
  )


def _dry_run(script: str, out: pathlib.Path, *args: str, **env: str) -> list[list[str]]:
  proc = _launch(script, *args, **{**CKPTS, "OUT": str(out), "DRY_RUN": "1", **env})
  assert proc.returncode == 0, proc.stderr
  return [shlex.split(line) for line in proc.stdout.splitlines()]


def _flags(argv: list[str], name: str) -> list[str]:
  prefix = f"--{name}="
  return [a[len(prefix) :] for a in argv if a.startswith(prefix)]


def _gin_value(path: pathlib.Path, macro: str) -> str:
  match = re.search(rf"^{macro}\s*=\s*(.+)$", path.read_text(), re.MULTILINE)
  assert match, f"{path}: no {macro}"
  return match.group(1).strip()


def _includes(path: pathlib.Path) -> list[str]:
  return re.findall(r"^include\s+'([^']+)'", path.read_text(), re.MULTILINE)


# ------------------------------------------------------------------------------
# Gin files.
# ------------------------------------------------------------------------------
def test_gin_files_named_by_launchers_and_readme_exist():
  named = set()
  for path in (*SCRIPTS.values(), GUIDE):
    named |= set(GIN_PATH.findall(path.read_text()))
  named |= {f"configs/runs/{run}.gin" for run in RUNS}
  assert "configs/runs/infer.gin" in named
  missing = sorted(n for n in named if not (REPO / n).is_file())
  assert not missing, missing
  # And what they include, recursively (T5X's own files excepted).
  todo, seen = sorted(named), set()
  while todo:
    name = todo.pop()
    if name in seen or name.startswith("t5x/"):
      continue
    seen.add(name)
    assert (REPO / name).is_file(), name
    todo += _includes(REPO / name)


def test_readme_run_table_matches_the_run_files():
  rows = re.findall(
    r"^\| (WMT EnDe|CNN/DM) \| ([01]) \| T5-(small|base|large) \| (\d+) "
    r"\| `(configs/runs/[a-z0-9_]+\.gin)` \|$",
    GUIDE.read_text(),
    re.MULTILINE,
  )
  assert len(rows) == 12
  assert sorted(pathlib.Path(r[4]).stem for r in rows) == sorted(RUNS)
  for task, temp, draft, gamma, name in rows:
    path = REPO / name
    assert name == (
      f"configs/runs/{'wmt_ende' if task == 'WMT EnDe' else 'cnndm'}_t{temp}_{draft}.gin"
    )
    assert int(_gin_value(path, "GAMMA")) == int(gamma), name
    assert float(_gin_value(path, "TEMPERATURE")) == float(temp), name
    assert f"configs/pairs/xxl_{draft}.gin" in _includes(path), name


# ------------------------------------------------------------------------------
# The launchers.
# ------------------------------------------------------------------------------
@needs_bash
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_bash_syntax(script):
  proc = subprocess.run(
    ["bash", "-n", str(SCRIPTS[script])], capture_output=True, text=True, timeout=60
  )
  assert proc.returncode == 0, proc.stderr


@needs_bash
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_dry_run_prints_the_twelve_commands(script, tmp_path):
  out = tmp_path / "out"
  commands = _dry_run(script, out)
  assert len(commands) == 12
  module = "t5x.infer" if script == "t5x" else "specdec.run"
  runs = []
  for argv in commands:
    assert argv[:3] == ["python", "-m", module], argv
    assert _flags(argv, "gin_search_paths") == [str(REPO)]
    files = _flags(argv, "gin_file")
    for name in files:
      assert (REPO / name).is_file(), name
    run = pathlib.Path(files[-1]).stem
    runs.append(run)
    # Under t5x.infer, infer.gin comes before the run file; specdec.run takes it alone.
    expected = ["configs/runs/infer.gin"] if script == "t5x" else []
    assert files == expected + [f"configs/runs/{run}.gin"]
    draft = run.rsplit("_", 1)[1]
    assert _flags(argv, "gin.OUTPUT_DIR") == [f"'{out}/{run}'"]
    assert _flags(argv, "gin.TARGET_CHECKPOINT_PATH") == [f"'{CKPTS['TARGET_CKPT']}'"]
    assert _flags(argv, "gin.DRAFT_CHECKPOINT_PATH") == [f"'{CKPTS[draft.upper() + '_CKPT']}'"]
    if script == "t5x":
      assert _flags(argv, "gin.infer.mode") == ["'predict_with_aux'"]
      assert _flags(argv, "gin.partitioning.PjitPartitioner.num_partitions") == ["4"]
  assert sorted(runs) == sorted(RUNS) and len(set(runs)) == 12
  assert not out.exists()  # a dry run creates nothing


@needs_bash
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_dry_run_flag_tasks_and_python(script, tmp_path):
  out = tmp_path / "out"
  by_env = _dry_run(script, out)
  proc = _launch(script, "--dry_run", **CKPTS, OUT=str(out))
  assert proc.returncode == 0, proc.stderr
  assert [shlex.split(line) for line in proc.stdout.splitlines()] == by_env
  cnndm = _dry_run(script, out, TASKS="cnndm", PYTHON="/opt/py/bin/python3")
  assert len(cnndm) == 6
  assert all(argv[0] == "/opt/py/bin/python3" for argv in cnndm)
  assert all(_flags(argv, "gin_file")[-1].startswith("configs/runs/cnndm_") for argv in cnndm)
  # A relative OUT becomes absolute (the commands may run from anywhere).
  relative = _dry_run(script, pathlib.Path("rel_out"))
  assert _flags(relative[0], "gin.OUTPUT_DIR") == [f"'{REPO}/rel_out/{RUNS[0]}'"]


@needs_bash
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_unset_variables_are_named(script):
  env = {k: v for k, v in CKPTS.items() if k != "SMALL_CKPT"}
  proc = _launch(script, DRY_RUN="1", **env)
  assert proc.returncode == 2
  assert "SMALL_CKPT OUT" in proc.stderr and not proc.stdout
  proc = _launch(script, "--bogus", **CKPTS, OUT="/o")
  assert proc.returncode == 2 and "unknown argument --bogus" in proc.stderr
  proc = _launch(script, DRY_RUN="1", **CKPTS, OUT="/o", TASKS="wmt")
  assert proc.returncode == 2 and "unknown task wmt" in proc.stderr


@needs_bash
def test_specdec_launcher_refuses_remote_checkpoints():
  proc = _launch("specdec", DRY_RUN="1", **{**CKPTS, "TARGET_CKPT": "gs://b/xxl"}, OUT="/o")
  assert proc.returncode == 2 and "not a local path" in proc.stderr
  # T5X reads gs:// itself.
  proc = _launch("t5x", DRY_RUN="1", **{**CKPTS, "TARGET_CKPT": "gs://b/xxl"}, OUT="gs://b/out")
  assert proc.returncode == 0, proc.stderr
  argv = shlex.split(proc.stdout.splitlines()[0])
  assert _flags(argv, "gin.OUTPUT_DIR") == [f"'gs://b/out/{RUNS[0]}'"]


@needs_bash
def test_t5x_launcher_options(tmp_path):
  commands = _dry_run("t5x", tmp_path / "out", NUM_PARTITIONS="1", MODE="predict")
  assert all(
    _flags(a, "gin.partitioning.PjitPartitioner.num_partitions") == ["1"] for a in commands
  )
  assert all(_flags(a, "gin.infer.mode") == ["'predict'"] for a in commands)
  for bad in ({"NUM_PARTITIONS": "0"}, {"MODE": "score"}):
    proc = _launch("t5x", DRY_RUN="1", **CKPTS, OUT="/o", **bad)
    assert proc.returncode == 2, bad


# ------------------------------------------------------------------------------
# collect.py.
# ------------------------------------------------------------------------------
def _collect_module():
  spec = importlib.util.spec_from_file_location("tpu_collect", COLLECT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _write_run(
  out: pathlib.Path,
  name: str,
  task: str,
  temperature: float,
  gamma: int,
  alpha: float,
  speedup: float | None,
) -> dict:
  """A run directory as specdec.run writes it, through specdec.run's own functions."""
  from specdec import run
  from specdec.distributions import SamplingConfig

  records = [
    {
      "targets": "Das ist ein Haus .",
      "prediction": "Das ist ein Haus .",
      "baseline_prediction": "Das ist ein Haus .",
      "baseline_tokens_equal": True,
    },
    {
      "targets": "Ein Hund läuft .",
      "prediction": "Der Hund läuft .",
      "baseline_prediction": "Der Hund läuft .",
      "baseline_tokens_equal": True,
    },
  ]
  stats = {
    "beta_sum": np.array([alpha * 40, alpha * 60]),
    "beta_count": np.array([40, 60]),
    "iterations": np.array([10, 12]),
    "accepted": np.array([30, 35]),
    "length": np.array([40, 47]),
  }
  result = run.summarize(
    records,
    stats,
    "bleu" if task == "wmt_ende" else "rouge",
    gamma,
    SamplingConfig(temperature),
    [2.0],
    None if speedup is None else [2.0 * speedup],
  )
  result.update(
    task={"wmt_ende": "specdec_wmt14_ende", "cnndm": "specdec_cnn_dailymail"}[task],
    target_checkpoint_path="/ckpt/t5_1_1_xxl/checkpoint_1000000",
    draft_checkpoint_path="/ckpt/d/checkpoint_1000000",
    batch_size=1,
    seed=0,
  )
  run.write_outputs(out / name, [], result)
  return result


def test_collect_renders_table2(tmp_path):
  pytest.importorskip("sacrebleu")
  pytest.importorskip("rouge_score")
  out = tmp_path / "out"
  written = _write_run(out, "wmt_ende_t0_small", "wmt_ende", 0.0, 7, 0.75, 3.4)
  _write_run(out, "cnndm_t1_base", "cnndm", 1.0, 3, 0.5, 2.0)
  _write_run(out, "nested/wmt_ende_t1_large", "wmt_ende", 1.0, 3, 0.25, None)
  # A directory name that does not say the draft: config.gin does.
  _write_run(out, "my_run", "cnndm", 0.0, 5, 0.6, 1.5)
  (out / "my_run" / "config.gin").write_text("DRAFT_MODULE = %T5_1_1_LARGE\n")
  # Not a Table 2 setting: skipped with a warning.
  _write_run(out, "wmt_ende_t05_small", "wmt_ende", 0.5, 7, 0.7, 3.0)
  (out / "broken").mkdir()
  (out / "broken" / "metrics.json").write_text("{not json")

  saved = json.loads((out / "wmt_ende_t0_small" / "metrics.json").read_text())
  assert saved == written
  assert {
    "gamma",
    "temperature",
    "alpha_hat",
    "speedup",
    "task",
    "bleu",
    "tokens_per_iteration",
    "expected_tokens_per_iteration",
    "baseline",
    "num_examples",
    "time_s",
    "tokens_equal_to_baseline",
  } <= set(saved)

  collect = _collect_module()
  warnings = []
  text = collect.render(out, with_details=True, warn=warnings.append)
  table = text.split("\n\n")[0].splitlines()
  assert table == [
    "| Task | Temp | T5-small | T5-base | T5-large |",
    "|---|---|---|---|---|",
    "| WMT EnDe | 0 | 7 / 0.75 / 3.40X | - | - |",
    "| WMT EnDe | 1 | - | - | 3 / 0.25 / - |",
    "| CNN/DM | 0 | - | - | 5 / 0.60 / 1.50X |",
    "| CNN/DM | 1 | - | 3 / 0.50 / 2.00X | - |",
  ]
  assert "4 of 12 runs found" in text
  assert len(warnings) == 2
  assert any("wmt_ende_t05_small" in w and "not a Table 2 run" in w for w in warnings)
  assert any("broken" in w for w in warnings)
  details = text.split("\n\n")[2].splitlines()
  assert len(details) == 2 + 4
  assert details[2].startswith("| WMT EnDe | 0 | T5-small | 2 | 7 | 0.750 |")
  assert "BLEU " in details[2] and "R1/R2/RLsum " in details[-1]

  proc = subprocess.run(
    [sys.executable, str(COLLECT), str(out)], capture_output=True, text=True, timeout=60
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[:6] == table
  assert "not a Table 2 run" in proc.stderr


def test_collect_readme_names_every_metrics_key(tmp_path):
  """The README's list of metrics.json keys covers what specdec.run writes."""
  pytest.importorskip("sacrebleu")
  result = _write_run(tmp_path, "wmt_ende_t0_small", "wmt_ende", 0.0, 7, 0.75, 3.4)
  readme = GUIDE.read_text()
  missing = [k for k in result if f"`{k}`" not in readme]
  assert not missing, missing


def test_collect_without_runs(tmp_path):
  proc = subprocess.run(
    [sys.executable, str(COLLECT), str(tmp_path)], capture_output=True, text=True, timeout=60
  )
  assert proc.returncode == 1 and "no metrics.json" in proc.stderr
  proc = subprocess.run(
    [sys.executable, str(COLLECT), str(tmp_path / "nope")],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 2 and "no such directory" in proc.stderr


# ------------------------------------------------------------------------------
# CITATION.cff.
# ------------------------------------------------------------------------------
def _pyproject_version() -> str:
  text = (REPO / "pyproject.toml").read_text()
  try:
    import tomllib
  except ImportError:  # Python 3.10
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE).group(1)
  return tomllib.loads(text)["project"]["version"]


def test_citation_cff():
  yaml = pytest.importorskip("yaml")
  cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
  for key in (
    "cff-version",
    "message",
    "title",
    "version",
    "license",
    "authors",
    "preferred-citation",
  ):
    assert key in cff, key
  assert cff["cff-version"] == "1.2.0"
  assert cff["title"] == "specdec"
  assert str(cff["version"]) == _pyproject_version()
  assert cff["license"] == "Apache-2.0"
  assert cff["authors"] == [{"name": "specdec developers"}]
  paper = cff["preferred-citation"]
  assert paper["type"] == "conference-paper"
  assert paper["title"] == "Fast Inference from Transformers via Speculative Decoding"
  assert [(a["given-names"], a["family-names"]) for a in paper["authors"]] == [
    ("Yaniv", "Leviathan"),
    ("Matan", "Kalman"),
    ("Yossi", "Matias"),
  ]
  assert (paper["year"], paper["volume"], paper["start"], paper["end"]) == (2023, 202, 19274, 19286)
  assert "ICML 2023" in paper["conference"]["name"]
  assert any("2211.17192" in str(i["value"]) for i in paper["identifiers"])


def test_citation_agrees_with_readme_bibtex():
  yaml = pytest.importorskip("yaml")
  paper = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))["preferred-citation"]
  readme = (REPO / "README.md").read_text(encoding="utf-8")
  bibtex = re.search(r"```bibtex\n(.*?)```", readme, re.DOTALL)
  assert bibtex, "README.md has no BibTeX block"
  fields = dict(re.findall(r"^\s*(\w+)\s*=\s*\{(.*)\},?\s*$", bibtex.group(1), re.MULTILINE))
  assert fields["title"] == paper["title"]
  assert fields["author"] == " and ".join(
    f"{a['family-names']}, {a['given-names']}" for a in paper["authors"]
  )
  assert int(fields["year"]) == paper["year"]
  assert int(fields["volume"]) == paper["volume"]
  assert fields["pages"] == f"{paper['start']}--{paper['end']}"
  assert fields["booktitle"] == paper["collection-title"]
