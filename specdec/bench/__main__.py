"""`python -m specdec.bench <subcommand>`: see `specdec.bench` and docs/benchmarks.md."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from specdec.bench import SUBCOMMANDS, cli, compile_cache


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
  """The parser; the options of subcommand `chosen` come from its `Config` (only
  the chosen one's module is imported: compare-hf needs torch)."""
  parser = argparse.ArgumentParser(
    prog="python -m specdec.bench",
    description="Benchmarks of speculative decoding (Leviathan et al., ICML 2023).",
  )
  subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
  for name, (module_name, summary) in SUBCOMMANDS.items():
    sub = subparsers.add_parser(name, help=summary, description=summary)
    sub.set_defaults(module_name=module_name)
    sub.add_argument(
      "--out",
      default=f"out/{name.replace('-', '_')}.json",
      help="JSON output, the Markdown beside it as .md ('' for none)",
    )
    if name == chosen:
      cli.add_arguments(sub, importlib.import_module(module_name).Config)
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  chosen = next((a for a in argv if a in SUBCOMMANDS), None)
  parser = build_parser(chosen)
  args = parser.parse_args(argv)
  module = importlib.import_module(args.module_name)
  logging.getLogger("absl").setLevel(logging.WARNING)
  try:
    config = cli.config_from_args(module.Config, args)
    result = module.run(config)
  except ValueError as e:
    parser.exit(2, f"{parser.prog} {args.subcommand}: error: {e}\n")
  text = module.render(result)
  print(text)
  if args.out:
    cli.write_json(args.out, result)
    with open(args.out.rsplit(".", 1)[0] + ".md", "w") as f:
      f.write(text + "\n")
  return 0


if __name__ == "__main__":
  # The command line keeps compiled programs per user (SPECDEC_CACHE_DIR moves the
  # cache or turns it off); `main` called from Python leaves JAX's settings alone.
  compile_cache.configure()
  sys.exit(main())
