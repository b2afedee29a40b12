"""GGUF checkpoints (llama.cpp's format) of the llama architecture -> specdec's Llama.

An alias, kept so that existing code runs unchanged: the module is `specdec.io.gguf`,
and every public name of it is importable here.
"""

# pylint: disable=wildcard-import,unused-wildcard-import
from specdec.io.gguf import *  # noqa: F401,F403
