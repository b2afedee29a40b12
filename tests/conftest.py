"""Suite-wide pytest hooks.

t5x is not on PyPI, so the t5x-marked tests skip where it is not installed. CI installs
it and runs them with SPECDEC_REQUIRE_T5X=1, which turns any such skip into a failure:
a t5x-marked test that did not run (t5x half-installed, an example network missing)
must not pass CI as a skip.

Every program XLA:CPU compiles keeps its machine code in its own memory mappings (about
600 for one T5 speculative decode loop), and a process may hold at most
vm.max_map_count of them (65530 by default): a worker that compiles a few hundred
programs fails with "LLVM compilation error: Cannot allocate memory" and aborts. After
a test that leaves a worker past half that limit, JAX's caches are cleared, which
frees the mappings (the next test compiles what it needs again).

The default suite (`-m 'not slow and not research'`, pyproject.toml) compiles with
LLVM's optimizations off (XLA_FLAGS=--xla_backend_optimization_level=0): its tests
are small programs, compiled once or twice each, where LLVM's passes cost more than
they save (measured 2026-12-07, 2-core AMD EPYC: the suite 10:05 -> 8:01). The
optimization level changes how XLA's kernels are emitted, not what they compute (no
fast-math at any level); the slow, research and t5x stages, the benchmarks and the
library itself compile at XLA's default level. An XLA_FLAGS that sets the level
already is left alone.
"""

import gc
import os

import jax
import pytest

REQUIRE_T5X = "SPECDEC_REQUIRE_T5X"
_OPT_LEVEL = "--xla_backend_optimization_level"


def pytest_configure(config):
  """LLVM's optimizations off for the default suite (see the module docstring); set
  before any test touches a device (XLA reads XLA_FLAGS when its backend starts)."""
  markexpr = config.getoption("markexpr") or ""
  flags = os.environ.get("XLA_FLAGS", "")
  if "not slow" in markexpr and "not research" in markexpr and _OPT_LEVEL not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_OPT_LEVEL}=0".strip()


_MAPS = "/proc/self/maps"


def _mappings() -> int:
  try:
    with open(_MAPS, "rb") as f:
      return f.read().count(b"\n")
  except OSError:  # Not Linux: no such limit to keep under.
    return 0


def _map_limit() -> int:
  try:
    with open("/proc/sys/vm/max_map_count", encoding="ascii") as f:
      return int(f.read())
  except (OSError, ValueError):
    return 65530


_CLEAR_ABOVE = _map_limit() // 2


@pytest.fixture(autouse=True)
def _release_compiled_programs():
  """Clears JAX's caches after a test that leaves this process past half its
  mapping limit (see the module docstring)."""
  yield
  if _mappings() > _CLEAR_ABOVE:
    jax.clear_caches()
    gc.collect()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  del call
  report = (yield).get_result()
  if (
    report.skipped
    and os.environ.get(REQUIRE_T5X) == "1"
    and item.get_closest_marker("t5x") is not None
  ):
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else ""
    report.outcome = "failed"
    report.longrepr = f"{REQUIRE_T5X}=1 but this t5x-marked test skipped: {reason}"
