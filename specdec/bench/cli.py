"""Command-line options from a subcommand's `Config` dataclass, and its outputs.

Every subcommand declares its settings once, as a frozen dataclass whose fields have
defaults and a `help` in their metadata; `add_arguments` turns each field into an
option of that subcommand's own parser (`gamma_max` -> `--gamma-max`), so that two
subcommands may share option names (argparse subparsers, one namespace each) and the
tests build the same `Config` directly. Tuples are comma-separated lists
(`--gammas=1,2,4`); booleans take `--name` / `--no-name`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import types
import typing
from typing import Any

from specdec import _optional
from specdec._checks import check_positive_int


def field(default: Any, help: str) -> Any:
  """A Config field with its default and its one-line help."""
  return dataclasses.field(default=default, metadata={"help": help})


def _parts(annotation: Any) -> tuple[Any, bool]:
  """(the type without None, whether None is allowed)."""
  origin = typing.get_origin(annotation)
  if origin in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0], len(args) < len(typing.get_args(annotation))
  return annotation, False


def _parser_of(kind: Any, name: str):
  if typing.get_origin(kind) is tuple:
    item = typing.get_args(kind)[0]

    def parse_list(text: str):
      try:
        return tuple(item(x) for x in text.split(",") if x.strip())
      except ValueError:
        raise argparse.ArgumentTypeError(
          f"--{name}: {text!r} is not a comma-separated list of {item.__name__}"
        ) from None

    return parse_list
  return kind


def add_arguments(parser: argparse.ArgumentParser, config_cls: type) -> None:
  """One option per field of the dataclass `config_cls`."""
  hints = typing.get_type_hints(config_cls)
  for f in dataclasses.fields(config_cls):
    kind, optional = _parts(hints[f.name])
    flag = "--" + f.name.replace("_", "-")
    text = f.metadata.get("help", "")
    default = f.default
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    if kind is bool:
      parser.add_argument(
        flag,
        dest=f.name,
        default=default,
        action=argparse.BooleanOptionalAction,
        help=f"{text} (default: {shown})",
      )
      continue
    convert = _parser_of(kind, f.name.replace("_", "-"))
    if optional:
      inner = convert
      convert = lambda text, inner=inner: None if text.lower() == "none" else inner(text)
    parser.add_argument(
      flag,
      dest=f.name,
      default=default,
      type=convert,
      metavar=f.name.upper(),
      help=f"{text} (default: {shown})",
    )


def config_from_args(config_cls: type, args: argparse.Namespace) -> Any:
  """The `config_cls` instance that the parsed options describe."""
  return config_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls)})


def check_positive(config: Any, *names: str) -> None:
  """Raises naming the first of `names` (a field, or a tuple field with every item
  checked) that is not an int >= 1 (the samplers' own check, `check_positive_int`)."""
  for name in names:
    value = getattr(config, name)
    values = value if isinstance(value, tuple) else (value,)
    if not values:
      raise ValueError(f"{name} must be >= 1, got {value!r}")
    for v in values:
      check_positive_int(name, v)


def progress_bar(**kwargs: Any) -> Any:
  """A tqdm progress bar (the command line's; tqdm comes with specdec[bench])."""
  return _optional.require("tqdm", "bench", purpose="the progress bar").tqdm(**kwargs)


def write_json(path: str, value: Any, indent: int = 2) -> None:
  """Writes a subcommand's result to `path` (its folder made) and says so."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(value, f, indent=indent, default=_jsonable)
  print(f"wrote {path}")


def _jsonable(value: Any) -> Any:
  # numpy scalars and arrays that a result may still hold.
  if hasattr(value, "tolist"):
    return value.tolist()
  raise TypeError(f"not JSON-serializable: {type(value).__name__}")
