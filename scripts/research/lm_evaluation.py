"""What a distilled draft is worth beside its target: step costs and the speed-up they
predict, the paper's alpha along the target's own decodes, and speculative decodes of
the held-out prompts (alpha-hat, tokens per iteration, greedy identity).

The measurements themselves are the library's (`specdec.costs.step_costs` and
`extend_seconds`, `specdec.bench.alpha.teacher_forced_betas`,
`specdec.theory.walltime_improvement`); this module runs them
over `lm_decodes`' cached batches and gathers what pair.json records.
"""

from __future__ import annotations

from collections.abc import Sequence
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec import pretrained, theory
from specdec.bench.alpha import teacher_forced_betas
from specdec.costs import extend_seconds, step_costs
from specdec.data import lm_prompts
from specdec.models import llama

from common import log
from lm_decodes import GREEDY, SAMPLED
from lm_training import candidate_config


def batch1_inputs(target, tok, prompt: lm_prompts.Prompt) -> jax.Array:
  return jnp.asarray(lm_prompts.right_pad([lm_prompts.encode(tok, prompt.content)], target.pad_id))


def shipped_draft(draft_dir: str, target, tok):
  """The draft in `draft_dir` as `pretrained.load_pair` loads it: float32, the
  tokenizer's pad_id, and packed weights on a CPU (bfloat16 packs for its bfloat16
  values), so that the t_q measured here is the one users get."""
  return pretrained.load_lm_draft(
    draft_dir, target.vocab_size, dtype=jnp.float32, pad_id=tok.pad_id
  ).with_packed_weights()


def time_candidates(
  target, tok, prompt, names: Sequence[str], gamma: int, max_new_tokens: int
) -> dict[str, Any]:
  """t_p1, v and per candidate t_q, c, size and the predicted speed-up at a grid of
  alphas (batch 1, float32, random draft weights)."""
  inputs = batch1_inputs(target, tok, prompt)
  out = {}
  for name in names:
    cfg = candidate_config(name, target.vocab_size)
    draft = llama.Llama(cfg, jax.device_put(llama.random_params(cfg, 0)), pad_id=target.pad_id)
    costs = step_costs(target, draft, inputs, gamma, max_new_tokens + gamma + 1)
    out[name] = dict(
      params=llama.param_count(cfg),
      **costs,
      predicted={
        str(a): round(float(theory.walltime_improvement(a, gamma, costs["c"], costs["v"])), 3)
        for a in (0.6, 0.7, 0.8, 0.9)
      },
    )
    log(f"{name}: {json.dumps(out[name])}")
  return out


def gamma_sweep(
  target,
  inputs,
  t_q: float,
  alphas: dict[str, float],
  max_new_tokens: int,
  gammas: Sequence[int] = tuple(range(1, 9)),
) -> dict[str, Any]:
  """t_p(k) for chunks of k = gamma + 1 tokens at batch 1 (minimum of repeats in a
  compiled loop) and the predicted speed-up E[tokens](alpha, gamma) / (gamma c +
  v(gamma)) at each temperature's alpha."""
  state = target.init(inputs, max_new_tokens + max(gammas) + 1)
  start = target.start_tokens(inputs)[:, None]
  t_p = {
    str(k): extend_seconds(target, state, jnp.tile(start, (1, k)), repeats=3, reduce=np.min)
    for k in [1] + [g + 1 for g in gammas]
  }
  return sweep_predictions(t_p, t_q, alphas)


def sweep_predictions(
  t_p: dict[str, float], t_q: float, alphas: dict[str, float]
) -> dict[str, Any]:
  """Predicted speed-ups by gamma from measured t_p(k) ({str(k): seconds}).

  A chunk of k tokens cannot cost less than a shorter one; on a shared machine a
  quiet spell can make it look so, so v uses the running maximum of t_p over k
  (`t_p_monotone`), the raw times kept beside it."""
  ks = sorted(int(k) for k in t_p)
  monotone = dict(zip(map(str, ks), np.maximum.accumulate([t_p[str(k)] for k in ks])))
  monotone = {k: float(v) for k, v in monotone.items()}
  gammas = [k - 1 for k in ks if k > 1]
  predicted = {
    key: {
      str(g): float(
        theory.walltime_improvement(
          alpha, g, t_q / monotone["1"], monotone[str(g + 1)] / monotone["1"]
        )
      )
      for g in gammas
    }
    for key, alpha in alphas.items()
  }
  return dict(t_p=t_p, t_p_monotone=monotone, predicted=predicted)


def best_gamma(sweep: dict[str, Any]) -> dict[str, int]:
  """The demo's gamma per temperature: the highest predicted speed-up."""
  return {
    k: int(max(sweep["predicted"][k].items(), key=lambda kv: kv[1])[0]) for k in sweep["predicted"]
  }


def corpus_alpha(target, draft, batches, sampling) -> float:
  """The paper's alpha (Section 3.1, E[beta]) over cached decode batches: the mean of
  `bench.alpha.teacher_forced_betas` over every generated position of them."""
  betas = []
  for b in batches:
    betas += teacher_forced_betas(
      target,
      draft,
      jnp.asarray(b["inputs"]),
      jnp.asarray(b["tokens"]),
      jnp.asarray(b["lengths"]),
      sampling,
    )
  return float(np.mean(np.concatenate(betas)))


def speculative_stats(
  target, draft, tok, batches, sampling, gamma: int, max_new_tokens: int, seed: int
) -> dict[str, Any]:
  """Speculative decodes of the cached batches' prompts: pooled alpha-hat, tokens
  per iteration, and (at temperature 0) rows equal to the target's decode."""
  beta_sum = beta_count = accepted = iterations = 0.0
  identical = rows = 0
  for number, b in enumerate(batches):
    out = specdec.speculative_sample(
      target,
      draft,
      jnp.asarray(b["inputs"]),
      jax.random.fold_in(jax.random.key(seed), number),
      gamma=gamma,
      max_new_tokens=max_new_tokens,
      sampling=sampling,
      eos_id=tok.eos_id,
    )
    s = out.stats
    beta_sum += float(np.sum(s.beta_sum))
    beta_count += float(np.sum(s.beta_count))
    accepted += float(np.sum(s.accepted))
    iterations += float(np.sum(s.iterations))
    tokens = np.asarray(out.tokens)
    identical += int(np.sum(np.all(tokens == b["tokens"], axis=1)))
    rows += len(tokens)
  result = dict(
    alpha_hat=beta_sum / max(beta_count, 1),
    tokens_per_iteration=(accepted + iterations) / max(iterations, 1),
    gamma=gamma,
    rows=rows,
  )
  if sampling.temperature == 0:
    result["identical_to_greedy"] = identical
  return result


def lookup_metrics(
  target,
  draft,
  tok,
  eval_t0,
  eval_t1,
  inputs,
  t_p: dict[str, float],
  gamma: int,
  max_new_tokens: int,
  seed: int,
) -> dict[str, Any]:
  """pair.json's "context_lookup": a `lookup.ContextLookup` draft's settings,
  teacher-forced alpha and speculative stats on the held-out decodes, its step cost
  (c at batch 1 on `inputs`), the speed-up predicted by gamma from the target's
  measured `t_p` (`sweep_predictions`) and the best gamma per temperature (which
  `specdec.bench.demo` uses for the "+lookup" draft)."""
  alphas = {
    "0": corpus_alpha(target, draft, eval_t0, GREEDY),
    "1": corpus_alpha(target, draft, eval_t1, SAMPLED),
  }
  log(f"context lookup: teacher-forced alpha {alphas}")
  speculative = {
    "0": speculative_stats(target, draft, tok, eval_t0, GREEDY, gamma, max_new_tokens, seed),
    "1": speculative_stats(target, draft, tok, eval_t1, SAMPLED, gamma, max_new_tokens, seed),
  }
  costs = step_costs(target, draft, inputs, gamma, max_new_tokens + gamma + 1)
  sweep = sweep_predictions(t_p, costs["t_q"], alphas)
  return dict(
    weight=draft.weight,
    min_ngram=draft.min_ngram,
    max_ngram=draft.max_ngram,
    max_new_tokens=max_new_tokens,
    gamma=gamma,
    teacher_forced_alpha=alphas,
    speculative=speculative,
    costs=dict(costs, load_average_1min=os.getloadavg()[0]),
    predicted=sweep["predicted"],
    best_gamma=best_gamma(sweep),
  )
