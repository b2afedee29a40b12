"""The test suite's own shape: test modules share code through tests/helpers.py (and the
*_helpers.py modules beside it) or conftest.py, never by importing each other."""

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def _imported_modules(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
    if isinstance(node, ast.Import):
      names.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.add(node.module.split(".")[0])
  return names


def test_no_test_module_imports_another():
  modules = sorted(TESTS.glob("**/test_*.py"))
  test_names = {p.stem for p in modules}
  assert "test_sample" in test_names and len(modules) > 40
  found = sorted(
    f"{p.relative_to(TESTS)} imports {name}"
    for p in modules
    for name in _imported_modules(p) & test_names
  )
  assert not found, "test modules importing test modules:\n" + "\n".join(found)
