"""Checkpoints and tokenizers: what specdec reads from and writes to disk.

* `specdec.io.t5x`: T5X checkpoints (legacy msgpack + zarr, Orbax) <-> T5's tree:
  `load_t5x`, `save_t5x`.
* `specdec.io.hf`: Hugging Face safetensors <-> the T5 and Llama trees: `load_hf`,
  `save_hf`, `load_hf_llama`, `save_hf_llama`.
* `specdec.io.gguf`: llama.cpp's GGUF files of the llama architecture: `load_gguf`,
  `save_gguf`.
* `specdec.io.tokenizer`: `Tokenizer` (byte-level BPE and chat template from a GGUF
  file) and `T5Tokenizer` (T5's SentencePiece), both `TextTokenizer`s.
"""

__all__ = [
  "load_gguf",
  "save_gguf",
  "load_hf",
  "load_hf_llama",
  "save_hf",
  "save_hf_llama",
  "load_t5x",
  "save_t5x",
  "T5Tokenizer",
  "TextTokenizer",
  "Tokenizer",
]

from specdec.io.gguf import load_gguf, save_gguf
from specdec.io.hf import load_hf, load_hf_llama, save_hf, save_hf_llama
from specdec.io.t5x import load_t5x, save_t5x
from specdec.io.tokenizer import T5Tokenizer, TextTokenizer, Tokenizer
