"""`python -m specdec.demo`: the demo, an alias of `python -m specdec.bench demo`
(`specdec.bench.demo`), kept for the name's existing users. Options may be spelled
with underscores as before (`--num_prompts=2` is `--num-prompts=2`)."""

from __future__ import annotations

import sys

from specdec.bench.demo import (Config, encode_inputs, format_table,  # noqa: F401
                                lm_inputs, measured_best_gamma, render, run_lm,
                                save_plot)
from specdec.bench.demo import run_t5 as run  # noqa: F401


def main(argv: list[str] | None = None) -> int:
  from specdec.bench import __main__ as bench  # pylint: disable=g-import-not-at-top
  argv = sys.argv[1:] if argv is None else argv
  options = [a.split("=", 1)[0].replace("_", "-") + a[len(a.split("=", 1)[0]):]
             if a.startswith("--") else a for a in argv]
  return bench.main(["demo", "--out=out/demo.json", *options])


if __name__ == "__main__":
  sys.exit(main())
