"""Measurements every benchmark shares: step costs, decode timings, alpha, buckets.

The performance model (DESIGN, and Theorem 3.8 of Leviathan et al. 2023 refined):
one iteration costs gamma draft steps and one target call over gamma + 1 positions,
so with c = t_q / t_p1 and v = t_p(gamma+1) / t_p1 the predicted speed-up is
E[tokens](alpha, gamma) / (gamma c + v). The paper's premise is v = 1 (the target's
chunk of gamma + 1 costs what one token costs, given idle parallel compute); a CPU has
no idle compute, so v > 1 there and it is measured, not assumed.

Timings are of already compiled functions, measured on the same inputs in one run.
The costs that the prediction and the measured speed-up are made of (`step_costs`,
`time_decodes`) are minima over repeats, the step costs over interleaved rounds: on a
shared machine interference only ever adds time, so the minimum estimates the cost
itself, and the two sides of measured / predicted are estimated alike.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec import adaptive, data, drafts, sample, theory
from specdec.models import t5
from specdec.distributions import (SamplingConfig, greedy_tokens_checked, probabilities,
                                   probabilities_checked)


def _wall_times(fn: Callable[[], Any], repeats: int, warmup: int) -> list[float]:
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Median wall time of `fn()` (blocked until ready) over `repeats`, after warm-up."""
  return float(np.median(_wall_times(fn, repeats, warmup)))


def min_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Minimum wall time of `fn()` (blocked until ready) over `repeats`, after warm-up."""
  return float(np.min(_wall_times(fn, repeats, warmup)))


def interleaved_min_seconds(calls: dict[Any, Callable[[], Any]], rounds: int,
                            repeats: int) -> dict[Any, float]:
  """Each call's minimum seconds over `rounds` rounds of `repeats` (`min_seconds`),
  all of them timed in turn in each round, so that a slow spell of the machine falls
  on all alike."""
  best = {name: float("inf") for name in calls}
  for _ in range(rounds):
    for name, fn in calls.items():
      best[name] = min(best[name], min_seconds(fn, repeats))
  return best


@functools.partial(jax.jit, static_argnames=("steps",))
def _extend_repeated(model, state, tokens, steps):
  """`steps` calls of model.extend(state, tokens) in one compiled scan, each rewound
  to the start, each consuming all of its logits (so none of the work is dropped)."""
  start = model.lengths(state)

  def body(carry, _):
    state, acc = carry
    logits, state = model.extend(state, tokens)
    return (model.rewind(state, start), acc + jnp.max(logits)), None

  (_, acc), _ = jax.lax.scan(body, (state, jnp.zeros((), jnp.float32)), None,
                             length=steps)
  return acc


def extend_seconds(model, state, tokens: jax.Array, repeats: int = 5,
                   steps: int = 16, reduce: Callable[..., Any] = np.median) -> float:
  """Seconds of one `extend(state, tokens)` as the decode loops see it: `reduce`
  (median by default) over `repeats` of `steps` calls inside one compiled scan,
  divided by `steps`, so that no per-call dispatch from Python is counted (the
  samplers make none)."""
  times = _wall_times(lambda: _extend_repeated(model, state, tokens, steps), repeats, 1)
  return float(reduce(times)) / steps


@flax.struct.dataclass
class _FeatureStep:
  """A feature draft's step as `extend_seconds` times it: each token fed with a
  feature (zeros; the cost does not depend on its value), the logits returned."""

  draft: Any

  def extend(self, state, tokens):
    features = jnp.zeros(tokens.shape + (self.draft.feature_size,), jnp.float32)
    logits, _, state = self.draft.extend(state, tokens, features)
    return logits, state

  def rewind(self, state, lengths):
    return self.draft.rewind(state, lengths)

  def lengths(self, state):
    return self.draft.lengths(state)


def step_costs(target, draft, inputs: jax.Array, gamma: int, max_length: int,
               repeats: int = 3, steps: int = 16, rounds: int = 3) -> dict[str, float]:
  """t_p1, t_p(gamma+1) and t_q in seconds, and c, v, for these models and inputs.

  Each is one `extend` on a cache primed by `init` (the encoder's cost is excluded:
  it runs once per input either way), timed inside a compiled loop
  (`extend_seconds`); the minimum over `rounds` x `repeats`, the three measured in
  turn in each round so that a slow spell of the machine cannot fall on one alone.
  """
  r = verify_costs(target, draft, inputs, [gamma + 1], max_length, repeats, steps,
                   rounds)
  return dict(t_p1=r["t_p1"], t_p_gamma1=r["t_p"][gamma + 1], t_q=r["t_q"], c=r["c"],
              v=r["v"][gamma + 1])


def _primed(target, draft, inputs: jax.Array, max_length: int):
  """(target state, the draft as one-step model, its state), both caches primed by
  `init` (a feature draft with the target's prompt features)."""
  if sample.reads_target_features(draft):
    target_state, features = target.init_with_features(inputs, max_length)
    return target_state, _FeatureStep(draft), draft.init(inputs, max_length, features)
  return target.init(inputs, max_length), draft, draft.init(inputs, max_length)


def predicted_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
  """E[tokens](alpha, gamma) / (gamma c + v): Theorem 3.8 with v = 1, refined else."""
  return float(theory.walltime_improvement(alpha, gamma, c, v=v))


def pooled_alpha(stats: sample.SpeculativeStats) -> float:
  """The paper's alpha over a whole decode: total beta over decoded positions."""
  return float(np.sum(stats.beta_sum) / max(int(np.sum(stats.beta_count)), 1))


def pooled_tokens_per_iteration(stats: sample.SpeculativeStats) -> float:
  return float(np.sum(stats.accepted + stats.iterations) /
               max(int(np.sum(stats.iterations)), 1))


def time_decodes(decode: Callable[[jax.Array, jax.Array], sample.SampleOutput],
                 inputs: list[jax.Array], key: jax.Array, repeats: int = 1
                 ) -> tuple[float, list[sample.SampleOutput]]:
  """Seconds per generated token over `inputs` (each [1, S]), and the outputs.

  Each input is decoded once untimed (compiling if needed, and giving the output) and
  then `repeats` times timed; the time per token is the sum over inputs of each
  one's minimum time, over the total tokens. `time_decodes_paired` times several
  decoders in turn.
  """
  return time_decodes_paired({"decode": decode}, inputs, key, repeats)["decode"]


def time_each(decoders: dict[str, Callable[[jax.Array, jax.Array], sample.SampleOutput]],
              inputs: list[jax.Array], key: jax.Array, repeats: int = 3
              ) -> dict[str, tuple[list[float], list[sample.SampleOutput]]]:
  """Per input, each decoder once untimed (compiling if needed, and giving the
  output), then `repeats` rounds timing each in turn, so that a slow spell of a shared
  machine falls on all of them alike. Returns, per decoder, (the minimum seconds of
  each input, the outputs)."""
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  out = {name: ([], []) for name in decoders}
  for i, x in enumerate(inputs):
    k = jax.random.fold_in(key, i)
    for name, decode in decoders.items():
      out[name][1].append(jax.block_until_ready(decode(x, k)))
    best = {name: float("inf") for name in decoders}
    for _ in range(repeats):
      for name, decode in decoders.items():
        start = time.perf_counter()
        jax.block_until_ready(decode(x, k).tokens)
        best[name] = min(best[name], time.perf_counter() - start)
    for name in decoders:
      out[name][0].append(best[name])
  return out


def time_decodes_paired(decoders: dict[str, Callable[[jax.Array, jax.Array],
                                                       sample.SampleOutput]],
                        inputs: list[jax.Array], key: jax.Array, repeats: int = 3
                        ) -> dict[str, tuple[float, list[sample.SampleOutput]]]:
  """`time_decodes` for several decoders side by side (`time_each`). Returns, per
  decoder, (seconds per generated token: the sum over inputs of the minimum times
  over its tokens, outputs)."""
  timed = time_each(decoders, inputs, key, repeats)
  return {name: (sum(seconds) / max(int(sum(np.sum(o.lengths) for o in outs)), 1), outs)
          for name, (seconds, outs) in timed.items()}


def speculative_decoder(target, draft, gamma: int, max_new_tokens: int,
                        sampling: SamplingConfig, eos_id: int | None,
                        lenience: float = 1.0):
  def decode(x, key):
    return sample.speculative_sample(target, draft, x, key, gamma=gamma,
                                     max_new_tokens=max_new_tokens, sampling=sampling,
                                     eos_id=eos_id, lenience=lenience)
  return decode


def _in_loop_decoder(target, draft, rule: adaptive.AutoGamma, max_new_tokens: int,
                     sampling: SamplingConfig):
  """The AutoGamma decode loop itself, no EOS, also for a rule that never drafts (which
  `speculative_sample` runs as the baseline's loop): what a gamma-0 iteration costs
  inside a decode that has drafted."""
  def decode(x, key):
    return sample._speculative_jit(target, draft, x, key, gamma=rule,
                                   max_new_tokens=max_new_tokens,
                                   sampling=sampling.normalized(target.vocab_size),
                                   eos_id=None)
  return decode


def autoregressive_decoder(target, max_new_tokens: int, sampling: SamplingConfig,
                           eos_id: int | None):
  def decode(x, key):
    return sample.autoregressive_sample(target, x, key, max_new_tokens=max_new_tokens,
                                        sampling=sampling, eos_id=eos_id)
  return decode


# ------------------------------------------------------------------------------
# Random-weight T5 presets for shape benchmarks (`python -m specdec.bench costs
# --target-config`).
# ------------------------------------------------------------------------------
def t5_shape_config(name: str, vocab_size: int = t5.T5_VOCAB_SIZE) -> t5.T5Config:
  """A `t5.CONFIGS` preset (or 'tiny'): float32 on a CPU (XLA:CPU's bfloat16 is
  emulated), the preset's bfloat16 elsewhere. Raises naming an unknown `name`."""
  if name == "tiny":
    return t5.tiny_config("1.1", vocab_size=vocab_size)
  if name not in t5.CONFIGS:
    raise ValueError(f"config: unknown T5 config {name!r}; have 'tiny' and "
                     f"{sorted(t5.CONFIGS)}")
  cfg = t5.CONFIGS[name]
  if jax.default_backend() == "cpu":
    cfg = cfg.replace(dtype=jnp.float32)
  return cfg


def random_t5_params(cfg: t5.T5Config, seed: int) -> Any:
  """Random weights for shape benchmarks: numpy's float32 draw on a CPU; on an
  accelerator drawn there, in the config's dtype (bfloat16 for the presets), as
  inference stores them (`t5.device_random_params`)."""
  if jax.default_backend() == "cpu":
    return jax.device_put(t5.random_params(cfg, seed=seed))
  return t5.device_random_params(cfg, seed=seed)


# ------------------------------------------------------------------------------
# The decode loop against its parts: what Theorem 3.8's prediction leaves out.
# ------------------------------------------------------------------------------
def _state_sum(tree) -> jax.Array:
  # Every leaf consumed, so that no part of a prefill is dropped as dead code.
  return sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(tree))


@functools.partial(jax.jit, static_argnames=("max_length",))
def prefill(target, draft, inputs, max_length):
  """Both models' caches for `inputs` (the target's alone: draft None), as a decode
  builds them before its loop; a scalar that depends on all of them."""
  out = _state_sum(target.init(inputs, max_length))
  return out if draft is None else out + _state_sum(draft.init(inputs, max_length))


@functools.partial(jax.jit, static_argnames=("chunk", "iterations", "max_length",
                                             "sampling"))
def _target_loop(target, inputs, *, chunk, iterations, max_length, sampling):
  """The target's half of `iterations` decode iterations: one `extend` over `chunk`
  positions and the next tokens read off its logits (argmax, or the probabilities
  at a temperature), keeping one position per iteration as a decode keeps n + 1."""
  state = target.init(inputs, max_length)
  tokens = jnp.tile(target.start_tokens(inputs)[:, None], (1, chunk))

  def body(_, carry):
    state, acc = carry
    start = target.lengths(state)
    logits, state = target.extend(state, tokens)
    if sampling.greedy:
      acc = acc + jnp.sum(greedy_tokens_checked(logits)[0])
    else:
      acc = acc + jnp.sum(probabilities_checked(logits, sampling)[0][..., 0])
    return target.rewind(state, start + 1), acc

  return jax.lax.fori_loop(0, iterations, body, (state, jnp.zeros((), jnp.float32)))[1]


@functools.partial(jax.jit, static_argnames=("gamma", "iterations", "max_length",
                                             "sampling"))
def _draft_loop(target, draft, inputs, key, *, gamma, iterations, max_length,
                sampling):
  """The draft's half: `iterations` x the sampler's own gamma draft steps (the
  draft as the decode loop sees it, `drafts.as_proposer`), each iteration committing
  one position, as a rejection at the first draft does."""
  del target  # The proposer starts from the inputs as the sampler's does.
  proposer = drafts.as_proposer(draft)
  state = proposer.start(inputs, max_length, gamma, False, None)
  batch = inputs.shape[0]
  row_keys = sample._row_keys(key, batch)  # pylint: disable=protected-access
  rejected = jnp.zeros((batch,), jnp.int32)
  active = jnp.ones((batch,), bool)

  def body(i, carry):
    state, acc = carry
    keys = sample._iteration_keys(  # pylint: disable=protected-access
        row_keys, jnp.full((batch,), i), gamma + 2)
    x, _, _, state = proposer.propose(state, keys[:, :gamma], sampling, gamma)
    chunk = jnp.concatenate([x[:, :1], x], axis=1)
    state = proposer.commit(state, chunk, rejected, gamma, None, active)
    return state, acc + jnp.sum(x)

  return jax.lax.fori_loop(0, iterations, body, (state, jnp.zeros((), jnp.int32)))[1]


def loop_costs(target, draft, inputs: jax.Array, gamma: int, max_new_tokens: int,
               sampling: SamplingConfig, key: jax.Array, rounds: int = 3,
               repeats: int = 2) -> dict[str, float]:
  """The speculative decode loop timed against the parts Theorem 3.8 counts.

  On `inputs` [1, S] with no EOS (every decode runs `max_new_tokens`), in interleaved
  rounds (minimum of `repeats` per round, minimum over rounds):

  - the whole speculative decode and the whole baseline decode, each less its
    prefill (`init`, timed alone), per iteration and per token;
  - the same number of iterations of the target's half alone (`extend` over gamma +
    1 positions, the next tokens off the logits) and of the draft's half alone (the
    sampler's gamma draft steps), each less its prefill;
  - the target's one-token step in the same kind of loop.

  Returns seconds ("spec_iteration", "target_chunk", "draft_steps", "overhead" =
  spec_iteration - target_chunk - draft_steps, "baseline_token", "target_step"), the
  decode's own "iterations" and "tokens_per_iteration", and "speedup" (the decode
  loops' measured speed-up, prefill excluded), "predicted" (Theorem 3.8 with these
  parts and the decode's own tokens per iteration: tokens_per_iteration x
  target_step / (target_chunk + draft_steps)), and "measured_over_predicted". With
  the decode's own tokens per iteration, the ratio isolates the cost model from
  alpha's estimate: below 1 by the loop's own overhead and by the baseline loop's
  cost beyond its steps."""
  if inputs.ndim != 2 or inputs.shape[0] != 1:
    raise ValueError(f"inputs: one row [1, S] expected, got shape {inputs.shape}")
  length = max_new_tokens + gamma + 1
  spec = jax.jit(speculative_decoder(target, draft, gamma, max_new_tokens, sampling,
                                     None))
  base = jax.jit(autoregressive_decoder(target, max_new_tokens, sampling, None))
  out = jax.block_until_ready(spec(inputs, key))
  iterations = int(out.stats.iterations[0])
  tokens = int(out.lengths[0])
  base_length = max_new_tokens + 1
  calls = dict(
      spec=lambda: spec(inputs, key).tokens,
      base=lambda: base(inputs, key).tokens,
      prefill_both=lambda: prefill(target, draft, inputs, length),
      prefill_target=lambda: prefill(target, None, inputs, length),
      prefill_base=lambda: prefill(target, None, inputs, base_length),
      target_chunk=lambda: _target_loop(target, inputs, chunk=gamma + 1,
                                        iterations=iterations, max_length=length,
                                        sampling=sampling),
      draft_steps=lambda: _draft_loop(target, draft, inputs, key, gamma=gamma,
                                      iterations=iterations, max_length=length,
                                      sampling=sampling),
      target_step=lambda: _target_loop(target, inputs, chunk=1,
                                       iterations=max_new_tokens,
                                       max_length=base_length, sampling=sampling))
  best = interleaved_min_seconds(calls, rounds, repeats)
  draft_prefill = max(best["prefill_both"] - best["prefill_target"], 0.0)
  r = dict(
      iterations=iterations, tokens=tokens,
      tokens_per_iteration=tokens / iterations,
      spec_iteration=(best["spec"] - best["prefill_both"]) / iterations,
      target_chunk=(best["target_chunk"] - best["prefill_target"]) / iterations,
      draft_steps=(best["draft_steps"] - draft_prefill) / iterations,
      baseline_token=(best["base"] - best["prefill_base"]) / max_new_tokens,
      target_step=(best["target_step"] - best["prefill_base"]) / max_new_tokens,
      prefill_target=best["prefill_target"], prefill_draft=draft_prefill)
  return loop_ratios(r)


def forced_rule(gammas: tuple[int, ...], gamma: int) -> adaptive.AutoGamma:
  """An AutoGamma over `gammas` whose rule always picks `gamma` (every other gamma
  costs 1e18 times more): the adaptive decode loop, compiled as it is, run at one
  gamma, to time its iterations (`iteration_costs`)."""
  if gamma not in gammas:
    raise ValueError(f"gamma {gamma} is not in gammas {gammas}")
  return adaptive.AutoGamma(gammas=gammas, costs=tuple(1e-9 if g == gamma else 1e9
                                                       for g in gammas))


def iteration_costs(target, draft, inputs: jax.Array, gammas: tuple[int, ...],
                    max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(0.0),
                    key: jax.Array | None = None, rounds: int = 3,
                    repeats: int = 2) -> dict[str, Any]:
  """Seconds of one iteration of the AutoGamma decode loop at each of its gammas.

  The loop over `gammas` is forced to each gamma in turn (`forced_rule`) and run on
  `inputs` with no EOS, beside the baseline decode, in interleaved rounds (minimum of
  `repeats` per round, minimum over rounds); each less its prefill (`init`, timed
  alone), over the iterations its longest row ran (one call of the loop serves the
  batch). Returns {"seconds": {gamma: s}, "baseline_token": s, "cost": {gamma:
  seconds / baseline_token}}: an iteration's cost in steps of the baseline's loop.
  """
  key = jax.random.key(0) if key is None else key
  capacity = max_new_tokens + max(gammas) + 1
  # The samplers are jitted with the models as arguments: wrapping them in another
  # jit would close over the weights and compile them into each executable as
  # constants (one copy of the target per gamma).
  decoders = {g: _in_loop_decoder(target, draft, forced_rule(gammas, g), max_new_tokens,
                                  sampling)
              for g in gammas}
  base = autoregressive_decoder(target, max_new_tokens, sampling, None)
  iterations = {g: int(np.max(np.asarray(jax.block_until_ready(d(inputs, key))
                                          .stats.iterations)))
                for g, d in decoders.items()}
  calls = {("spec", g): (lambda d=d: d(inputs, key).tokens) for g, d in decoders.items()}
  calls["base"] = lambda: base(inputs, key).tokens
  calls["prefill_both"] = lambda: prefill(target, draft, inputs, capacity)
  calls["prefill_base"] = lambda: prefill(target, None, inputs, max_new_tokens + 1)
  best = interleaved_min_seconds(calls, rounds, repeats)
  token = max(best["base"] - best["prefill_base"], 1e-12) / max_new_tokens
  seconds = {g: max(best[("spec", g)] - best["prefill_both"], 1e-12) / iterations[g]
             for g in gammas}
  return dict(seconds=seconds, baseline_token=token,
              cost={g: s / token for g, s in seconds.items()})


def loop_ratios(r: dict[str, Any]) -> dict[str, Any]:
  """`loop_costs`' derived figures from its seconds and tokens per iteration (also
  for figures pooled over prompts): overhead, speedup, predicted and their ratio."""
  r["overhead"] = r["spec_iteration"] - r["target_chunk"] - r["draft_steps"]
  r["speedup"] = r["baseline_token"] * r["tokens_per_iteration"] / r["spec_iteration"]
  r["predicted"] = (r["tokens_per_iteration"] * r["target_step"]
                    / (r["target_chunk"] + r["draft_steps"]))
  r["measured_over_predicted"] = r["speedup"] / r["predicted"]
  return r


# ------------------------------------------------------------------------------
# Length buckets: a few static input shapes, so a run over a whole test set
# compiles a handful of times, not once per input length.
# ------------------------------------------------------------------------------
def bucket_lengths(max_length: int, smallest: int = 16) -> tuple[int, ...]:
  """Powers of two from `smallest` below `max_length`, then `max_length` itself."""
  if max_length < 2:
    raise ValueError(f"max_length must be >= 2, got {max_length}")
  out, n = [], smallest
  while n < max_length:
    out.append(n)
    n *= 2
  return tuple(out) + (max_length,)


def pad_to_bucket(ids: Any, buckets: tuple[int, ...], pad_id: int = 0) -> np.ndarray:
  """int32[1, L]: `ids` (EOS included) right-padded with `pad_id` (0, T5's padding, by
  default; a `llama.Llama`'s own pad_id for its prompts) to the smallest bucket L that
  holds them; ids longer than the largest bucket raise ValueError."""
  ids = np.asarray(ids, np.int32).reshape(-1)
  for length in buckets:
    if ids.size <= length:
      out = np.full((1, length), pad_id, np.int32)
      out[0, :ids.size] = ids
      return out
  raise ValueError(f"ids: {ids.size} tokens exceed the largest bucket {buckets[-1]}")


def compile_count() -> int:
  """Entries in the jit caches of the samplers and of this module's functions: the
  difference over a run is the number of compilations it caused."""
  fns = (sample._speculative_jit, sample._autoregressive_jit, _extend_repeated,
         _teacher_forced_betas)
  return int(sum(f._cache_size() for f in fns))


# ------------------------------------------------------------------------------
# alpha the paper's way: E[beta] along the target's own outputs (Section 3.1).
# ------------------------------------------------------------------------------
def _betas(target, draft, inputs, tokens, sampling):
  start = target.start_tokens(inputs)[:, None]
  chunk = jnp.concatenate([start, tokens[:, :-1]], axis=1)
  length = tokens.shape[1]
  p_logits, _ = target.extend(target.init(inputs, length), chunk)
  q_logits, _ = draft.extend(draft.init(inputs, length), chunk)
  p = probabilities(p_logits, sampling)
  q = probabilities(q_logits, sampling)
  return jnp.sum(jnp.minimum(p, q), axis=-1)


_teacher_forced_betas = jax.jit(_betas, static_argnames=("sampling",))


def teacher_forced_betas(target, draft, inputs: jax.Array, tokens: jax.Array,
                         lengths: jax.Array, sampling: SamplingConfig) -> list[np.ndarray]:
  """beta = sum_x min(p(x), q(x)) at every position of the given outputs.

  `tokens` [B, T] are outputs of the target (its baseline decode), `lengths` [B] how
  many of them each row has; p and q are both models' distributions (after
  `sampling`'s adjustments, Section 2.3) given the prefix of those outputs, all T
  positions in one `extend` call per model. Returns one float array per row, of its
  length: the per-token betas whose mean over a corpus is the paper's alpha.
  """
  betas = np.asarray(_teacher_forced_betas(target, draft, inputs, tokens,
                                           sampling=sampling))
  lengths = np.asarray(lengths)
  return [betas[b, :lengths[b]] for b in range(betas.shape[0])]


# ------------------------------------------------------------------------------
# Arithmetic operations per decoded token (Theorem 3.11's c-hat).
# ------------------------------------------------------------------------------
def decode_ops_per_token(cfg) -> int:
  """Multiply-adds of one decoder step of a T5 config (the encoder runs once per
  input and is left out): per layer the self-attention's q, k, v, o projections,
  the cross-attention's q and o (its k, v are computed once from the encoder), the
  MLP; then the logits layer. Attention over the cache is not counted (it is small
  next to the projections at the paper's lengths)."""
  inner = cfg.num_heads * cfg.head_dim
  per_layer = (4 * cfg.emb_dim * inner + 2 * cfg.emb_dim * inner
               + (len(cfg.mlp_activations) + 1) * cfg.emb_dim * cfg.mlp_dim)
  return int(cfg.num_decoder_layers * per_layer + cfg.emb_dim * cfg.vocab_size)


# ------------------------------------------------------------------------------
# Inputs of the translation pair.
# ------------------------------------------------------------------------------
def encode_sources(vocab, sentences, length: int) -> np.ndarray:
  """int32[N, length]: the task prefix, the sentence, EOS, padding (one shape)."""
  return np.stack([vocab.encode_padded(data.TRANSLATE_PREFIX + s, length)
                   for s in sentences])


def batched(inputs: np.ndarray, batch: int):
  """(inputs [batch, L], real rows): the last batch is filled with copies of row 0."""
  for start in range(0, len(inputs), batch):
    chunk = inputs[start:start + batch]
    size = len(chunk)
    if size < batch:
      chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - size, axis=0)])
    yield jnp.asarray(chunk), size


# ------------------------------------------------------------------------------
# Decoder-only prompts, and the verification cost at every chunk length.
# ------------------------------------------------------------------------------
def right_pad(prompts: Any, pad_id: int | None, length: int | None = None) -> np.ndarray:
  """int32[N, S]: token-id prompts right-padded with `pad_id` to `length` (None: the
  longest), `llama.Llama`'s convention for ragged prompts.

  Raises ValueError when a prompt ends with `pad_id` (it would be read as padding),
  when prompts differ in length and `pad_id` is None, or when one exceeds `length`.
  """
  prompts = [np.asarray(p, np.int64).reshape(-1) for p in prompts]
  if not prompts or any(p.size == 0 for p in prompts):
    raise ValueError("prompts: need at least one prompt, each of at least one token")
  longest = max(p.size for p in prompts)
  length = longest if length is None else length
  if longest > length:
    raise ValueError(f"prompts: a prompt of {longest} tokens exceeds length {length}")
  if pad_id is None and any(p.size != length for p in prompts):
    raise ValueError("prompts: of different lengths, but there is no pad_id")
  out = np.full((len(prompts), length), 0 if pad_id is None else pad_id, np.int32)
  for i, p in enumerate(prompts):
    if pad_id is not None and p[-1] == pad_id:
      raise ValueError(f"prompts: prompt {i} ends with pad_id={pad_id}, which would be "
                       "read as padding")
    out[i, :p.size] = p
  return out


def verify_costs(target, draft, inputs: jax.Array, chunks: Any, max_length: int,
                 repeats: int = 3, steps: int = 16, rounds: int = 3) -> dict[str, Any]:
  """`step_costs` for several verification chunk lengths at once.

  t_p(k) for every k in `chunks` (and k = 1), and t_q, each one `extend` on a cache
  primed by `init`, timed inside a compiled loop (`extend_seconds`); the minimum over
  `rounds` x `repeats`, all of them measured in turn in each round.

  Returns:
    {"t_p1": s, "t_q": s, "t_p": {k: s}, "c": t_q / t_p1, "v": {k: t_p(k) / t_p1}}
    with integer keys k (v[1] = 1); a sweep at gamma reads v[gamma + 1].
  """
  ks = sorted({1, *(int(k) for k in chunks)})
  if ks[0] < 1:
    raise ValueError(f"chunks must be positive ints, got {chunks!r}")
  start = target.start_tokens(inputs)[:, None]
  target_state, draft, draft_state = _primed(target, draft, inputs, max_length)
  calls = {k: (target, target_state, jnp.tile(start, (1, k))) for k in ks}
  calls["q"] = (draft, draft_state, start)
  best = {name: float("inf") for name in calls}
  for _ in range(rounds):
    for name, (model, state, tokens) in calls.items():
      best[name] = min(best[name], extend_seconds(model, state, tokens, repeats, steps,
                                                  reduce=np.min))
  t_p = {k: best[k] for k in ks}
  return dict(t_p1=t_p[1], t_q=best["q"], t_p=t_p, c=best["q"] / t_p[1],
              v={k: t / t_p[1] for k, t in t_p.items()})


@jax.jit
def _teacher_forced_logits(model, inputs, start, tokens):
  chunk = jnp.concatenate([start[:, None], tokens[:, :-1]], axis=1)
  logits, _ = model.extend(model.init(inputs, tokens.shape[1]), chunk)
  return logits.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("sampling",))
def _betas_of_logits(p_logits, q_logits, sampling):
  return jnp.sum(jnp.minimum(probabilities(p_logits, sampling),
                             probabilities(q_logits, sampling)), axis=-1)


def teacher_forced_alpha(target, drafts: dict[str, Any], inputs: jax.Array,
                         tokens: jax.Array, lengths: jax.Array,
                         sampling: SamplingConfig) -> dict[str, list[np.ndarray]]:
  """`teacher_forced_betas` for several drafts along the same target outputs, the
  target's pass shared: each model's logits come from one `extend` over the outputs
  (compiled once per model and shape, whatever `sampling`), then beta = sum_x min(p(x),
  q(x)) with `sampling`'s adjustments on both. Every model is fed the target's start
  tokens, as in `teacher_forced_betas`.

  Returns:
    {draft name: one float array per row, of its length}.
  """
  start = target.start_tokens(inputs)
  p_logits = _teacher_forced_logits(target, inputs, start, tokens)
  lengths = np.asarray(lengths)
  out = {}
  for name, draft in drafts.items():
    q_logits = _teacher_forced_logits(draft, inputs, start, tokens)
    betas = np.asarray(_betas_of_logits(p_logits, q_logits, sampling=sampling))
    out[name] = [betas[b, :lengths[b]] for b in range(betas.shape[0])]
  return out


@functools.partial(jax.jit, static_argnums=0)
def _stream_all(transposed: tuple[bool, ...], weights: tuple[jax.Array, ...],
                x: jax.Array) -> jax.Array:
  total = jnp.zeros((), jnp.float32)
  for w, t in zip(weights, transposed):
    v = jnp.resize(x, (w.shape[1] if t else w.shape[0],))
    y = w @ v if t else v @ w
    total = total + y[0]
  return total


def weight_stream_seconds(matrices: dict[str, tuple[jax.Array, bool]],
                          repeats: int = 5) -> tuple[float, int]:
  """The roofline a decode step is held to: (seconds, bytes) of one matrix-vector
  product through each of `matrices` ({name: (w, transposed)}: w [in, out], or
  [out, in] when transposed, such as a tied embedding), all in one compiled
  program, minimum over `repeats`.

  XLA's matrix-vector path streams a matrix at about the machine's memory bandwidth,
  so this is what reading a step's weights once costs here, with no attention,
  norms or cache work: a one-token step can approach it from above, and verifying k
  tokens for v(k) ~ 1 means staying near it.
  """
  transposed = tuple(t for _, t in matrices.values())
  weights = tuple(w for w, _ in matrices.values())
  nbytes = sum(int(w.size) * w.dtype.itemsize for w in weights)
  x = jnp.ones((8,), jnp.float32)
  jax.block_until_ready(_stream_all(transposed, weights, x))
  return min_seconds(lambda: _stream_all(transposed, weights, x), repeats), nbytes
