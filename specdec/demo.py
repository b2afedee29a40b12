"""The README's main job: speculative sampling on small built-in models.

    python -m specdec.demo [--gamma=4] [--batch=64] [--max_new_tokens=32]

The built-in pair is a toy: a target whose next-token logits depend on the whole
prefix, and a draft that is the same function with perturbed weights, so that it
agrees with the target often but not always. For temperatures 0 and 1 it prints gamma,
the measured acceptance rate alpha (the paper's estimate: mean beta = sum min(p, q)
along the decode), tokens per iteration measured against Equation 1 at that alpha,
and, at temperature 0, whether the output equals the target's own greedy decode.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

import specdec

_GAMMA = flags.DEFINE_integer("gamma", 4, "Draft tokens per iteration.")
_BATCH = flags.DEFINE_integer("batch", 64, "Prompts decoded side by side.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 32, "Tokens generated per prompt.")
_VOCAB = flags.DEFINE_integer("vocab", 64, "Vocabulary of the toy models.")
_NOISE = flags.DEFINE_float("draft_noise", 0.15, "How far the draft's weights stray.")
_JSON = flags.DEFINE_string("json_out", None, "Also write the table here as JSON.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for weights, prompts and sampling.")


def running_mean_logits(tokens, params):
  """Causal logits: a running mean of token embeddings, plus a bigram term."""
  emb = params["emb"][tokens]
  mean = jnp.cumsum(emb, axis=1) / jnp.arange(1, tokens.shape[1] + 1)[None, :, None]
  return 4.0 * jnp.tanh(mean) @ params["out"] + params["bigram"][tokens]


def toy_pair(vocab: int, noise: float, seed: int, dim: int = 16):
  """(target, draft) CausalLMs: the draft's weights are the target's plus noise."""
  keys = jax.random.split(jax.random.key(seed), 6)
  target = dict(emb=jax.random.normal(keys[0], (vocab, dim)),
                out=jax.random.normal(keys[1], (dim, vocab)) / np.sqrt(dim) * 2,
                bigram=jax.random.normal(keys[2], (vocab, vocab)))
  draft = {name: w + noise * jax.random.normal(k, w.shape) * jnp.std(w)
           for (name, w), k in zip(target.items(), keys[3:])}
  return (specdec.CausalLM.from_fn(running_mean_logits, vocab, params=target),
          specdec.CausalLM.from_fn(running_mean_logits, vocab, params=draft))


def run(gamma: int, batch: int, max_new_tokens: int, vocab: int, noise: float,
        seed: int) -> list[dict]:
  target, draft = toy_pair(vocab, noise, seed)
  prompts = jax.random.randint(jax.random.key(seed + 1), (batch, 4), 0, vocab)
  rows = []
  for temperature in (0.0, 1.0):
    sampling = specdec.SamplingConfig(temperature=temperature)
    key = jax.random.key(seed + 2)
    out = specdec.speculative_sample(target, draft, prompts, key, gamma=gamma,
                                     max_new_tokens=max_new_tokens, sampling=sampling)
    stats = out.stats
    alpha = float(stats.beta_sum.sum() / stats.beta_count.sum())
    measured = float((stats.accepted + stats.iterations).sum() / stats.iterations.sum())
    row = dict(temperature=temperature, gamma=gamma, alpha=alpha,
               tokens_per_iteration=measured,
               eq1_tokens_per_iteration=float(specdec.theory.expected_tokens(alpha, gamma)),
               accepted_fraction=float(stats.accepted.sum() / stats.drafted.sum()))
    if temperature == 0.0:
      base = specdec.autoregressive_sample(target, prompts, key,
                                           max_new_tokens=max_new_tokens,
                                           sampling=sampling)
      row["matches_greedy_target"] = bool(jnp.array_equal(out.tokens, base.tokens))
    rows.append(row)
  return rows


def format_table(rows: list[dict]) -> str:
  header = ("temperature", "gamma", "alpha", "tokens/iter", "Eq. 1", "= greedy Mp")
  lines = [" | ".join(header), " | ".join("-" * len(h) for h in header)]
  for r in rows:
    match = {True: "yes", False: "NO"}.get(r.get("matches_greedy_target"), "n/a")
    lines.append(" | ".join([f"{r['temperature']:g}", str(r["gamma"]),
                             f"{r['alpha']:.3f}", f"{r['tokens_per_iteration']:.2f}",
                             f"{r['eq1_tokens_per_iteration']:.2f}", match]))
  return "\n".join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # JAX's backend probing is noise here.
  rows = run(_GAMMA.value, _BATCH.value, _MAX_NEW.value, _VOCAB.value, _NOISE.value,
             _SEED.value)
  print(f"Speculative sampling on the built-in toy pair (vocab {_VOCAB.value}, "
        f"{_BATCH.value} prompts x {_MAX_NEW.value} tokens)\n")
  print(format_table(rows))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(rows, f, indent=2)
  if not rows[0]["matches_greedy_target"]:
    raise SystemExit("temperature 0 output differs from the greedy target")


if __name__ == "__main__":
  app.run(main)
