"""JAX's persistent compilation cache for the command line (`python -m specdec.bench`).

Compiling a decode loop costs seconds to tens of seconds on a CPU, and every run of a
benchmark compiles the same programs again. The command line keeps the compiled
programs on disk, per user, in the `jax` folder of specdec's cache (`specdec._cache`,
beside the CPU kernel's library), so that a second run reads them back:

* by default `$XDG_CACHE_HOME/specdec/jax` (`~/.cache/specdec/jax` when
  XDG_CACHE_HOME is unset), never inside the checkout;
* `SPECDEC_CACHE_DIR=/some/dir` puts it in `/some/dir/jax` instead;
* `SPECDEC_CACHE_DIR=off` (or `0`, `false`, `no`, `none`, or empty) turns it off.

Only the entry points call `configure`; importing `specdec` changes no JAX setting.
Timings are unaffected: every benchmark times programs already compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
import pathlib

import jax

from specdec import _cache

ENV_VAR = _cache.ENV_VAR


def cache_dir(environ: Mapping[str, str] | None = None) -> pathlib.Path | None:
  """The directory `configure` uses under `environ` (default `os.environ`), or None
  when SPECDEC_CACHE_DIR turns caching off."""
  root = _cache.cache_root(environ)
  return None if root is None else root / "jax"


def configure(environ: Mapping[str, str] | None = None) -> pathlib.Path | None:
  """Turns JAX's persistent compilation cache on in `cache_dir(environ)` (made if
  needed) for every program, however quick to compile, or off when SPECDEC_CACHE_DIR
  says so. Returns the directory, or None when off.

  Call it before the first compilation where possible; it also resets JAX's record of
  whether the cache is in use, so that programs compiled after it are cached either
  way."""
  from jax.experimental.compilation_cache import compilation_cache

  path = cache_dir(environ)
  if path is None:
    jax.config.update("jax_enable_compilation_cache", False)
  else:
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    # Every program: the demo compiles dozens of small ones besides its decode loops.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  compilation_cache.reset_cache()
  return path


def current() -> str | None:
  """The persistent cache directory JAX uses now, or None when it uses none."""
  if not jax.config.jax_enable_compilation_cache:
    return None
  return jax.config.jax_compilation_cache_dir or None
