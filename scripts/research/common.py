"""What every pipeline in scripts/research shares: the log line and pair.json's config
fields."""

from __future__ import annotations

import dataclasses
import time
from typing import Any


def log(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def config_json(cfg: Any) -> dict[str, Any]:
  """A model config's fields for pair.json: the dtype is the checkpoint's, not the
  config's, and dropout does not exist at inference, so both are left out."""
  fields = dataclasses.asdict(cfg)
  fields.pop("dtype", None)
  fields.pop("dropout_rate", None)
  return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
