"""`python -m specdec.run`: arguments, errors, and a tiny T5 pair end to end."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

gin = pytest.importorskip("gin", reason="gin-config is not installed (specdec[t5x])")

from specdec import run  # noqa: E402 - after importorskip
from specdec.distributions import SamplingConfig  # noqa: E402 - after importorskip
from specdec.models import t5  # noqa: E402 - after importorskip

from t5_helpers import tiny_config, tiny_pair_gin  # noqa: E402 - after importorskip


@pytest.fixture(autouse=True)
def fresh_gin():
  gin.clear_config(clear_constants=False)
  yield
  gin.clear_config(clear_constants=False)


def test_parse_args():
  files, bindings, paths = run.parse_args(
    [
      "--gin_file=a.gin",
      "--gin_file",
      "b.gin",
      "--gin.OUTPUT_DIR='/x'",
      "--gin_bindings=GAMMA = 3",
      "--gin_search_paths=p,q",
    ]
  )
  assert files == ["a.gin", "b.gin"]
  assert bindings == ["OUTPUT_DIR = '/x'", "GAMMA = 3"]
  # Last, the installed package's configs: run files resolve from any directory.
  assert paths[:-1] == ["p", "q", "."]
  assert pathlib.Path(paths[-1]) == pathlib.Path(run.__file__).parent
  assert (pathlib.Path(paths[-1]) / "configs" / "runs" / "infer.gin").is_file()


def test_run_files_resolve_from_another_directory(tmp_path):
  # A fresh process outside the checkout (this one has the checkout on sys.path).
  proc = subprocess.run(
    [sys.executable, "-m", "specdec.run", "--gin_file=configs/runs/wmt_ende_t0_small.gin"],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  # The run file and its includes were found: only the output directory is missing.
  assert proc.returncode == 2, proc.stderr[-4000:]
  assert "gin macro OUTPUT_DIR is unset" in proc.stderr


@pytest.mark.parametrize(
  "argv,error",
  [
    ([], "no --gin_file"),
    (["--gin_file"], "needs a value"),
    (["--gin_file=a.gin", "--gamma=3"], "unknown argument '--gamma=3'"),
    (["--gin_file=a.gin", "--gin.GAMMA"], "expected --gin.NAME=VALUE"),
  ],
)
def test_parse_args_errors(argv, error):
  with pytest.raises(ValueError, match=error):
    run.parse_args(argv)


def test_unset_and_undefined_macros_are_named():
  with pytest.raises(ValueError, match="gin macro OUTPUT_DIR is unset"):
    run.main(["--gin_file=configs/runs/wmt_ende_t0_small.gin"])
  gin.clear_config(clear_constants=False)
  with pytest.raises(ValueError, match="gin macro TASK is not defined"):
    run.main(["--gin_file=configs/pairs/xxl_small.gin", "--gin.OUTPUT_DIR='/x'"])


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
  directory = tmp_path_factory.mktemp("pair")
  tiny_pair_gin(directory, "wmt_ende_t0_small.gin")
  return directory


def _evaluate(**overrides):
  kwargs = dict(
    task="specdec_wmt14_ende",
    task_feature_lengths={"inputs": 24, "targets": 8},
    batch_size=1,
    target_module=t5.Transformer(tiny_config("target")),
    draft_module=t5.Transformer(tiny_config("draft")),
    target_checkpoint_path="/nonexistent",
    draft_checkpoint_path="/x",
    gamma=3,
    sampling=SamplingConfig(0.0),
    output_dir="/tmp/unused",
  )
  kwargs.update(overrides)
  return run.evaluate(**kwargs)


@pytest.mark.parametrize(
  "overrides,error",
  [
    (dict(task="wmt"), "task: unknown task"),
    (dict(task_feature_lengths={"inputs": 24}), "task_feature_lengths"),
    (dict(batch_size=0), "batch_size"),
    (dict(gamma=0), "gamma"),
    (dict(sampling=0.0), "sampling"),
    (dict(output_dir=""), "output_dir"),
    (dict(target_checkpoint_path="gs://t5-data/x"), "not a local path"),
    (dict(), "target_checkpoint_path: no such file"),
    (dict(target_module=object()), None),
  ],
)
def test_evaluate_names_bad_arguments(tiny_checkpoints, overrides, error):
  if error is None:  # a checkpoint exists; the module is what is wrong
    overrides.update(target_checkpoint_path=str(tiny_checkpoints / "target"))
    error = "target_module must be"
  with pytest.raises((ValueError, TypeError, FileNotFoundError), match=error):
    _evaluate(**overrides)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_tiny_pair_end_to_end(tmp_path):
  """Greedy: predictions equal the target's own greedy decode, token for token."""
  gin_file = tiny_pair_gin(tmp_path, "wmt_ende_t0_small.gin")
  out = tmp_path / "out"
  result = run.main([f"--gin_file={gin_file}", f"--gin.OUTPUT_DIR='{out}'", "--gin.GAMMA=3"])
  assert json.loads((out / run.METRICS_FILE).read_text()) == result
  assert result["num_examples"] == 3 and result["gamma"] == 3
  assert result["temperature"] == 0.0 and 0.0 <= result["bleu"] <= 100.0
  assert result["baseline"]["bleu"] == result["bleu"]
  assert result["tokens_equal_to_baseline"] == 1.0
  assert 0.0 <= result["alpha_hat"] <= 1.0 and result["speedup"] > 0
  assert 1.0 <= result["tokens_per_iteration"] <= 4.0
  records = [json.loads(line) for line in (out / run.PREDICTIONS_FILE).read_text().splitlines()]
  assert [r["index"] for r in records] == [0, 1, 2]
  assert records[0]["inputs"] == (
    "translate English to German: Gutach: Increased safety for pedestrians"
  )
  for r in records:
    assert r["prediction"] == r["baseline_prediction"] and r["baseline_tokens_equal"]
    assert r["drafted"] == 3 * r["iterations"] and 0 <= r["accepted"] <= r["drafted"]
    assert 1 <= r["length"] <= 8 and r["time_s"] > 0
    assert r["tokens_per_iteration"] == pytest.approx(
      (r["accepted"] + r["iterations"]) / r["iterations"]
    )
  assert sum(r["iterations"] for r in records) == result["target_calls"]
  assert "run.evaluate" in (out / run.CONFIG_FILE).read_text()
