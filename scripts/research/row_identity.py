"""How often a row's greedy decode is the same alone and beside other prompts.

    python scripts/research/row_identity.py [--pairs=smollm2_135m_instruct,multi30k_ende]
        [--num_prompts=16] [--max_new_tokens=32] [--batches=2,4,8] [--gamma=3]
        [--out=out/row_identity.json]

At temperature 0 a row's tokens are the target's greedy decode of its own prompt
(Leviathan et al. 2023, Section 2.3) -- up to float rounding, and the rounding of a
row's logits can depend on its batch: the prefill runs over the bucket that holds the
batch's longest prompt (`specdec.models.base.bucketed_prefill`), and on a CPU the
packed-weight kernel takes a product only up to `specdec.backends.cpu.MAX_ROWS` rows
(batch x chunk), XLA's product beyond. A near-tie between the top two logits can then
flip. This measures it on the shipped pairs in float32: each of the pair's first
`num_prompts` held-out prompts (`specdec.bench.workloads.load`, one padded shape for
all) is decoded alone (batch 1), then in batches of 2, 4 and 8 of consecutive prompts,
with the baseline (`autoregressive_sample`) and with speculative decoding at a fixed
gamma (`speculative_sample`, the pair's best greedy draft); a row is identical when
its length and tokens are. It prints and writes the rate of identical rows per pair,
decoder and batch size.

Each pair runs in a process of its own (one process compiling every batch size's
loops of both pairs can exceed Linux's default limit on memory mappings).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import json
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec import pretrained
from specdec.bench import workloads
from specdec.distributions import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0)


def decode_rows(decode, inputs: np.ndarray, batch: int) -> list[np.ndarray]:
  """Each row's tokens (up to its length) from `decode(inputs[i:i + batch])` over
  consecutive groups of `batch` rows (the last group may be smaller)."""
  rows = []
  for start in range(0, inputs.shape[0], batch):
    out = decode(jnp.asarray(inputs[start : start + batch]))
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    rows += [tokens[b, : lengths[b]] for b in range(tokens.shape[0])]
  return rows


def identity_rates(
  target: Any,
  draft: Any,
  inputs: np.ndarray,
  eos_id: int,
  batches: Sequence[int],
  max_new_tokens: int,
  gamma: int,
) -> dict[str, dict[str, Any]]:
  """{decoder: {"alone_tokens": rows' lengths, str(batch): {"identical": n, "rows": N,
  "rate": n / N, "differing": [row indices]}}} for the baseline and speculative
  decoding at `gamma`, greedy, each row alone against the same row in `batch`-row
  groups of consecutive prompts."""
  key = jax.random.key(0)
  decoders = {
    "autoregressive": lambda x: specdec.autoregressive_sample(
      target, x, key, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_id=eos_id
    ),
    f"speculative_gamma{gamma}": lambda x: specdec.speculative_sample(
      target,
      draft,
      x,
      key,
      gamma=gamma,
      max_new_tokens=max_new_tokens,
      sampling=GREEDY,
      eos_id=eos_id,
    ),
  }
  report = {}
  for name, decode in decoders.items():
    alone = decode_rows(decode, inputs, 1)
    entry = {"alone_lengths": [int(r.size) for r in alone]}
    for batch in batches:
      rows = decode_rows(decode, inputs, batch)
      differing = [
        i
        for i, (a, b) in enumerate(zip(alone, rows))
        if a.shape != b.shape or not np.array_equal(a, b)
      ]
      entry[str(batch)] = {
        "identical": len(rows) - len(differing),
        "rows": len(rows),
        "rate": (len(rows) - len(differing)) / len(rows),
        "differing": differing,
      }
    report[name] = entry
  return report


def run_pair(
  pair: str, num_prompts: int, batches: Sequence[int], max_new_tokens: int, gamma: int
) -> dict[str, Any]:
  draft = pretrained.best_draft(pair, 0.0)
  work = workloads.load(pair, num_prompts, draft=draft)
  report = identity_rates(
    work.target,
    work.drafts[draft],
    np.asarray(work.inputs),
    work.eos_id,
    batches,
    max_new_tokens,
    gamma,
  )
  return {
    "pair": pair,
    "draft": draft,
    "dtype": "float32",
    "num_prompts": num_prompts,
    "prompt_shape": list(np.asarray(work.inputs).shape),
    "max_new_tokens": max_new_tokens,
    "gamma": gamma,
    "device": jax.devices()[0].device_kind,
    "decoders": report,
  }


def table(results: Sequence[dict[str, Any]], batches: Sequence[int]) -> str:
  lines = [
    "| pair | decoder | " + " | ".join(f"batch {b}" for b in batches) + " |",
    "|---|---|" + "---|" * len(batches),
  ]
  for r in results:
    for name, entry in r["decoders"].items():
      cells = [f"{entry[str(b)]['identical']}/{entry[str(b)]['rows']}" for b in batches]
      lines.append(f"| {r['pair']} | {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", default="smollm2_135m_instruct,multi30k_ende")
  parser.add_argument("--num_prompts", type=int, default=16)
  parser.add_argument("--max_new_tokens", type=int, default=32)
  parser.add_argument("--batches", default="2,4,8")
  parser.add_argument("--gamma", type=int, default=3)
  parser.add_argument("--out", default="", help="Write the results as JSON here.")
  parser.add_argument(
    "--one", action="store_true", help="Run the single pair in this process, print its JSON."
  )
  args = parser.parse_args()
  batches = [int(b) for b in args.batches.split(",")]
  pairs = args.pairs.split(",")
  if args.one:
    print(
      json.dumps(run_pair(pairs[0], args.num_prompts, batches, args.max_new_tokens, args.gamma))
    )
    return
  results = []
  for pair in pairs:
    command = [
      sys.executable,
      __file__,
      "--one",
      f"--pairs={pair}",
      f"--num_prompts={args.num_prompts}",
      f"--batches={args.batches}",
      f"--max_new_tokens={args.max_new_tokens}",
      f"--gamma={args.gamma}",
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    results.append(json.loads(done.stdout.strip().splitlines()[-1]))
  print(table(results, batches))
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
