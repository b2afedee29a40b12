"""Moved to `specdec.drafts.ngram`; this name stays importable (the same module)."""

import sys

from specdec.drafts import ngram as _module

sys.modules[__name__] = _module
