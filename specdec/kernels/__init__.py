"""The former name of `specdec.backends.cpu`: this module *is* that module (one object,
so that settings patched through either name are seen by both)."""

import sys

from specdec.backends import cpu as _cpu

sys.modules[__name__] = _cpu
