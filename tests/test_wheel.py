"""The built wheel is a complete specdec: every file of the package (the shipped pairs'
weights with the `.zarray` metadata of their T5X checkpoints, the data, the CPU
kernel's source) and the gin configs of the root `configs/`, which resolve from an
installation outside the checkout."""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

# Each builds or installs the wheel: the default suite stays under 6 minutes; .ci/run
# runs the slow marker after it.
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parent.parent
# Top-level entries of a checkout that are not sources (virtualenv, VCS, build
# outputs): a wheel built in place would also pick up a stale build/. Bytecode
# (__pycache__) is copied: the wheel must leave it out.
NOT_SOURCES = {".venv", ".git", "build", "dist", "out", ".pytest_cache", ".hypothesis"}


def _ignored(directory: str, names: list[str]) -> set[str]:
  top = pathlib.Path(directory) == REPO
  return {n for n in names if n.endswith(".egg-info") or (top and n in NOT_SOURCES)}


def _run(args: list[str], cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    args,
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
  )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """(the wheel, the copy of the working tree it was built from)."""
  tmp = tmp_path_factory.mktemp("wheel")
  source = tmp / "src"
  shutil.copytree(REPO, source, symlinks=True, ignore=_ignored)
  proc = _run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "--quiet",
      "--no-deps",
      "--no-build-isolation",
      "--no-cache-dir",
      "--wheel-dir",
      str(tmp / "dist"),
      str(source),
    ],
    cwd=tmp,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  (wheel,) = (tmp / "dist").glob("specdec-*.whl")
  return wheel, source


def _package_files(source: pathlib.Path) -> set[str]:
  """Every file under specdec/ of the source tree, `configs/` link followed."""
  files = set()
  for directory, dirs, names in os.walk(source / "specdec", followlinks=True):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    files |= {(pathlib.Path(directory) / n).relative_to(source).as_posix() for n in names}
  return files


def test_wheel_holds_every_file_of_the_package_and_the_gin_configs(built):
  wheel, source = built
  with zipfile.ZipFile(wheel) as archive:
    shipped = set(archive.namelist())
  expected = _package_files(source)
  zarrays = {f for f in expected if f.endswith("/.zarray")}
  assert zarrays and all(f.startswith("specdec/weights/") for f in zarrays)
  assert sorted(expected - shipped) == []
  assert [f for f in shipped if "__pycache__" in f or f.endswith(".pyc")] == []
  gin_files = {
    p.relative_to(source / "configs").as_posix() for p in (source / "configs").rglob("*.gin")
  }
  assert "runs/multi30k_ende_infer.gin" in gin_files
  assert {f for f in shipped if f.endswith(".gin")} == {f"specdec/configs/{f}" for f in gin_files}


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> pathlib.Path:
  """A non-editable install of the wheel into a directory of its own."""
  target = tmp_path_factory.mktemp("site")
  proc = _run(
    [
      sys.executable,
      "-m",
      "pip",
      "install",
      "--quiet",
      "--no-deps",
      "--no-cache-dir",
      "--target",
      str(target),
      str(built[0]),
    ],
    cwd=target,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return target


# Run outside the checkout with only the installed wheel providing specdec: the gin
# files (from the search path the package names, as T5X would get it) and the shipped
# checkpoints they point at.
FROM_THE_WHEEL = """
import gin, specdec, specdec.t5x
from specdec.io import load_t5x
gin.add_config_file_search_path(specdec.t5x.gin_search_path())
gin.parse_config_files_and_bindings(
    ['configs/runs/multi30k_ende.gin', 'configs/pairs/multi30k_ende.gin'], [])
path = gin.query_parameter('%TARGET_CHECKPOINT_PATH').scoped_configurable_fn()
params = load_t5x(path)
print(specdec.__file__)
print(specdec.t5x.gin_search_path())
print(path)
print(gin.query_parameter('%TASK'), params['decoder']['logits_dense']['kernel'].shape)
"""


def test_installed_wheel_resolves_its_configs_and_weights_in_any_directory(installed, tmp_path):
  proc = _run([sys.executable, "-c", FROM_THE_WHEEL], cwd=tmp_path, PYTHONPATH=str(installed))
  assert proc.returncode == 0, proc.stderr[-4000:]
  module, search_path, checkpoint, last = proc.stdout.strip().splitlines()[-4:]
  package = installed / "specdec"
  assert pathlib.Path(module).parent == package
  assert pathlib.Path(search_path) == package
  assert pathlib.Path(checkpoint).is_relative_to(package / "weights")
  assert last == "specdec_multi30k_ende (256, 32128)"
  # What T5X users pass as --gin_search_paths.
  proc = _run([sys.executable, "-m", "specdec.t5x"], cwd=tmp_path, PYTHONPATH=str(installed))
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert proc.stdout.strip() == search_path


def test_specdec_run_finds_its_run_files_from_the_installed_wheel(installed, tmp_path):
  proc = _run(
    [sys.executable, "-m", "specdec.run", "--gin_file=configs/runs/wmt_ende_t0_small.gin"],
    cwd=tmp_path,
    PYTHONPATH=str(installed),
  )
  # Parsed from the wheel (includes resolved): only the output directory is missing.
  assert proc.returncode == 2, proc.stderr[-4000:]
  assert "gin macro OUTPUT_DIR is unset" in proc.stderr
