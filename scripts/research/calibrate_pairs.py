"""Measures each shipped pair's step costs (c, v(k)) for AutoGamma and stores them.

    python scripts/research/calibrate_pairs.py [--pairs=...] [--batches=1,2,4,8,16]
        [--temperatures=0,1] [--rounds=2]

Writes `specdec/weights/<pair>/costs.json`: {draft: {temperature: {batch: StepCosts}}},
each measured by `specdec.adaptive.calibrate` (compiled-loop timings of one target step,
one verification call per gamma + 1 of `AutoGamma`'s set and one draft step; and one
iteration of the AutoGamma decode loop forced to each gamma, beside the baseline
decode, greedy or sampled at the temperature) on the pair's first held-out prompts.
Run it on a quiet machine: a loaded one reads high. Each (pair, draft, batch size,
temperature) runs in a process of its own: one process
compiling every batch size's loops exceeds Linux's default limit on memory mappings
(vm.max_map_count 65530), and LLVM then fails with "Cannot allocate memory".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import jax.numpy as jnp

from specdec import adaptive, pretrained
from specdec.bench import workloads
from specdec.distributions import SamplingConfig

# {pair: {draft: batch sizes}}: the batch table's draft at every batch size.
DRAFTS = {
  "smollm2_135m_instruct": {"draft+lookup": (1, 2, 4, 8, 16), "draft": (1,)},
  "multi30k_ende": {"draft_distilled": (1,), "draft": (1,)},
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", default=",".join(DRAFTS))
  parser.add_argument(
    "--batches", default="", help="Only these batch sizes (comma-separated; default: all)."
  )
  parser.add_argument(
    "--drafts", default="", help="Only these drafts (comma-separated; default: all)."
  )
  parser.add_argument(
    "--temperatures",
    default="0,1",
    help="Sampling temperatures to time the loop at (comma-separated).",
  )
  parser.add_argument(
    "--rounds",
    type=int,
    default=2,
    help="Interleaved timing rounds (the minimum counts); more read steadier on a noisy machine.",
  )
  parser.add_argument(
    "--max_length",
    type=int,
    default=48,
    help="Cache length; the loop decodes max_length - 9 tokens.",
  )
  args = parser.parse_args()
  temperatures = [float(t) for t in args.temperatures.split(",")]
  jobs = [
    (pair, draft, batch, t)
    for pair in args.pairs.split(",")
    for draft, batches in DRAFTS[pair].items()
    if not args.drafts or draft in args.drafts.split(",")
    for batch in batches
    if not args.batches or str(batch) in args.batches.split(",")
    for t in temperatures
  ]
  if len(jobs) > 1:
    for pair, draft, batch, t in jobs:
      subprocess.run(
        [
          sys.executable,
          __file__,
          f"--pairs={pair}",
          f"--drafts={draft}",
          f"--batches={batch}",
          f"--temperatures={t}",
          f"--max_length={args.max_length}",
          f"--rounds={args.rounds}",
        ],
        check=True,
      )
    return
  for pair in args.pairs.split(","):
    path = pretrained.pair_dir(pair) / "costs.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    for draft, batches in DRAFTS[pair].items():
      if args.drafts and draft not in args.drafts.split(","):
        continue
      if args.batches:
        batches = tuple(b for b in batches if str(b) in args.batches.split(","))
      if not batches:
        continue
      w = workloads.load(pair, max(batches), draft=draft)
      for batch in batches:
        for t in temperatures:
          costs = adaptive.calibrate(
            w.target,
            w.drafts[draft],
            jnp.asarray(w.inputs[:batch]),
            max_length=args.max_length,
            repeats=2,
            steps=8,
            rounds=args.rounds,
            sampling=SamplingConfig(temperature=t),
          )
          table.setdefault(draft, {}).setdefault(str(t), {})[str(batch)] = json.loads(
            costs.to_json()
          )
          print(pair, draft, batch, t, costs.c, dict(costs.v), dict(costs.iteration), flush=True)
        path.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
  main()
