"""Gamma chosen each iteration by Section 3's rule, from measured costs (AutoGamma).

Leviathan et al. (2023), Section 3: an iteration that drafts gamma tokens yields
E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha) tokens in expectation (Eq. 1) and
costs gamma c + v(gamma + 1) target steps (Theorem 3.8, with v the measured cost of
verifying gamma + 1 positions; v = 1 on the paper's premise). `AutoGamma` applies that
rule online, inside the compiled loop: before each iteration it picks, from a static
set of gammas (0 = one plain target step, no draft call),

    argmax_gamma  sum over active rows b of E(alpha_hat_b, gamma) / (gamma c + v(gamma + 1))

-- one chunk length per target call, the expected tokens per unit of time of the whole
batch. alpha_hat_b is a per-row estimate of the acceptance rate with a prior and
forgetting (`estimate`): beta_i = sum_x min(p_i(x), q_i(x)) (Corollary 3.6; at
temperature 0, [x_i = argmax p_i]) of the positions each iteration verified, weighted
by decay^age in iterations, shrunk toward `prior` with `prior_weight` pseudo-positions:

    alpha_hat = (prior_weight * prior + S) / (prior_weight + N),
    S <- decay * S + sum of new betas,   N <- decay * N + their count.

Forgetting lets the estimate follow a prompt whose predictability changes; and since
an iteration with gamma 0 observes nothing, S and N keep decaying, alpha_hat returns
toward the prior, and the rule probes the draft again when the prior says it might
pay (after about log(1/2) / log(decay) iterations the data count half).

Exactness. The gamma of iteration j is a function of alpha_hat, i.e. of betas computed
in iterations before j, so it is fixed before iteration j's random draws (its keys are
fresh: the row key folded with j). Conditioned on the past, iteration j is Algorithm 1
with a fixed gamma, which emits Mp's law (Appendix A.1); by the chain rule, so is the
whole sequence. (Within a batch, the choice depends on other rows' pasts too, which
are independent of this row's new draws: the same argument holds; a row's tokens can
then depend on its batch, its law cannot.)
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import functools
import itertools
import json
import math
import numbers
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec import theory
from specdec.distributions import SamplingConfig

Array = jax.Array

DEFAULT_GAMMAS = (0, 1, 2, 3, 4, 6, 8)
OBJECTIVES = ("sum", "last")


def _check_real(
  name: str, value: Any, low: float, high: float, *, low_open=False, high_open=False
) -> float:
  if (
    isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or math.isnan(value)
  ):
    raise ValueError(f"{name} must be a number, got {value!r}")
  value = float(value)
  if value < low or value > high or (low_open and value == low) or (high_open and value == high):
    lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
    raise ValueError(f"{name} must be in {lo}{low}, {high}{hi}, got {value!r}")
  return value


def _check_int(name: str, value: Any, low: int) -> int:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < low:
    raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
  return int(value)


def _int_key(name: str, key: str) -> int:
  """A JSON object's key read as an int, or ValueError naming `name`."""
  try:
    return int(key)
  except ValueError:
    raise ValueError(f"{name}: keys must be ints, got {key!r}") from None


def _check_gammas(gammas: Any) -> tuple[int, ...]:
  """gammas as a tuple of distinct increasing ints >= 0, or ValueError naming it."""
  try:
    values = tuple(gammas)
  except TypeError:
    values = None
  if (
    not values
    or any(
      isinstance(g, (bool, np.bool_)) or not isinstance(g, numbers.Integral) or g < 0
      for g in values
    )
    or list(values) != sorted(set(values))
  ):
    raise ValueError(f"gammas must be distinct increasing ints >= 0, got {gammas!r}")
  return tuple(int(g) for g in values)


@dataclasses.dataclass(frozen=True)
class StepCosts:
  """Measured costs of one pair at one batch size, in target steps (t_p(1) = 1).

  Attributes:
    c: t_q / t_p(1), one draft step.
    v: ((k, t_p(k) / t_p(1)), ...): verifying k positions in one call.
    batch: the batch size they were measured at.
    device: where (`jax.devices()[0].device_kind`), for the record.
    iteration: ((gamma, cost), ...): one whole iteration of the decode loop at gamma,
      timed in the loop itself (`calibrate`), in steps of the baseline's loop: what
      gamma c + v(gamma + 1) leaves out (the draft catching up on a fully accepted
      chunk, the switch, the bookkeeping) included. Empty when not measured.
    temperature: the sampling temperature those iterations were timed at. A sampled
      iteration costs more per verified position than a greedy one (each position's
      p and q normalized, its ratio and residual drawn), so a rule for temperature T
      should use costs timed at T: the shipped pairs' greedy costs made gamma 3 look
      best at SmolLM2's temperature 1 where gamma 1 was.
  """

  c: float
  v: tuple[tuple[int, float], ...]
  batch: int = 1
  device: str = ""
  iteration: tuple[tuple[int, float], ...] = ()
  temperature: float = 0.0

  def __post_init__(self):
    _check_real("c", self.c, 0.0, math.inf, high_open=True)
    object.__setattr__(
      self,
      "temperature",
      _check_real("temperature", self.temperature, 0.0, math.inf, high_open=True),
    )
    pairs = tuple(
      (
        _check_int(f"v: key {k!r}", k, 1),
        _check_real(f"v({k})", x, 0.0, math.inf, low_open=True, high_open=True),
      )
      for k, x in self.v
    )
    if any(k < 2 for k, _ in pairs):
      raise ValueError(
        f"v: keys are positions verified per call, ints >= 2 (v(1) = 1 "
        f"by definition), got {[k for k, _ in pairs]}"
      )
    loops = tuple(
      (
        _check_int(f"iteration: key {g!r}", g, 0),
        _check_real(f"iteration({g})", x, 0.0, math.inf, low_open=True, high_open=True),
      )
      for g, x in self.iteration
    )
    if any(g < 0 for g, _ in loops):
      raise ValueError(f"iteration: gammas must be >= 0, got {[g for g, _ in loops]}")
    object.__setattr__(self, "c", float(self.c))
    object.__setattr__(self, "v", tuple(sorted(pairs)))
    object.__setattr__(self, "iteration", tuple(sorted(loops)))

  def v_of(self, k: int) -> float:
    """v(k); v(1) = 1 by definition; else measured, linearly interpolated."""
    if k == 1:
      return 1.0
    ks = [1] + [a for a, _ in self.v]  # keys >= 2, sorted (`__post_init__`)
    vs = [1.0] + [b for _, b in self.v]
    if k > ks[-1]:
      raise ValueError(f"v({k}) was not measured (largest k: {ks[-1]})")
    return float(np.interp(k, ks, vs))

  def cost(self, gamma: int) -> float:
    """What an iteration at `gamma` costs, in target steps: the loop's own measured
    iteration where there is one; else Theorem 3.8's gamma c + v(gamma + 1) (1 at
    gamma 0) plus the median of what the measured iterations cost beyond it."""
    measured = dict(self.iteration)
    if gamma in measured:
      return measured[gamma]
    excess = [x - self.model_cost(g) for g, x in self.iteration]
    return self.model_cost(gamma) + (float(np.median(excess)) if excess else 0.0)

  def model_cost(self, gamma: int) -> float:
    """Theorem 3.8's cost of an iteration, gamma c + v(gamma + 1); 1 at gamma 0."""
    return 1.0 if gamma == 0 else gamma * self.c + self.v_of(gamma + 1)

  def to_json(self) -> str:
    d = dict(
      c=self.c,
      v={str(k): x for k, x in self.v},
      batch=self.batch,
      device=self.device,
      temperature=self.temperature,
    )
    if self.iteration:
      d["iteration"] = {str(g): x for g, x in self.iteration}
    return json.dumps(d, indent=2)

  @classmethod
  def from_json(cls, text: str) -> StepCosts:
    """The costs `to_json` wrote. Raises ValueError naming a missing or bad key."""
    d = json.loads(text)
    if not isinstance(d, dict):
      raise ValueError(f"step costs: expected a JSON object, got {type(d).__name__}")
    for key in ("c", "v"):
      if key not in d:
        raise ValueError(f"step costs: the key {key!r} is missing (keys: {sorted(d)})")
    for key in ("v", "iteration"):
      if not isinstance(d.get(key, {}), dict):
        raise ValueError(f"{key}: expected an object {{k: cost}}, got {d[key]!r}")
    return cls(
      c=d["c"],
      v=tuple((_int_key("v", k), x) for k, x in d["v"].items()),
      batch=d.get("batch", 1),
      device=d.get("device", ""),
      temperature=d.get("temperature", 0.0),
      iteration=tuple((_int_key("iteration", g), x) for g, x in d.get("iteration", {}).items()),
    )

  def save(self, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
      f.write(self.to_json() + "\n")

  @classmethod
  def load(cls, path: str) -> StepCosts:
    with open(path, encoding="utf-8") as f:
      return cls.from_json(f.read())


@dataclasses.dataclass(frozen=True)
class AutoGamma:
  """gamma per iteration by Theorem 3.8's rule (frozen, hashable: a static argument).

  Attributes:
    gammas: the static set to choose from, increasing, each >= 0 (0: no draft call).
    costs: per gamma, the cost of its iteration in target steps, gamma c + v(gamma+1)
      (`from_costs` builds it; 1 for gamma 0).
    prior: alpha assumed before anything is seen, in [0, 1].
    prior_weight: how many positions the prior counts for, > 0.
    decay: forgetting per iteration, in (0, 1].
    objective: what the batch's choice optimizes (`choose`). "sum": the expected
      tokens per unit of time summed over active rows (throughput, right when a
      finished row's slot is refilled); "last": the expected time until the last
      active row finishes (a static batch's wall time, which its slowest row sets).
      Both are the same rule at batch 1.
    margin: >= 0; a drafting gamma must beat gamma 0 by this fraction to be chosen
      (its rate is divided by 1 + margin before the argmax; gammas > 0 compare among
      themselves as before). 0 is Section 3's rule. Measured costs carry the
      spread of the machine that timed them (2-6 % run to run on the 2-core CPU that
      timed the shipped pairs); where the best drafting gamma's predicted gain is
      inside that spread, the choice between drafting and not is decided by noise,
      and a wrong "draft" pays the loop's switching costs too. A margin of the
      costs' spread makes such a rule keep to plain steps (`never_drafts`).
  """

  gammas: tuple[int, ...]
  costs: tuple[float, ...]
  prior: float = 0.6
  prior_weight: float = 4.0
  decay: float = 0.9
  objective: str = "sum"
  margin: float = 0.0

  def __post_init__(self):
    gammas = _check_gammas(self.gammas)
    if len(self.costs) != len(gammas):
      raise ValueError(
        f"costs must have one entry per gamma ({len(gammas)}), got {len(self.costs)}"
      )
    costs = tuple(
      _check_real(f"costs[{i}]", x, 0.0, math.inf, low_open=True, high_open=True)
      for i, x in enumerate(self.costs)
    )
    object.__setattr__(self, "gammas", gammas)
    object.__setattr__(self, "costs", costs)
    object.__setattr__(self, "prior", _check_real("prior", self.prior, 0.0, 1.0))
    object.__setattr__(
      self,
      "prior_weight",
      _check_real("prior_weight", self.prior_weight, 0.0, math.inf, low_open=True, high_open=True),
    )
    object.__setattr__(self, "decay", _check_real("decay", self.decay, 0.0, 1.0, low_open=True))
    if self.objective not in OBJECTIVES:
      raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
    object.__setattr__(
      self, "margin", _check_real("margin", self.margin, 0.0, math.inf, high_open=True)
    )

  @classmethod
  def from_costs(
    cls, costs: StepCosts, gammas: Sequence[int] = DEFAULT_GAMMAS, prune: bool = True, **kwargs
  ) -> AutoGamma:
    """The rule for measured (or given) costs: per gamma, the loop's measured iteration
    where `costs` has one, else gamma c + v(gamma + 1) (`StepCosts.cost`). With
    `prune`, the gammas that no alpha would choose are left out (`useful_gammas`)."""
    if not isinstance(costs, StepCosts):
      raise TypeError(f"costs must be a StepCosts, got {type(costs).__name__}")
    gammas = _check_gammas(gammas)
    return cls._of(gammas, tuple(costs.cost(g) for g in gammas), prune, kwargs)

  @classmethod
  def from_c(
    cls,
    c: float,
    gammas: Sequence[int] = DEFAULT_GAMMAS,
    v: float = 1.0,
    prune: bool = True,
    **kwargs,
  ) -> AutoGamma:
    """The paper's premise: verification costs v (1: one target step) for any gamma;
    c e.g. from parameter counts (Section 3.5). `prune` as in `from_costs`."""
    c = _check_real("c", c, 0.0, math.inf, high_open=True)
    v = _check_real("v", v, 0.0, math.inf, low_open=True, high_open=True)
    gammas = _check_gammas(gammas)
    return cls._of(gammas, tuple(1.0 if g == 0 else g * c + v for g in gammas), prune, kwargs)

  @classmethod
  def _of(cls, gammas, costs, prune: bool, kwargs) -> AutoGamma:
    rule = cls(gammas=gammas, costs=costs, **kwargs)  # Validates before pruning.
    if not prune:
      return rule
    keep = useful_gammas(rule.gammas, rule.costs, rule.margin)
    return dataclasses.replace(
      rule, gammas=keep, costs=tuple(rule.costs[rule.gammas.index(g)] for g in keep)
    )

  @property
  def max_gamma(self) -> int:
    return self.gammas[-1]

  def predicted_speedup(self, alpha: float, gamma: int) -> float:
    """Theorem 3.8 with this rule's costs, for one gamma of the set."""
    cost = self.costs[self.gammas.index(gamma)]
    return float(theory.expected_tokens(alpha, gamma) / cost)

  def pick(self, progress: Progress) -> Array:
    """int32, the index in `gammas` of the next iteration's gamma, from the decode's
    past (`choose` on alpha_hat, the active rows and their remaining tokens). The
    decode loop calls nothing else of a rule to choose: a subclass that overrides it
    chooses otherwise (a fixed schedule, say), with the same exactness argument as
    long as it reads the past only."""
    return choose(self, progress.alpha_hat, progress.active, progress.remaining)


class Progress(NamedTuple):
  """Where a decode stands before an iteration: what `AutoGamma.pick` may read.

  Attributes:
    alpha_hat: float32[B], the online acceptance estimate (`Estimate.alpha`).
    active: bool[B], rows not yet done.
    remaining: int32[B], tokens each row may still emit.
    iterations: int32[B], iterations each row has run.
    row_keys: [B], the rows' PRNG keys. The iteration's own draws are derived from
      them and `iterations` (`specdec.sample.draws`): a rule that read those draws
      would no longer choose from the past only, and the output would lose Mp's law.
      A randomized rule draws from a stream of its own (another fold-in).
  """

  alpha_hat: Array
  active: Array
  remaining: Array
  iterations: Array
  row_keys: Array


def useful_gammas(
  gammas: Sequence[int], costs: Sequence[float], margin: float = 0.0
) -> tuple[int, ...]:
  """The gammas that maximize E(alpha, gamma) / cost(gamma) for some alpha in [0, 1]:
  Theorem 3.8's upper envelope, computed exactly, with the costs `choose` compares:
  every gamma > 0's counted (1 + `margin`) times (`AutoGamma.margin`), so that a
  gamma 0 the margin would choose is kept. Each rate is a polynomial in alpha,
  E(alpha, gamma) = sum_{k <= gamma} alpha^k, so the envelope can only change where two
  rates cross: at the real roots in [0, 1] of their differences. The argmax is taken
  at those points, at 0 and 1, and between each two consecutive ones.

  A gamma off the envelope is never a single row's choice; kept in the set, it costs
  the decode loop time on every pass all the same (its empty inner loop: about 1 % of
  an iteration each on the Multi30k pair at ~1 ms per target step). At batch > 1 the
  summed objective could in principle prefer an off-envelope gamma for a mix of rows;
  the envelope's best is then within the spread of the rows' own choices."""
  gammas = [int(g) for g in gammas]
  costs = [cost * (1.0 + margin) if g > 0 else cost for g, cost in zip(gammas, costs)]
  size = max(gammas) + 1
  polys = [
    np.where(np.arange(size) <= g, 1.0 / cost, 0.0)  # Coefficients, low first.
    for g, cost in zip(gammas, costs)
  ]
  points = {0.0, 1.0}
  for i in range(len(polys)):
    for j in range(i + 1, len(polys)):
      diff = np.trim_zeros(polys[i] - polys[j], "b")
      if diff.size > 1:
        roots = np.roots(diff[::-1])
        points.update(float(r.real) for r in roots if abs(r.imag) < 1e-9 and 0.0 <= r.real <= 1.0)
  ordered = sorted(points)
  probes = np.asarray(ordered + [(a + b) / 2 for a, b in itertools.pairwise(ordered)])
  rates = np.stack([np.polyval(p[::-1], probes) for p in polys], axis=1)
  # Ties (to rounding) go to the smallest gamma, as `choose`'s argmax does.
  best = np.argmax(rates >= rates.max(axis=1, keepdims=True) * (1.0 - 1e-9), axis=1)
  return tuple(gammas[i] for i in sorted(set(best.tolist())))


@flax.struct.dataclass
class Estimate:
  """The online acceptance estimate, per row: decayed sums of betas and counts.

  Attributes:
    beta_sum: float32[B].
    count: float32[B].
  """

  beta_sum: Array
  count: Array

  @classmethod
  def zeros(cls, batch: int) -> Estimate:
    return cls(jnp.zeros((batch,), jnp.float32), jnp.zeros((batch,), jnp.float32))

  def alpha(self, rule: AutoGamma) -> Array:
    """float32[B], alpha_hat: the decayed mean of beta, shrunk toward the prior."""
    return (rule.prior_weight * rule.prior + self.beta_sum) / (rule.prior_weight + self.count)

  def update(self, rule: AutoGamma, betas: Array, observed: Array, active: Array) -> Estimate:
    """One iteration: betas float32[B, k] of which `observed` bool[B, k] count."""
    decay = jnp.where(active, rule.decay, 1.0)
    return Estimate(
      beta_sum=decay * self.beta_sum + jnp.sum(jnp.where(observed, betas, 0.0), axis=1),
      count=decay * self.count + jnp.sum(observed, axis=1, dtype=jnp.float32),
    )


def choose(
  rule: AutoGamma, alpha_hat: Array, active: Array, remaining: Array | None = None
) -> Array:
  """int32 index into `rule.gammas` for this iteration (Theorem 3.8's rule).

  E_b(gamma) = E(alpha_hat_b, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha) (Eq. 1;
  gamma + 1 at alpha = 1), the expected tokens of row b; with `remaining` (int[B],
  tokens row b may still emit), E(alpha_hat_b, min(gamma, remaining_b - 1)): the
  expected tokens that count, since a row stops at its limit (exact under Eq. 1's
  model: capping the draft at remaining - 1 leaves min(tokens, remaining) unchanged).
  Then, over active rows,

    "sum":  argmax_gamma  sum_b E_b(gamma) / cost(gamma),
    "last": argmin_gamma  cost(gamma) * max_b remaining_b / E_b(gamma)

  (`rule.objective`; "last" needs `remaining`): the batch's tokens per unit of time,
  or the expected time until its last row finishes if gamma were kept; with
  `rule.margin`, cost(gamma) of every gamma > 0 counts (1 + margin) times. A few fused
  operations, cheap enough to run before every step."""
  gammas = jnp.asarray(rule.gammas, jnp.float32)[None, :]
  alpha = jnp.clip(alpha_hat, 0.0, 1.0)[:, None]
  if remaining is not None:
    rest = jnp.maximum(jnp.asarray(remaining, jnp.float32), 1.0)[:, None]
    gammas = jnp.minimum(gammas, rest - 1.0)
  one = alpha >= 1.0 - 1e-6
  e = jnp.where(
    one, gammas + 1.0, (1.0 - alpha ** (gammas + 1.0)) / jnp.where(one, 1.0, 1.0 - alpha)
  )
  # The margin as a dearer drafting iteration: gamma > 0 costs (1 + margin) times more.
  costs = jnp.asarray(
    [cost * (1.0 + rule.margin) if g > 0 else cost for g, cost in zip(rule.gammas, rule.costs)],
    jnp.float32,
  )
  if rule.objective == "last":
    if remaining is None:
      raise ValueError('objective "last" needs each row\'s remaining tokens')
    times = costs * jnp.max(jnp.where(active[:, None], rest / e, 0.0), axis=0)
    return jnp.argmin(times).astype(jnp.int32)
  rates = jnp.sum(jnp.where(active[:, None], e, 0.0), axis=0) / costs
  return jnp.argmax(rates).astype(jnp.int32)


@functools.lru_cache(maxsize=256)
def never_drafts(rule: AutoGamma) -> bool:
  """True when the rule is not worth running: `speculative_sample` then runs the
  baseline's loop for it (plain target steps; decided before anything is seen, so the
  law is the baseline's, exact).

  Two cases. (a) `choose` picks gamma 0 at the prior: then no iteration ever drafts
  (alpha_hat changes only through what drafts show, so it stays at the prior). (b)
  The set allows gamma 0 (not speculating) and no gamma > 0 beats the baseline's
  program at the prior: Theorem 3.8's rate E(prior, gamma) / cost(gamma)
  (`predicted_speedup`) <= 1 + `margin` tokens per target step for every gamma > 0. The
  loop's own gamma-0 iteration costs more than a baseline step (`costs[0]` >= 1 as
  measured), so inside the loop the rule would draft against that dearer
  alternative and lose to the baseline on average (the Multi30k pair at T=0: prior
  0.657, best rate 0.99, measured 0.92x of the baseline)."""
  with jax.ensure_compile_time_eval():
    first = choose(
      rule, Estimate.zeros(1).alpha(rule), jnp.ones((1,), bool), jnp.full((1,), 1 << 20, jnp.int32)
    )
  if rule.gammas[int(first)] == 0:
    return True
  return 0 in rule.gammas and all(
    rule.predicted_speedup(rule.prior, g) <= 1.0 + rule.margin for g in rule.gammas if g > 0
  )


def calibrate(
  target: Any,
  draft: Any,
  inputs: Array,
  gammas: Sequence[int] = DEFAULT_GAMMAS,
  max_length: int = 64,
  repeats: int = 3,
  steps: int = 16,
  rounds: int = 3,
  loop: bool = True,
  sampling: SamplingConfig | None = None,
) -> StepCosts:
  """Measures this pair's costs at this batch size: c, v(gamma + 1) and, with `loop`,
  one iteration of the decode loop at each gamma.

  c and v: each one `extend` on a primed cache, timed inside a compiled loop, minimum
  over rounds, all measured in turn in each round (`specdec.costs.verify_costs`).
  The loop's iterations: the AutoGamma decode with this set of gammas, forced to each
  gamma in turn, and the baseline decode, all with `max_length - max(gammas) - 1` new
  tokens and no EOS; per iteration less the prefill, over the baseline's time per
  token (`specdec.costs.iteration_costs`). These are what the rule uses
  (`StepCosts.cost`): they hold what an iteration costs beyond its model calls.
  `sampling` (default greedy) is the decode's: the loop's iterations are timed with
  it, and its temperature is recorded (`StepCosts.temperature`). Store the result
  with `StepCosts.save`.
  """
  # `specdec.costs` times the sampler, which imports this module.
  from specdec import costs

  sampling = SamplingConfig(temperature=0.0) if sampling is None else sampling
  ks = sorted({g + 1 for g in gammas if g > 0})
  r = costs.verify_costs(
    target, draft, inputs, ks, max_length, repeats=repeats, steps=steps, rounds=rounds
  )
  iteration = ()
  if loop:
    new_tokens = max_length - max(gammas) - 1
    if new_tokens < 1:
      raise ValueError(f"max_length {max_length} leaves no new token at gamma {max(gammas)}")
    loops = costs.iteration_costs(
      target, draft, inputs, tuple(gammas), new_tokens, sampling, rounds=rounds, repeats=repeats
    )
    iteration = tuple(sorted(loops["cost"].items()))
  return StepCosts(
    c=r["c"],
    v=tuple((k, r["v"][k]) for k in ks),
    batch=int(inputs.shape[0]),
    device=jax.devices()[0].device_kind,
    iteration=iteration,
    temperature=sampling.temperature,
  )
