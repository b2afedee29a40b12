"""scripts/<name>.py imported as a module named <name> (the scripts are not a package)."""

import importlib.util
import pathlib
import sys
import types

SCRIPTS = pathlib.Path(__file__).parents[1] / "scripts"


def load_script(name: str) -> types.ModuleType:
  spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # dataclasses look their module up there.
  spec.loader.exec_module(module)
  return module
