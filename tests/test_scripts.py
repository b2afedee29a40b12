"""The scripts the tests import, and the demo, can be imported into one process.

absl flags live in one registry per process: two modules defining a flag of the same
name cannot both be imported (DuplicateFlagError), which breaks the whole suite's
collection rather than any one test. Scripts that the tests only run as commands may
reuse names freely; the ones they import must not.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[1]


def _scripts_imported_by_tests():
  names = set()
  for path in (ROOT / "tests").glob("test_*.py"):
    text = path.read_text()
    names.update(re.findall(r'"scripts" / "(\w+)\.py"', text))
    names.update(re.findall(r'load_script\("(\w+)"\)', text))  # tests/script_loader.py
  return sorted(names)


def test_the_scripts_the_tests_import_and_the_demo_share_no_flag_name():
  scripts = _scripts_imported_by_tests()
  assert {"bench_identity", "bench_verify", "compare_hf", "train_pair"} <= set(scripts)
  code = "\n".join([
      "import importlib, importlib.util, sys",
      "importlib.import_module('specdec.demo')",
      "importlib.import_module('specdec.run')",
      f"for name in {scripts!r}:",
      f"  spec = importlib.util.spec_from_file_location(name, '{ROOT}/scripts/' + name"
      " + '.py')",
      "  module = importlib.util.module_from_spec(spec)",
      "  sys.modules[name] = module",
      "  spec.loader.exec_module(module)",
  ])
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
