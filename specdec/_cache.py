"""Where specdec keeps what it builds once per machine: the CPU kernel's library
(`specdec.backends.cpu`) and, for the command line, JAX's compiled programs
(`specdec.bench.compile_cache`).

`$SPECDEC_CACHE_DIR` when set, else `$XDG_CACHE_HOME/specdec`, else `~/.cache/specdec`;
never inside the checkout. `SPECDEC_CACHE_DIR=off` (or `0`, `false`, `no`, `none`, or
empty) keeps nothing on disk across runs.
"""

from __future__ import annotations

from collections.abc import Mapping
import os
import pathlib

ENV_VAR = "SPECDEC_CACHE_DIR"
OFF_VALUES = ("", "0", "off", "false", "no", "none")


def cache_root(environ: Mapping[str, str] | None = None) -> pathlib.Path | None:
  """specdec's cache directory under `environ` (default `os.environ`), absolute, or
  None when SPECDEC_CACHE_DIR turns caching off. A relative XDG_CACHE_HOME is ignored,
  as the XDG specification says."""
  environ = os.environ if environ is None else environ
  if ENV_VAR in environ:
    value = environ[ENV_VAR].strip()
    if value.lower() in OFF_VALUES:
      return None
    return pathlib.Path(value).expanduser().absolute()
  base = environ.get("XDG_CACHE_HOME", "").strip()
  if base and os.path.isabs(base):
    return pathlib.Path(base) / "specdec"
  home = environ.get("HOME") or str(pathlib.Path.home())
  return pathlib.Path(home) / ".cache" / "specdec"
