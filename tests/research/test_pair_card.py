"""scripts/research/pair_card.py: the Multi30k pair's card is a function of its
pair.json."""

import json

import pytest

from specdec import pretrained

import pair_card

pytestmark = pytest.mark.research

NAME = "multi30k_ende"


def test_the_shipped_card_is_what_its_pair_json_writes():
  """Every number and word of the shipped card comes from pair.json (the training
  script's path aside, which moved to scripts/research after the card was written)."""
  shipped = (pretrained.pair_dir(NAME) / "MODEL_CARD.md").read_text()
  shipped = shipped.replace("`scripts/train_pair.py`", "`scripts/research/train_pair.py`")
  assert pair_card.model_card(pretrained.pair_info(NAME)) == shipped


def test_the_card_follows_the_measurements(tmp_path, monkeypatch):
  info = pretrained.pair_info(NAME)
  info["metrics"]["bleu"]["multi30k_test_2016"] = 12.345
  (tmp_path / "pair.json").write_text(json.dumps(info))
  monkeypatch.setattr(pair_card.pretrained, "pair_dir", lambda name: tmp_path)
  monkeypatch.setattr(pair_card.pretrained, "pair_info", lambda name: info)
  path = pair_card.write_card(NAME)
  assert path == str(tmp_path / "MODEL_CARD.md")
  card = (tmp_path / "MODEL_CARD.md").read_text()
  assert "| target BLEU (greedy, sacrebleu) | 12.3 |" in card
