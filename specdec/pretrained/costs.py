"""A shipped pair's measured costs and the `AutoGamma` rule built from them.

`costs.json` beside a pair's weights holds, per draft, the `adaptive.StepCosts` timed
at each temperature and batch size (scripts/research/calibrate_pairs.py);
`step_costs` picks the nearest, `auto_gamma` turns them and the draft's measured
alpha (`registry.measured_alpha`) into the pair's rule.
"""

from __future__ import annotations

import json
from typing import Any

from specdec import adaptive
from specdec.pretrained.registry import check_draft, measured_alpha, pair_dir, pair_spec


def step_costs(
  name: str, draft: str = "draft", batch: int = 1, temperature: float = 0.0
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
  check_draft(name, draft)
  if (
    isinstance(temperature, bool)
    or not isinstance(temperature, (int, float))
    or not 0.0 <= temperature < float("inf")
  ):
    raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
  path = pair_dir(name) / "costs.json"
  by_temperature = json.loads(path.read_text()).get(draft) if path.exists() else None
  if not by_temperature:
    return None
  for t, table in by_temperature.items():
    if not isinstance(table, dict) or not table:
      raise ValueError(
        f"{path}: draft {draft!r} at temperature {t} has no batch sizes "
        f"(expected {{batch: step costs}}, got {table!r})"
      )

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
  gammas = pair_spec(name).auto_gammas
  return adaptive.DEFAULT_GAMMAS if gammas is None else gammas


def auto_gamma(
  name: str,
  temperature: float,
  batch: int = 1,
  draft: str = "draft",
  gammas: tuple[int, ...] | None = None,
  margin: float = SHIPPED_MARGIN,
) -> adaptive.AutoGamma:
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
    raise ValueError(
      f"draft {draft!r} of {name!r} has no measured costs; measure them "
      "with specdec.adaptive.calibrate"
    )
  prior = measured_alpha(name, draft, temperature)
  gammas = shipped_gammas(name) if gammas is None else gammas
  extra: dict[str, Any] = {} if prior is None else dict(prior=prior)
  return adaptive.AutoGamma.from_costs(costs, gammas, margin=margin, **extra)
