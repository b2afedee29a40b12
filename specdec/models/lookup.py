"""Moved to `specdec.drafts.lookup`; this name stays importable (the same module)."""

import sys

from specdec.drafts import lookup as _module

sys.modules[__name__] = _module
