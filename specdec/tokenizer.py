"""A language model's tokenizer and chat template from its GGUF file's metadata.

An alias, kept so that existing code runs unchanged: the module is
`specdec.io.tokenizer`, and every public name of it is importable here.
"""

# pylint: disable=wildcard-import,unused-wildcard-import
from specdec.io.tokenizer import *  # noqa: F401,F403
