"""The docs and the model cards name only what exists: every `scripts/...` path, every
`python -m ...` module (and `python -m specdec.bench` subcommand) in README.md,
docs/ and specdec/weights/**/*.md."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

from specdec.bench import SUBCOMMANDS

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted(
  [
    ROOT / "README.md",
    *(ROOT / "docs").glob("**/*.md"),
    *(ROOT / "specdec" / "weights").glob("**/*.md"),
  ]
)
# A path under scripts/ (a file or a folder), not part of a longer path or a URL.
SCRIPT_PATH = re.compile(r"(?<![\w./-])scripts/[\w./-]*[\w/]")
MODULE = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)(?: ([a-z][a-z0-9-]*))?")


def _named(pattern: re.Pattern) -> list[tuple[str, re.Match]]:
  return [
    (path.relative_to(ROOT).as_posix(), m)
    for path in DOCS
    for m in pattern.finditer(path.read_text())
  ]


def _module_exists(name: str) -> bool:
  """A module of this checkout by its file; any other by the installed packages."""
  if name == "specdec" or name.startswith("specdec."):
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()
  return importlib.util.find_spec(name) is not None


def test_the_docs_are_found():
  names = {p.relative_to(ROOT).as_posix() for p in DOCS}
  assert {
    "README.md",
    "docs/benchmarks.md",
    "specdec/weights/smollm2_135m_instruct/MODEL_CARD.md",
  } <= names
  assert _named(SCRIPT_PATH) and _named(MODULE)


def test_every_scripts_path_exists():
  missing = sorted(
    {f"{doc}: {m.group(0)}" for doc, m in _named(SCRIPT_PATH) if not (ROOT / m.group(0)).exists()}
  )
  assert not missing, "named in the docs, absent from the checkout:\n" + "\n".join(missing)


def test_every_specdec_module_and_bench_subcommand_exists():
  missing = set()
  for doc, m in _named(MODULE):
    module, argument = m.group(1), m.group(2)
    if not module.startswith("specdec"):
      continue
    if not _module_exists(module):
      missing.add(f"{doc}: python -m {module}")
    elif module == "specdec.bench" and argument and argument not in SUBCOMMANDS:
      missing.add(f"{doc}: python -m specdec.bench {argument}")
  assert not missing, "named in the docs, absent from the checkout:\n" + "\n".join(sorted(missing))


# Other packages' modules, checked where the package is installed (T5X is not on PyPI;
# .ci/run installs it and requires the t5x-marked tests to run).
OTHER_MODULES = sorted(
  {m.group(1) for _, m in _named(MODULE) if not m.group(1).startswith("specdec")}
)


@pytest.mark.parametrize(
  "module",
  [
    pytest.param(name, marks=[pytest.mark.t5x] if name.split(".")[0] == "t5x" else [])
    for name in OTHER_MODULES
  ],
)
def test_every_other_module_exists_where_its_package_is_installed(module):
  top = module.split(".")[0]
  if importlib.util.find_spec(top) is None:
    pytest.skip(f"{top} is not installed")
  assert _module_exists(module), f"python -m {module}: no such module in {top}"


def test_a_missing_script_or_module_is_caught():
  assert SCRIPT_PATH.findall("see `scripts/nope.py`, (scripts/research/)") == [
    "scripts/nope.py",
    "scripts/research/",
  ]
  assert not (ROOT / "scripts/nope.py").exists()
  m = MODULE.search("run `python -m specdec.nope --x`")
  assert m.group(1) == "specdec.nope" and not _module_exists(m.group(1))
  assert _module_exists("specdec.bench") and _module_exists("specdec.run")
