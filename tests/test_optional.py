"""Optional dependencies: each one missing raises an ImportError naming specdec's extra.

Every optional import of the library goes through `specdec._optional.require`; each
test hides one package (its modules set to None in `sys.modules`, so that importing
it fails as if it were not installed) and calls what needs it.
"""

import ast
import functools
import importlib
import pathlib
import re
import sys

import numpy as np
import pytest

from specdec import _optional

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "specdec"

# Top-level module -> its distribution on PyPI, for every optional import.
OPTIONAL = {
  "gguf": "gguf",
  "tokenizers": "tokenizers",
  "jinja2": "jinja2",
  "safetensors": "safetensors",
  "orbax": "orbax-checkpoint",
  "gin": "gin-config",
  "seqio": "seqio",
  "tensorflow": "seqio",
  "sacrebleu": "sacrebleu",
  "rouge_score": "rouge-score",
  "torch": "torch",
  "transformers": "transformers",
  "tqdm": "tqdm",
  "matplotlib": "matplotlib",
}
# Imported directly: the base install's own dependencies, and T5X (not on PyPI;
# specdec.t5x says how to install it from source).
DIRECT = {
  "jax",
  "jaxlib",
  "flax",
  "numpy",
  "absl",
  "tensorstore",
  "msgpack",
  "sentencepiece",
  "t5x",
}


def hide(monkeypatch, top: str) -> None:
  """Makes `import top` (and its submodules) fail as if it were not installed."""
  for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
    monkeypatch.setitem(sys.modules, name, None)
  monkeypatch.setitem(sys.modules, top, None)


def names_extra(excinfo, extra: str) -> None:
  message = str(excinfo.value)
  assert f"pip install 'specdec[{extra}]'" in message, message


def test_require_names_the_extra_and_chains_the_error(monkeypatch):
  hide(monkeypatch, "tqdm")
  with pytest.raises(
    ImportError,
    match=r"the progress bar needs the optional package "
    r"`tqdm` .*: pip install 'specdec\[bench\]'",
  ) as excinfo:
    _optional.require("tqdm", "bench", purpose="the progress bar")
  assert isinstance(excinfo.value.__cause__, ImportError)
  assert excinfo.value.name == "tqdm"


def test_require_returns_the_module():
  assert _optional.require("numpy", "lm") is np
  assert _optional.require("os.path", "lm").join("a", "b") == "a/b"


def test_require_checks_its_extras():
  with pytest.raises(ValueError, match="extras"):
    _optional.require("numpy", "nope")
  with pytest.raises(ValueError, match="extras"):
    _optional.require("numpy")


# --- One test per optional import: hidden, the call that needs it names the extra. ---


def test_gguf(monkeypatch, tmp_path):
  from specdec.io import gguf

  hide(monkeypatch, "gguf")
  with pytest.raises(ImportError, match="reading GGUF files") as excinfo:
    gguf.open_gguf(tmp_path / "model.gguf")
  names_extra(excinfo, "lm")


@pytest.mark.parametrize("module", ["tokenizers", "jinja2"])
def test_gguf_tokenizer(monkeypatch, module):
  from specdec.io import tokenizer

  hide(monkeypatch, module)
  with pytest.raises(ImportError, match="the GGUF tokenizer") as excinfo:
    tokenizer.Tokenizer(["a", "b"], [])
  names_extra(excinfo, "lm")


def test_chat_template(monkeypatch):
  from specdec.io import tokenizer

  hide(monkeypatch, "jinja2")
  with pytest.raises(ImportError, match="a chat template") as excinfo:
    tokenizer._compile_template('{{ "only in test_optional" }}')
  names_extra(excinfo, "lm")


@pytest.mark.parametrize(
  "call,extra",
  [
    (lambda hf, path: hf.load_hf(path), "checkpoints"),
    (lambda hf, path: hf.save_hf(path, {}, None), "checkpoints"),
    (lambda hf, path: hf.load_hf_llama(path), "lm"),
    (lambda hf, path: hf.save_hf_llama(path, None, {}), "lm"),
  ],
  ids=["load_hf", "save_hf", "load_hf_llama", "save_hf_llama"],
)
def test_safetensors(monkeypatch, tmp_path, call, extra):
  from specdec.io import hf

  hide(monkeypatch, "safetensors")
  with pytest.raises(ImportError, match="Hugging Face") as excinfo:
    call(hf, tmp_path)
  names_extra(excinfo, extra)
  assert list(tmp_path.iterdir()) == []  # raised before writing anything


@pytest.mark.parametrize(
  "call",
  [
    lambda eagle, path: eagle.save(str(path), {}, []),
    lambda eagle, path: eagle.load(str(path), None),
  ],
  ids=["save", "load"],
)
def test_feature_draft_safetensors(monkeypatch, tmp_path, call):
  from specdec.drafts import eagle

  hide(monkeypatch, "safetensors")
  with pytest.raises(ImportError, match="feature draft") as excinfo:
    call(eagle, tmp_path)
  names_extra(excinfo, "lm")


def test_orbax(monkeypatch, tmp_path):
  from specdec.io import t5x

  hide(monkeypatch, "orbax")
  with pytest.raises(ImportError, match="Orbax") as excinfo:
    t5x._orbax_sources(str(tmp_path))
  names_extra(excinfo, "checkpoints")


def test_gin(monkeypatch):
  from specdec import run

  hide(monkeypatch, "gin")
  with pytest.raises(ImportError, match=r"specdec.run") as excinfo:
    run.main(["--gin_file=configs/runs/multi30k_ende.gin"])
  names_extra(excinfo, "t5x")


@pytest.mark.parametrize("module", ["seqio", "tensorflow"])
def test_seqio_tasks(monkeypatch, module):
  hide(monkeypatch, module)
  monkeypatch.delitem(sys.modules, "specdec.tasks", raising=False)
  with pytest.raises(ImportError, match="seqio tasks") as excinfo:
    importlib.import_module("specdec.tasks")
  names_extra(excinfo, "t5x")


@pytest.mark.parametrize("metric,module", [("bleu", "sacrebleu"), ("rouge", "rouge_score")])
def test_metrics(monkeypatch, metric, module):
  from specdec import metrics

  hide(monkeypatch, module)
  with pytest.raises(ImportError, match=metric.upper()) as excinfo:
    getattr(metrics, metric)(["a b c"], ["a b c"])
  names_extra(excinfo, "t5x")
  names_extra(excinfo, "bench")


@pytest.mark.parametrize("module", ["torch", "transformers"])
def test_load_lm_transformers(monkeypatch, module):
  from specdec import pretrained

  hide(monkeypatch, module)
  with pytest.raises(ImportError, match="load_lm_transformers") as excinfo:
    pretrained.load_lm_transformers()
  names_extra(excinfo, "hf")


@pytest.mark.parametrize("module", ["torch", "transformers"])
def test_compare_hf(monkeypatch, module):
  hide(monkeypatch, module)
  monkeypatch.delitem(sys.modules, "specdec.bench.compare_hf", raising=False)
  with pytest.raises(ImportError, match="compare-hf") as excinfo:
    importlib.import_module("specdec.bench.compare_hf")
  names_extra(excinfo, "hf")


def test_progress_bar(monkeypatch):
  from specdec.bench import cli

  hide(monkeypatch, "tqdm")
  with pytest.raises(ImportError, match="progress bar") as excinfo:
    cli.progress_bar(total=1)
  names_extra(excinfo, "bench")


def test_demo_plot(monkeypatch, tmp_path):
  from specdec.bench import demo

  hide(monkeypatch, "matplotlib")
  with pytest.raises(ImportError, match="the plot") as excinfo:
    demo.save_plot({"rows": []}, str(tmp_path / "plot.png"))
  names_extra(excinfo, "bench")


# --- Every optional import goes through `require`, naming an extra that has it. ---


def _extras() -> dict[str, set[str]]:
  """Extra -> the distributions it installs (self-references resolved)."""
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  raw = project["optional-dependencies"]

  def dists(extra: str) -> set[str]:
    out = set()
    for requirement in raw[extra]:
      name, extras = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement).groups()
      if name == project["name"]:
        for e in extras.split(","):
          out |= dists(e.strip())
      else:
        out.add(name.lower())
    return out

  return {extra: dists(extra) for extra in raw}


@functools.cache
def _imports_and_requires():
  """(file:line, top-level module) of each import statement, and (file:line, module,
  extras) of each `require(...)` call with literal arguments, in the package."""
  imports, requires = [], []
  for path in sorted(PACKAGE.rglob("*.py")):
    where = path.relative_to(REPO).as_posix()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        imports += [(f"{where}:{node.lineno}", a.name.split(".")[0]) for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        imports.append((f"{where}:{node.lineno}", node.module.split(".")[0]))
      elif (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "require"
      ):
        args = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if len(args) == len(node.args) and args:
          requires.append((f"{where}:{node.lineno}", args[0], tuple(args[1:])))
  return imports, requires


def test_optional_packages_are_imported_only_through_require():
  imports, requires = _imports_and_requires()
  third_party = {(w, m) for w, m in imports if m not in sys.stdlib_module_names and m != "specdec"}
  assert sorted((w, m) for w, m in third_party if m not in DIRECT) == []
  # Every optional package is required somewhere (else this list is stale).
  assert {m.split(".")[0] for _, m, _ in requires} == set(OPTIONAL)


def test_each_require_names_extras_that_install_the_package():
  extras = _extras()
  assert set(_optional.EXTRAS) | {"all", "test"} == set(extras)
  assert extras["all"] == set().union(*(extras[e] for e in _optional.EXTRAS))
  _, requires = _imports_and_requires()
  assert requires
  for where, module, named in requires:
    assert named, where
    for extra in named:
      assert OPTIONAL[module.split(".")[0]] in extras[extra], (where, module, extra)
