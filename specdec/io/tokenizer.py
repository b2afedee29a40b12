"""Text <-> ids for every shipped pair: one protocol, `TextTokenizer`, two tokenizers.

* `Tokenizer`: a decoder-only LM's byte-level BPE tokenizer and chat template, from its
  GGUF file's metadata.
* `T5Tokenizer`: T5's SentencePiece vocabulary with its 100 sentinels
  (`specdec.data.Vocabulary`, token for token seqio's), under the same protocol.

    tok = specdec.io.tokenizer.Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    tok.decode(ids)

A GGUF file has no `tokenizer.json`: llama.cpp stores the vocabulary
(`tokenizer.ggml.tokens`), the BPE merges, each token's type (normal, control, ...), the
special ids and the Jinja chat template as metadata. For a byte-level BPE vocabulary
(`tokenizer.ggml.model == "gpt2"`, as GPT-2, SmolLM2, Llama 3 and Qwen use) this builds
the tokenizer Hugging Face's transformers builds from the same file
(`transformers.integrations.gguf.gguf_tokenizer_mapping`, Apache-2.0: a `tokenizers` BPE
with the ByteLevel pre-tokenizer and decoder; control tokens added as special tokens,
user-defined ones as added tokens), so ids agree with
`AutoTokenizer.from_pretrained(dir, gguf_file=name)`; the chat template is rendered as
transformers' `apply_chat_template` renders it (a sandboxed Jinja environment with
`trim_blocks`, `lstrip_blocks` and `raise_exception`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import functools
import json
import os
from typing import Any, Protocol, runtime_checkable

from specdec import _optional, data

__all__ = [
  "INSTALL_HINT",
  "NORMAL",
  "UNKNOWN",
  "CONTROL",
  "USER_DEFINED",
  "UNUSED",
  "BYTE",
  "LLAMA3_SPLIT",
  "PRE_TOKENIZER_SPLITS",
  "TOKENIZER_MODEL",
  "TextTokenizer",
  "bytes_to_unicode",
  "Tokenizer",
  "from_gguf",
  "T5Tokenizer",
]

INSTALL_HINT = _optional.install_command("lm")

# llama.cpp's token types (gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# `tokenizer.ggml.pre` -> the pre-tokenizer's split regex; None is the ByteLevel
# pre-tokenizer's own (GPT-2's). Transformers uses GPT-2's for every name it does not
# list; SmolLM2's `smollm` also splits digits one by one in llama.cpp, which cannot
# change a result here: its vocabulary has no merge with a digit in it.
LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
  "default": None,
  "gpt2": None,
  "gpt-2": None,
  "smollm": None,
  "starcoder": None,
  "refact": None,
  "mpt": None,
  "olmo": None,
  "llama3": LLAMA3_SPLIT,
  "llama-v3": LLAMA3_SPLIT,
  "llama-bpe": LLAMA3_SPLIT,
  "smaug-bpe": LLAMA3_SPLIT,
  "dbrx": LLAMA3_SPLIT,
}
TOKENIZER_MODEL = "gpt2"


@runtime_checkable
class TextTokenizer(Protocol):
  """What every shipped pair's tokenizer offers (`specdec.pretrained.Pair.tokenizer`).

  Attributes:
    vocab_size: the number of ids `decode` accepts.
    eos_id: the id that ends a decode (`speculative_sample`'s `eos_id`).
    pad_id: the id of padding (right-padded prompts, tokens after EOS).
  """

  vocab_size: int
  eos_id: int | None
  pad_id: int | None

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


def _imports():
  for module in ("tokenizers", "jinja2"):
    _optional.require(module, "lm", purpose="the GGUF tokenizer")


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
  bs = (
    list(range(ord("!"), ord("~") + 1))
    + list(range(ord("¡"), ord("¬") + 1))
    + list(range(ord("®"), ord("ÿ") + 1))
  )
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, map(chr, cs)))


@functools.lru_cache(maxsize=16)
def _compile_template(template: str):
  """The template compiled as transformers' `_compile_jinja_template` does."""
  jinja2 = _optional.require("jinja2", "lm", purpose="a chat template")
  ext = _optional.require("jinja2.ext", "lm", purpose="a chat template")
  sandbox = _optional.require("jinja2.sandbox", "lm", purpose="a chat template")

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters, which chat templates do not want.
    return json.dumps(
      x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )

  def strftime_now(fmt):
    import datetime

    return datetime.datetime.now().strftime(fmt)

  env = sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols]
  )
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  return env.from_string(template)


class Tokenizer:
  """A byte-level BPE tokenizer with special tokens and a chat template.

  Attributes:
    tokens: the vocabulary, id -> token string (ByteLevel spelling).
    bos_id, eos_id, pad_id, unk_id: special ids (None when the file names none).
    add_bos, add_eos: whether `encode` adds them (the file's `add_bos_token` /
      `add_eos_token`; both False for SmolLM2).
    chat_template: the Jinja template, or None.
  """

  def __init__(
    self,
    tokens: Sequence[str],
    merges: Sequence[str],
    token_types: Sequence[int] | None = None,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
    unk_id: int | None = None,
    chat_template: str | None = None,
    add_bos: bool = False,
    add_eos: bool = False,
    pre: str | None = None,
  ):
    _imports()
    tokenizers = _optional.require("tokenizers", "lm", purpose="the GGUF tokenizer")
    AddedToken, Regex = tokenizers.AddedToken, tokenizers.Regex
    decoders, models, pre_tokenizers = (
      tokenizers.decoders,
      tokenizers.models,
      tokenizers.pre_tokenizers,
    )
    tokens = list(tokens)
    if not tokens:
      raise ValueError("tokens: the vocabulary is empty")
    token_types = list(token_types) if token_types is not None else [NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
      raise ValueError(f"token_types: {len(token_types)} types for {len(tokens)} tokens")
    for name, value in (
      ("bos_id", bos_id),
      ("eos_id", eos_id),
      ("pad_id", pad_id),
      ("unk_id", unk_id),
    ):
      if value is not None and not 0 <= value < len(tokens):
        raise ValueError(f"{name}: {value} is outside the vocabulary [0, {len(tokens)})")
    key = pre if pre is not None else "default"
    if key not in PRE_TOKENIZER_SPLITS:
      raise ValueError(
        f"pre: tokenizer.ggml.pre {pre!r} is not supported; supported: "
        f"{sorted(PRE_TOKENIZER_SPLITS)}"
      )
    self.tokens = tokens
    self.token_types = token_types
    self.bos_id, self.eos_id, self.pad_id, self.unk_id = bos_id, eos_id, pad_id, unk_id
    self.chat_template = chat_template
    self.add_bos, self.add_eos = bool(add_bos), bool(add_eos)

    # A token written outside the byte alphabet (a llama.cpp mislabel) is respelled in
    # it, as transformers' `byte_level_tokenizer` does.
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {}
    for index, token in enumerate(tokens):
      if not set(token) <= alphabet:
        token = "".join(spelling[b] for b in token.encode("utf-8"))
      vocab[token] = index  # the last of duplicates wins, as in transformers
    pairs: list[tuple[str, str]] = []
    for merge in merges:
      parts = merge.split(" ")
      if len(parts) != 2:
        raise ValueError(f"merges: {merge!r} is not two tokens separated by one space")
      pairs.append((parts[0], parts[1]))
    backend = tokenizers.Tokenizer(
      models.BPE(
        vocab=vocab,
        merges=pairs,
        dropout=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
      )
    )
    split = PRE_TOKENIZER_SPLITS[key]
    if split is None:
      backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
      backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
          pre_tokenizers.Split(Regex(split), behavior="isolated"),
          pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
      )
    backend.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, ...) are matched whole in the text, as special
    # tokens; a control token outside the byte alphabet would grow the vocabulary past
    # the model's, so, as in transformers, it is left out.
    backend.add_special_tokens(
      [
        AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, token_types)
        if kind == CONTROL and set(t) <= alphabet
      ]
    )
    backend.add_tokens(
      [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, token_types)
        if kind == USER_DEFINED and t in vocab
      ]
    )
    if backend.get_vocab_size(with_added_tokens=True) > len(tokens):
      raise ValueError(
        f"tokens: {len(tokens)} tokens built a vocabulary of "
        f"{backend.get_vocab_size(with_added_tokens=True)}"
      )
    self._backend = backend

  @classmethod
  def from_gguf(cls, path: str | os.PathLike) -> Tokenizer:
    """The tokenizer a GGUF file's `tokenizer.*` metadata describes.

    Raises:
      ValueError: naming the path, when the file has no tokenizer or one that is not
        byte-level BPE (`tokenizer.ggml.model` other than "gpt2").
    """
    from specdec.io import gguf

    return cls.from_reader(gguf.open_gguf(path), source=os.fspath(path))

  @classmethod
  def from_reader(cls, reader, source: str = "GGUF file") -> Tokenizer:
    """From an open `gguf.GGUFReader` (`specdec.io.gguf.open_gguf`), read once for
    both the model and its tokenizer."""
    return cls.from_metadata(
      {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith("tokenizer.")
      },
      source=source,
    )

  @classmethod
  def from_metadata(cls, meta: Mapping[str, Any], source: str = "metadata") -> Tokenizer:
    """From {GGUF key: value} (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`, ...)."""
    model = meta.get("tokenizer.ggml.model")
    if model is None or "tokenizer.ggml.tokens" not in meta:
      raise ValueError(
        f"{source}: no tokenizer in the metadata (tokenizer.ggml.model / "
        "tokenizer.ggml.tokens missing)"
      )
    if model != TOKENIZER_MODEL:
      raise ValueError(
        f"{source}: tokenizer.ggml.model {model!r} is not supported; only "
        f"{TOKENIZER_MODEL!r} (byte-level BPE)"
      )
    if "tokenizer.ggml.merges" not in meta:
      raise ValueError(
        f"{source}: tokenizer.ggml.merges missing (a BPE vocabulary needs its merges)"
      )
    get = meta.get
    return cls(
      meta["tokenizer.ggml.tokens"],
      meta["tokenizer.ggml.merges"],
      get("tokenizer.ggml.token_type"),
      bos_id=get("tokenizer.ggml.bos_token_id"),
      eos_id=get("tokenizer.ggml.eos_token_id"),
      pad_id=get("tokenizer.ggml.padding_token_id"),
      unk_id=get("tokenizer.ggml.unknown_token_id"),
      chat_template=get("tokenizer.chat_template"),
      add_bos=get("tokenizer.ggml.add_bos_token", False),
      add_eos=get("tokenizer.ggml.add_eos_token", False),
      pre=get("tokenizer.ggml.pre"),
    )

  @property
  def vocab_size(self) -> int:
    return len(self.tokens)

  def token(self, token_id: int | None) -> str | None:
    return None if token_id is None else self.tokens[token_id]

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """text -> ids; BOS / EOS added only where the file asks (`add_bos`, `add_eos`).

    Special-token text such as "<|im_end|>" in `text` becomes its one id, as in
    transformers.
    """
    if not isinstance(text, str):
      raise TypeError(f"text must be a str, got {type(text).__name__}")
    ids = self._backend.encode(text, add_special_tokens=False).ids
    if add_special_tokens:
      if self.add_bos and self.bos_id is not None:
        ids = [self.bos_id] + ids
      if self.add_eos and self.eos_id is not None:
        ids = ids + [self.eos_id]
    return ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """ids -> text (special tokens kept by default, as transformers' `decode`)."""
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f"ids: {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
    return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

  def render_chat(
    self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs
  ) -> str:
    """The chat template rendered over `messages` ([{"role", "content"}, ...]).

    The template sees `messages`, `add_generation_prompt`, the special tokens' text
    (`bos_token`, `eos_token`, `unk_token`, `pad_token`) and `kwargs`, as in
    transformers.
    """
    if self.chat_template is None:
      raise ValueError(
        "messages: this tokenizer has no chat template "
        "(tokenizer.chat_template missing from the file)"
      )
    if isinstance(messages, Mapping) or not all(isinstance(m, Mapping) for m in messages):
      raise TypeError('messages must be a list of dicts with "role" and "content"')
    specials = {
      name: self.token(i)
      for name, i in (
        ("bos_token", self.bos_id),
        ("eos_token", self.eos_id),
        ("unk_token", self.unk_id),
        ("pad_token", self.pad_id),
      )
      if i is not None
    }
    return _compile_template(self.chat_template).render(
      messages=[dict(m) for m in messages],
      add_generation_prompt=add_generation_prompt,
      **{**specials, **kwargs},
    )

  def apply_chat_template(
    self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs
  ) -> list[int]:
    """The rendered chat as ids (no BOS / EOS added: the template writes its own)."""
    return self.encode(
      self.render_chat(messages, add_generation_prompt, **kwargs), add_special_tokens=False
    )


def from_gguf(path: str | os.PathLike) -> Tokenizer:
  """`Tokenizer.from_gguf(path)`."""
  return Tokenizer.from_gguf(path)


class T5Tokenizer(data.Vocabulary):
  """T5's SentencePiece vocabulary (`specdec.data.Vocabulary`) as a `TextTokenizer`.

  A `data.Vocabulary` in every respect (`encode`, `decode` up to the first EOS,
  `encode_padded`, `vocab_size` 32,100 with the sentinels), with the special ids named
  as `Tokenizer` names them, so that code serves T5 and decoder-only pairs alike.
  T5 prepends no BOS: `bos_id` is None.
  """

  bos_id = None
  eos_id = data.EOS_ID
  pad_id = data.PAD_ID

  @property
  def unk_id(self) -> int:
    return self._sp.unk_id()
