"""Moved to `specdec.drafts.shortlist`; this name stays importable (the same module)."""

import sys

from specdec.drafts import shortlist as _module

sys.modules[__name__] = _module
