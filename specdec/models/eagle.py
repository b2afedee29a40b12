"""Moved to `specdec.drafts.eagle`; this name stays importable (the same module)."""

import sys

from specdec.drafts import eagle as _module

sys.modules[__name__] = _module
