"""T5 and Llama parameters from the checkpoints users have: T5X, Hugging Face and GGUF.

An alias, kept so that existing code runs unchanged: the readers and writers live in
`specdec.io` (`specdec.io.t5x`: T5X; `specdec.io.hf`: Hugging Face T5 and Llama;
`specdec.io.gguf`: GGUF), and every public name of those modules is importable here.

    params = specdec.checkpoints.load_t5x(path)      # the `target` tree of a T5X checkpoint
    params = specdec.checkpoints.load_hf(path, cfg)  # HF safetensors -> the same tree
    cfg, params = specdec.checkpoints.load_gguf(path)
"""

# pylint: disable=wildcard-import,unused-wildcard-import
from specdec.io._tree import DTypeLike, Params  # noqa: F401
from specdec.io.gguf import load_gguf, load_gguf_reader, open_gguf, save_gguf  # noqa: F401
from specdec.io.hf import *  # noqa: F401,F403
from specdec.io.t5x import *  # noqa: F401,F403
