"""The tests of scripts/research: its modules import each other by their file names
(a script's folder is on sys.path when it runs), so the folder goes on sys.path here;
tests/ too, for the helpers of the library's own tests."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).parents[2]
for folder in (ROOT / "scripts" / "research", ROOT / "tests"):
  if str(folder) not in sys.path:
    sys.path.insert(0, str(folder))
