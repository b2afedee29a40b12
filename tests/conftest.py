"""Suite-wide pytest hooks.

t5x is not on PyPI, so the t5x-marked tests skip where it is not installed. CI installs
it and runs them with SPECDEC_REQUIRE_T5X=1, which turns any such skip into a failure:
a t5x-marked test that did not run (t5x half-installed, an example network missing)
must not pass CI as a skip.
"""

import os
import tempfile

import pytest

REQUIRE_T5X = 'SPECDEC_REQUIRE_T5X'


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  del call
  report = (yield).get_result()
  if (report.skipped and os.environ.get(REQUIRE_T5X) == '1'
      and item.get_closest_marker('t5x') is not None):
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else ''
    report.outcome = 'failed'
    report.longrepr = f'{REQUIRE_T5X}=1 but this t5x-marked test skipped: {reason}'


def pytest_configure(config):
  """One persistent JAX compilation cache for the run's workers: many tests compile
  the same loops for the same toy shapes in fresh jit objects, and on a CPU compiling
  is most of a test's time. A cache hit is the same executable (the key holds the
  program, the options and the jax version), and jit's in-memory caches, which the
  compile-once tests count, are unaffected."""
  del config
  import jax  # After pytest's own setup, before any test compiles.
  cache = os.environ.get('SPECDEC_TEST_JAX_CACHE') or os.path.join(
      tempfile.gettempdir(), f'specdec-test-jax-cache-{os.getuid()}')
  jax.config.update('jax_compilation_cache_dir', cache)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  jax.config.update('jax_compilation_cache_max_size', 1 << 30)  # LRU beyond 1 GiB.
