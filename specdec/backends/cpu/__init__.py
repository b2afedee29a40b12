"""The CPU backend: a kernel for the products verification makes, a few rows by large
weights, chosen per lowering platform.

Speculative decoding's premise (Leviathan, Kalman & Matias, ICML 2023, Section 3.4)
is that the target scores gamma + 1 tokens in one call for about the cost of one: v =
t_p(gamma + 1) / t_p(1) near 1. At batch 1 a decoder step is bound by reading its
weights from memory, so that premise holds on a CPU too, provided each [k, in] x
[in, out] product reads its weights once at full bandwidth. XLA:CPU's general matrix
product does not: for 2 <= k <= 8 it streams weights at about half the rate of its
one-row path. `skinny_matmul.cc` keeps the k rows' partial sums in vector registers,
reads the weights once and in order from a tile-major copy (`pack`: a row-major
matrix walked tile by tile is a strided read at half the rate), and splits the tiles
over XLA's intra-op thread pool (an XLA FFI custom call). Measurements:
docs/cpu_kernel.md.

`packed_matmul(x, pack(w), n, elsewhere)` takes the kernel where `use_kernel` says it
applies (float32 x, at most `MAX_ROWS` rows, a single CPU device, the library built)
*and* the program is lowered for a CPU; the choice of platform is made by
`jax.lax.platform_dependent` when the program is lowered, not from the default
backend when it is traced, so a model packed on a CPU still lowers for a TPU or a GPU
(`jax.export` with platforms=['tpu'] or ['cuda'], a program compiled elsewhere):
there the product is `elsewhere(x)`, the caller's XLA product over the unpacked
weights. The models keep both copies (`specdec.models.llama.Llama.packed`,
`specdec.models.t5.T5.packed`) and pass their unpacked product as `elsewhere`, so an
accelerator runs exactly the program of the unpacked model, with its weights in the
layout its compiler chooses, and the packed copy is an unused argument there. The
tile-major layout is not read on accelerators on purpose: a [N / 32, K, 32] array
would cost a transpose per call, or a batched product whose minor dimension of 32 a
TPU pads to its 128 lanes (4x the bytes read). Within one platform the choice adds
nothing: a program lowered for one platform holds that platform's branch alone, and
the compiled CPU program is the kernel's custom call, with no conditional.

Weights that bfloat16 holds exactly (a model stored in bfloat16 and computed in
float32, such as the shipped drafts) pack into bfloat16 (`pack(w, jnp.bfloat16)`;
`exactly_bfloat16` tells): the kernel reads half the bytes and widens each weight to
the same float32 value, so the products are the float32 kernel's, bit for bit. Models
make the packed copy once (`specdec.models.llama.pack_params`). The library is
compiled from the shipped source with the machine's C++ compiler on first use (a few
seconds; cached in specdec's cache, `$SPECDEC_CACHE_DIR` or by default
`$XDG_CACHE_HOME/specdec` or `~/.cache/specdec`, see `cache_dir`); without a
compiler the products fall back to XLA with one warning. `SPECDEC_CPU_KERNELS=0`
turns the kernel off for programs traced afterwards.

Derivatives go through XLA's product (`jax.custom_jvp`), so training code that
happens to take a small product is unaffected.

The same library holds `greedy.cc`: the temperature-0 token (the first argmax of the
sanitized logits) and the validity flag of each row in one pass (`greedy_checked`,
which `specdec.distributions.greedy_tokens_checked` takes on a CPU): at V = 32,128
the XLA version is a dozen thunks per verification, ~0.1 ms on this CPU. Chosen per
lowering platform like the product, and switched off with it.
"""

from __future__ import annotations

from collections.abc import Callable
import ctypes
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Any
import warnings

import jax
import jax.numpy as jnp

from specdec import _cache

Array = jax.Array

_HERE = pathlib.Path(__file__).resolve().parent
# The kernels' sources, compiled into one library.
SOURCES = (_HERE / "skinny_matmul.cc", _HERE / "greedy.cc")
# Rows (tokens x batch) up to which the kernel is used: a verification chunk of
# gamma + 1 <= 16 tokens at batch 1, or a few rows of a small batch. Beyond this the
# product has enough rows for XLA's blocked matrix product to stream well.
MAX_ROWS = 16
ENV_SWITCH = "SPECDEC_CPU_KERNELS"
_TARGETS = {
  "float32": ("specdec_packed_matmul", "SpecdecPackedMatmul"),
  "bfloat16": ("specdec_packed_matmul_bf16", "SpecdecPackedMatmulBf16"),
}
_GREEDY = ("specdec_greedy_checked", "SpecdecGreedyChecked")
# Every FFI target the library registers (none may appear in an accelerator program).
ALL_TARGETS = (*_TARGETS.values(), _GREEDY)
# Columns per tile of the packed layout (`pack`); the kernel's own constant.
TILE = 32
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")


@functools.cache
def _temporary_dir() -> pathlib.Path:
  return pathlib.Path(tempfile.mkdtemp(prefix="specdec-"))


def cache_dir() -> pathlib.Path:
  """Where the compiled library is kept: specdec's cache (`specdec._cache`:
  $SPECDEC_CACHE_DIR, else $XDG_CACHE_HOME/specdec or ~/.cache/specdec), or a
  temporary directory of this process where SPECDEC_CACHE_DIR turns caching off."""
  root = _cache.cache_root()
  return _temporary_dir() if root is None else root


def _compiler() -> str | None:
  return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def library_path() -> pathlib.Path:
  """The cached library's path: keyed by the source, flags and jaxlib's FFI version."""
  key = hashlib.sha256(
    b"".join(source.read_bytes() for source in SOURCES)
    + " ".join(_FLAGS).encode()
    + jax.__version__.encode()
    + sys.platform.encode()
  )
  return cache_dir() / f"skinny_matmul-{key.hexdigest()[:16]}.so"


def build(path: pathlib.Path | None = None) -> pathlib.Path:
  """Compiles `SOURCES` into `path` (default `library_path()`); atomic, so
  concurrent processes never load a half-written file.

  Raises:
    RuntimeError: no C++ compiler, or the compiler failed (its output attached).
  """
  path = pathlib.Path(path or library_path())
  compiler = _compiler()
  if compiler is None:
    raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
  os.close(fd)
  try:
    cmd = [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", tmp]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return path


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
  """The built library (once per machine), or None, with a warning, where it cannot
  be built or loaded."""
  try:
    path = library_path()
    if not path.is_file():
      build(path)
    return ctypes.cdll.LoadLibrary(str(path))
  except (OSError, RuntimeError) as e:
    warnings.warn(
      f"specdec.backends.cpu: the CPU kernels are unavailable ({e}); small "
      "matrix products use XLA's (slower verification on a CPU)",
      RuntimeWarning,
      stacklevel=4,
    )
    return None


@functools.lru_cache(maxsize=1)
def _load() -> bool:
  """Registers the library's FFI targets; False where the library is unavailable."""
  lib = _library()
  if lib is None:
    return False
  for target, symbol in ALL_TARGETS:
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  return True


def kernel_shape() -> tuple[int, int] | None:
  """(floats per vector, rows per pass) of the product kernel as this machine's
  compiler built it (`-march=native`): (16, 8) with AVX-512, (8, 3) with AVX or
  AVX2, (4, 1) otherwise, so that a pass's accumulators fit the vector registers.
  None where the library is unavailable."""
  lib = _library()
  if lib is None:
    return None
  return int(lib.specdec_kernel_vector_floats()), int(lib.specdec_kernel_row_block())


def enabled() -> bool:
  """Whether the kernels are switched on and usable in this process: not turned off by
  SPECDEC_CPU_KERNELS=0, the default backend a single CPU device (a sharded model
  keeps XLA's partitionable products), and the library built and registered."""
  if os.environ.get(ENV_SWITCH, "1") == "0":
    return False
  if jax.default_backend() != "cpu" or jax.device_count() != 1:
    return False
  return _load()


PACKED_DTYPES = ("float32", "bfloat16")


def use_kernel(x: Array, packed: Array) -> bool:
  """Whether `packed_matmul(x, packed, n)` takes the kernel: x float32, the packed
  weights float32 or bfloat16, at most `MAX_ROWS` rows, and `enabled()`. Decided from
  static shapes and dtypes, so it is fixed per trace."""
  rows = 1
  for size in x.shape[:-1]:
    rows *= size
  return (
    x.dtype == jnp.float32
    and jnp.dtype(packed.dtype).name in PACKED_DTYPES
    and 1 <= rows <= MAX_ROWS
    and enabled()
  )


def _low_bits(w: Array) -> Array:
  return jax.lax.bitcast_convert_type(jnp.asarray(w, jnp.float32), jnp.uint32) & 0xFFFF


@jax.jit
def _exact(matrices: Any) -> Any:
  return jax.tree.map(lambda w: jnp.all(_low_bits(w) == 0), matrices)


def exactly_bfloat16(*matrices: Array) -> bool:
  """Whether bfloat16 holds every float32 value of these arrays exactly (the low 16
  bits of each are zero: weights stored in bfloat16 and upcast), so that
  `pack(w, jnp.bfloat16)` keeps the model's numbers. A bit test, not a rounding
  comparison, so subnormals and signed zeros are judged exactly too."""
  return all(bool(ok) for ok in jax.tree.leaves(_exact(list(matrices))))


def pack(w: Array, dtype: Any = jnp.float32) -> Array:
  """The tile-major copy the kernel reads: w [K, N] -> [ceil(N / TILE), K, TILE] of
  `dtype`, tile j holding columns j TILE .. j TILE + TILE - 1 (zero past N), each tile
  contiguous. Made once per model (`specdec.models.llama.pack_params`), not per call.

  dtype: float32, or bfloat16 for weights bfloat16 holds exactly (`exactly_bfloat16`;
    the bfloat16 copy takes the top 16 bits of each float32, so a weight it cannot
    hold would be truncated: callers check first, as `pack_tree` does).
  """
  name = jnp.dtype(dtype).name
  if name not in PACKED_DTYPES:
    raise ValueError(f"dtype {name} cannot be packed; use one of {PACKED_DTYPES}")
  k, n = w.shape
  tiles = -(-n // TILE)
  w = jnp.pad(jnp.asarray(w, jnp.float32), ((0, 0), (0, tiles * TILE - n)))
  w = w.reshape(k, tiles, TILE).transpose(1, 0, 2)
  if name == "bfloat16":
    bits = jax.lax.bitcast_convert_type(w, jnp.uint32) >> 16
    w = jax.lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.bfloat16)
  return w


def unpacked_columns(packed: Array) -> int:
  """The most columns N a packed [tiles, K, TILE] array can hold (tiles * TILE)."""
  return packed.shape[0] * TILE


def _xla_packed(x: Array, packed: Array, n: int) -> Array:
  y = jnp.einsum(
    "...k,jkt->...jt", x, packed.astype(jnp.float32), preferred_element_type=jnp.float32
  )
  return y.reshape(*x.shape[:-1], -1)[..., :n]


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _kernel(x: Array, packed: Array, n: int) -> Array:
  x2 = x.reshape(-1, x.shape[-1])
  target = _TARGETS[jnp.dtype(packed.dtype).name][0]
  y = jax.ffi.ffi_call(
    target, jax.ShapeDtypeStruct((x2.shape[0], n), jnp.float32), vmap_method="sequential"
  )(x2, packed)
  return y.reshape(*x.shape[:-1], n)


@_kernel.defjvp
def _kernel_jvp(n, primals, tangents):
  x, packed = primals
  dx, dpacked = tangents
  return (_kernel(x, packed, n), _xla_packed(dx, packed, n) + _xla_packed(x, dpacked, n))


def packed_matmul(
  x: Array, packed: Array, n: int, elsewhere: Callable[[Array], Array] | None = None
) -> Array:
  """x [..., K] @ w [K, N] -> float32 [..., N], given packed = pack(w) and N.

  The kernel where `use_kernel(x, packed)` and the program is lowered for a CPU;
  `elsewhere(x)` on every other platform and wherever the kernel does not apply.

  Args:
    x: [..., K].
    packed: pack(w), [ceil(N / TILE), K, TILE], float32 or bfloat16.
    n: N, the product's columns.
    elsewhere: x -> float32 [..., N], the same product by other means (a model's
      XLA product over its unpacked w, which accelerators read in their own layout);
      None: XLA's product over the packed layout (the same numbers up to float32
      rounding of the sums' order).
  """
  if not isinstance(n, int) or not (
    packed.ndim == 3
    and packed.shape[2] == TILE
    and unpacked_columns(packed) - TILE < n <= unpacked_columns(packed)
  ):
    raise ValueError(f"n={n!r} does not fit a packed array of shape {packed.shape}")
  if x.shape[-1] != packed.shape[1]:
    raise ValueError(f"x has {x.shape[-1]} features, the packed weights {packed.shape[1]}")
  if elsewhere is None:
    elsewhere = functools.partial(_xla_packed, packed=packed, n=n)
  else:
    # Checked here, not where it runs: eagerly on a CPU it never does.
    got, want = jax.eval_shape(elsewhere, x), (*x.shape[:-1], n)
    if getattr(got, "shape", None) != want or got.dtype != jnp.float32:
      raise ValueError(
        f"elsewhere must return float32 {want} (the product), got "
        f"{getattr(got, 'dtype', None)} {getattr(got, 'shape', got)}"
      )
  if not use_kernel(x, packed):
    return elsewhere(x)
  # Both branches are traced; lowering for one platform keeps only its own.
  return jax.lax.platform_dependent(x, cpu=lambda x: _kernel(x, packed, n), default=elsewhere)


def use_greedy_kernel(logits: Array) -> bool:
  """Whether `greedy_checked(logits, ...)` takes the kernel: float32 logits with at
  least one row and one value, and `enabled()`. Fixed per trace."""
  return logits.dtype == jnp.float32 and logits.ndim >= 1 and logits.size > 0 and enabled()


def _greedy_kernel(logits: Array) -> tuple[Array, Array]:
  flat = logits.reshape(-1, logits.shape[-1])
  rows = flat.shape[0]
  tokens, bad = jax.ffi.ffi_call(
    _GREEDY[0],
    (jax.ShapeDtypeStruct((rows,), jnp.int32), jax.ShapeDtypeStruct((rows,), jnp.bool_)),
    vmap_method="sequential",
  )(flat)
  return tokens.reshape(logits.shape[:-1]), bad.reshape(logits.shape[:-1])


def greedy_checked(
  logits: Array, elsewhere: Callable[[Array], tuple[Array, Array]]
) -> tuple[Array, Array]:
  """(first argmax of the sanitized logits, nonfinite) per row of float32 logits
  [..., V]: `greedy.cc`'s one kernel where `use_greedy_kernel(logits)` and the
  program is lowered for a CPU, `elsewhere(logits)` (the portable XLA version,
  `specdec.distributions.greedy_tokens_checked`'s) on every other platform. The two
  give the same tokens and flags for every input, NaN and infinities included (the
  tests compare them)."""
  if not use_greedy_kernel(logits):
    return elsewhere(logits)
  return jax.lax.platform_dependent(logits, cpu=_greedy_kernel, default=elsewhere)


# The Flax variable collection that holds a model's packed weights, under the same
# module paths as the matrices they copy (`specdec.models.llama.pack_params`,
# `specdec.models.t5.pack_params`).
PACKED = "packed"


def packed_variable(module, name: str) -> Array | None:
  """`module`'s packed copy of its parameter `name`, or None where the model was
  applied without a `packed` collection."""
  if module.has_variable(PACKED, name):
    return module.get_variable(PACKED, name)
  return None


@functools.partial(jax.jit, static_argnums=1)
def _pack_all(matrices: dict[str, Array], dtype: str) -> dict[str, Array]:
  return jax.tree.map(lambda w: pack(w, dtype), matrices)


def pack_tree(matrices: dict[str, tuple[Array, bool]], dtype: Any = None) -> dict:
  """The `packed` collection of {'a/b/kernel': (w, transposed)}: each w [in, out]
  (or [out, in] where transposed, e.g. a tied embedding, packed as its transpose)
  packed by `pack`, nested by the '/'-separated paths. One compiled program.

  dtype: None packs in bfloat16 where bfloat16 holds every matrix exactly
    (`exactly_bfloat16`: a model stored in bfloat16; half the bytes per step, the same
    numbers) and in float32 otherwise; float32 or bfloat16 force one.

  Raises:
    ValueError: dtype bfloat16 for weights it does not hold exactly (the packed copy
      would change the model's numbers).
  """
  from flax import traverse_util

  flat = {name: jnp.asarray(w).T if transposed else w for name, (w, transposed) in matrices.items()}
  name = None if dtype is None else jnp.dtype(dtype).name
  if name in (None, "bfloat16"):
    exact = exactly_bfloat16(*flat.values())
    if name is None:
      name = "bfloat16" if exact else "float32"
    elif not exact:
      raise ValueError(
        "dtype bfloat16: these weights are not all exactly bfloat16 "
        "values; packing them so would change the model's numbers"
      )
  return traverse_util.unflatten_dict(_pack_all(flat, name), sep="/")
