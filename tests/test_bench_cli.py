"""`python -m specdec.bench`: one command, a subcommand per measurement, options from
each subcommand's Config (no shared flag registry), a table printed and JSON written;
and the sampler subcommand."""

import dataclasses
import importlib
import json
import subprocess
import sys

import pytest

from specdec.bench import SUBCOMMANDS, __main__ as bench_main, cli, sampler


def test_every_subcommand_has_a_config_a_run_and_a_render():
  assert set(SUBCOMMANDS) >= {
    "tables",
    "costs",
    "loop",
    "identity",
    "lenience",
    "compare-hf",
    "demo",
    "sampler",
  }
  for name, (module_name, summary) in SUBCOMMANDS.items():
    if name == "compare-hf":
      pytest.importorskip("torch")
      pytest.importorskip("transformers")
    module = importlib.import_module(module_name)
    assert dataclasses.is_dataclass(module.Config) and summary
    assert callable(module.run) and callable(module.render)
    # Defaults make a valid Config, and every field has its help.
    module.Config()
    assert all(f.metadata.get("help") for f in dataclasses.fields(module.Config)), name
    bench_main.build_parser(name).parse_args([name])  # options build without clashes


@dataclasses.dataclass(frozen=True)
class _Example:
  gammas: tuple[int, ...] = cli.field((1, 2), "g")
  temperature: float = cli.field(0.0, "t")
  top_p: float | None = cli.field(None, "p")
  progress: bool = cli.field(True, "b")


def test_options_come_from_the_config_fields():
  import argparse

  parser = argparse.ArgumentParser()
  cli.add_arguments(parser, _Example)
  config = cli.config_from_args(
    _Example, parser.parse_args(["--gammas=3,5", "--temperature=1", "--top-p=0.9", "--no-progress"])
  )
  assert config == _Example(gammas=(3, 5), temperature=1.0, top_p=0.9, progress=False)
  assert cli.config_from_args(_Example, parser.parse_args([])) == _Example()
  assert cli.config_from_args(_Example, parser.parse_args(["--top-p=none"])).top_p is None
  with pytest.raises(SystemExit):
    parser.parse_args(["--gammas=a"])
  with pytest.raises(ValueError, match="gammas must be >= 1"):
    cli.check_positive(_Example(gammas=(0,)), "gammas")


def test_the_sampler_subcommand_prints_a_table_and_writes_json(tmp_path, capsys):
  out = tmp_path / "s.json"
  assert (
    bench_main.main(
      [
        "sampler",
        "--vocab=16",
        "--gammas=1",
        "--max-new-tokens=4",
        "--repeats=1",
        "--temperatures=0",
        f"--out={out}",
      ]
    )
    == 0
  )
  printed = capsys.readouterr().out
  result = json.loads(out.read_text())
  assert [(r["method"], r["gamma"]) for r in result["rows"]] == [
    ("autoregressive", 0),
    ("speculative", 1),
  ]
  assert sampler.render(result) in printed
  assert (tmp_path / "s.md").read_text().strip() == sampler.render(result).strip()
  for r in result["rows"]:
    assert r["us_per_token"] == pytest.approx(r["decode_s"] / 4 * 1e6)


def test_bad_options_exit_with_the_option_named():
  proc = subprocess.run(
    [sys.executable, "-m", "specdec.bench", "sampler", "--gammas=0", "--out="],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2 and "gammas must be >= 1" in proc.stderr
