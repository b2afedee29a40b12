"""The README's "Installing" table, docs/installing.md and CI's install check
(scripts/ci/install_check.py) agree: CI runs the documented snippets, and installs by the
commands the table lists."""

import importlib.util
import pathlib
import re

import pytest

from specdec import _optional

REPO = pathlib.Path(__file__).resolve().parent.parent


def _load_install_check():
  path = REPO / "scripts" / "ci" / "install_check.py"
  spec = importlib.util.spec_from_file_location("install_check", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


install_check = _load_install_check()
README = (REPO / "README.md").read_text()
SNIPPETS = (REPO / "docs" / "installing.md").read_text()


def _table() -> dict[str, str]:
  """The Installing table: extra -> its command column."""
  section = README[README.index("## Installing") :]
  section = section[: section.index("\n## ", 1)]
  rows = {}
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 3 and cells[0] not in ("task", "---"):
      rows[cells[1].strip("`")] = cells[2]
  return rows


def test_every_extra_has_a_snippet_and_ci_checks_them_all():
  snippets = install_check.marked_snippets(SNIPPETS)
  assert set(snippets) == set(install_check.INSTALL) == {"base", *_optional.EXTRAS}


def test_the_table_lists_the_commands_ci_installs_with():
  table = _table()
  expected = {
    ("none" if e == "base" else e): " then ".join(f"`{c}`" for c in commands)
    for e, commands in install_check.INSTALL.items()
  }
  assert {e: table[e] for e in expected} == expected
  assert set(table) == set(expected) | {"all"}
  assert table["all"].startswith("`pip install 'specdec[all]'`")


def test_snippets_decode_few_tokens():
  for extra, (_, code) in install_check.marked_snippets(SNIPPETS).items():
    counts = [int(n) for n in re.findall(r"max[_-]new[_-]tokens=(\d+)", code)]
    assert all(n <= 8 for n in counts), (extra, counts)


def test_marked_snippets_parses_marked_blocks_only():
  text = (
    "```python\nignored()\n```\n<!-- install-check: lm -->\n```python\n"
    "a = 1\n```\n\n<!-- install-check: bench -->\n```sh\necho hi\n```\n"
  )
  assert install_check.marked_snippets(text) == {
    "lm": ("python", "a = 1\n"),
    "bench": ("sh", "echo hi\n"),
  }
  with pytest.raises(ValueError, match="two install-check snippets for 'lm'"):
    install_check.marked_snippets(text + "<!-- install-check: lm -->\n```sh\nx\n```\n")
  with pytest.raises(ValueError, match="not python/sh"):
    install_check.marked_snippets("<!-- install-check: lm -->\n```js\nx\n```\n")
