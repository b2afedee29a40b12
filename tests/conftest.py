"""Suite-wide pytest hooks.

t5x is not on PyPI, so the t5x-marked tests skip where it is not installed. CI installs
it and runs them with SPECDEC_REQUIRE_T5X=1, which turns any such skip into a failure:
a t5x-marked test that did not run (t5x half-installed, an example network missing)
must not pass CI as a skip.
"""

import os

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
