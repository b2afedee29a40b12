"""Tests of specdec.backends.cpu: the packed
small-row product against numpy and XLA, and its choice per lowering platform."""

from helpers import first_in_default
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.backends import cpu


def _numpy_product(x, w):
  return (np.asarray(x, np.float64) @ np.asarray(w, np.float64)).astype(np.float32)


def test_the_kernel_is_built_and_enabled_on_this_cpu():
  assert cpu.enabled(), "the CPU kernel should build here (g++ is on the machine)"
  assert cpu.library_path().is_file()


def _cpu_flags() -> set[str]:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def test_the_kernels_vectors_and_row_blocks_are_this_cpus():
  # A pass's accumulators must fit the vector registers: 16-float vectors on an
  # AVX2-only CPU were lowered through the stack and cost 4x XLA's product.
  flags = _cpu_flags()
  if not flags:
    pytest.skip("no /proc/cpuinfo flags to read the ISA from")
  want = (16, 8) if "avx512f" in flags else (8, 3) if "avx" in flags else (4, 1)
  assert cpu.kernel_shape() == want


def test_a_rows_product_does_not_depend_on_the_other_rows():
  # Rows are computed in blocks (cpu.kernel_shape()[1] per pass); each row's sums run
  # in the same order in any block, so a row's product is bit-identical alone.
  rng = np.random.default_rng(3)
  w = rng.standard_normal((300, 70)).astype(np.float32)
  x = jnp.asarray(rng.standard_normal((16, 300)).astype(np.float32))
  packed = cpu.pack(w)

  @jax.jit
  def products(x, packed):  # one program: each row alone, and every prefix of rows
    alone = [cpu.packed_matmul(x[i : i + 1], packed, 70) for i in range(16)]
    return jnp.concatenate(alone), [cpu.packed_matmul(x[:r], packed, 70) for r in range(1, 17)]

  alone, prefixes = products(x, packed)
  for rows, together in enumerate(prefixes, start=1):
    np.testing.assert_array_equal(np.asarray(together), np.asarray(alone)[:rows])


def test_pack_is_tile_major_and_zero_padded():
  w = np.arange(5 * 70, dtype=np.float32).reshape(5, 70)
  packed = np.asarray(cpu.pack(w))
  assert packed.shape == (3, 5, cpu.TILE)
  np.testing.assert_array_equal(packed[1, :, :], w[:, 32:64])
  np.testing.assert_array_equal(packed[2, :, :6], w[:, 64:])
  np.testing.assert_array_equal(packed[2, :, 6:], 0)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 13, 16])
@pytest.mark.parametrize(
  "k,n", first_in_default(3, [(576, 1536), (64, 33), (17, 32), (1536, 576), (576, 49152)])
)
def test_packed_matmul_equals_the_float64_product(rows, k, n):
  rng = np.random.default_rng(rows * 1000 + n)
  x = rng.standard_normal((rows, k), np.float32)
  w = rng.standard_normal((k, n), np.float32)
  assert cpu.use_kernel(jnp.asarray(x), cpu.pack(w))
  y = np.asarray(jax.jit(cpu.packed_matmul, static_argnums=2)(x, cpu.pack(w), n))
  expected = _numpy_product(x, w)
  # float32 sums of k terms of size ~1: errors ~ sqrt(k) * 2^-24 * |terms|.
  np.testing.assert_allclose(y, expected, rtol=0, atol=1e-5 * np.sqrt(k))


def test_leading_axes_and_the_xla_path_agree_with_the_kernel(monkeypatch):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 3, 96), np.float32)
  w = rng.standard_normal((96, 200), np.float32)
  packed = cpu.pack(w)
  with_kernel = np.asarray(jax.jit(cpu.packed_matmul, static_argnums=2)(x, packed, 200))
  monkeypatch.setenv(cpu.ENV_SWITCH, "0")
  assert not cpu.use_kernel(jnp.asarray(x), packed)
  without = np.asarray(jax.jit(cpu.packed_matmul, static_argnums=2)(x, packed, 200))
  assert with_kernel.shape == without.shape == (2, 3, 200)
  np.testing.assert_allclose(with_kernel, without, rtol=0, atol=1e-4)
  np.testing.assert_allclose(
    with_kernel, _numpy_product(x.reshape(6, 96), w).reshape(2, 3, 200), rtol=0, atol=1e-4
  )


def test_more_rows_than_max_rows_use_xla():
  x = jnp.ones((cpu.MAX_ROWS + 1, 8), jnp.float32)
  assert not cpu.use_kernel(x, cpu.pack(jnp.ones((8, 8), jnp.float32)))
  assert not cpu.use_kernel(x[:2].astype(jnp.bfloat16), cpu.pack(jnp.ones((8, 8), jnp.float32)))


def test_the_kernel_is_in_the_compiled_program():
  x = jnp.ones((4, 64), jnp.float32)
  packed = cpu.pack(jnp.ones((64, 64), jnp.float32))
  hlo = jax.jit(cpu.packed_matmul, static_argnums=2).lower(x, packed, 64).as_text()
  assert "specdec_packed_matmul" in hlo


def test_derivatives_go_through_xla_and_match_the_dense_product():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((3, 40), np.float32))
  w = jnp.asarray(rng.standard_normal((40, 50), np.float32))

  def loss_packed(x, w):
    return jnp.sum(jnp.sin(cpu.packed_matmul(x, cpu.pack(w), 50)))

  def loss_dense(x, w):
    return jnp.sum(jnp.sin(x @ w))

  got = jax.grad(loss_packed, argnums=(0, 1))(x, w)
  want = jax.grad(loss_dense, argnums=(0, 1))(x, w)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_vmap_over_the_kernel():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((3, 2, 40), np.float32)
  w = rng.standard_normal((40, 70), np.float32)
  y = jax.vmap(lambda r: cpu.packed_matmul(r, cpu.pack(w), 70))(x)
  np.testing.assert_allclose(y, np.einsum("bmk,kn->bmn", x, w), rtol=1e-5, atol=1e-4)


def test_bad_arguments_name_what_is_wrong():
  packed = cpu.pack(jnp.ones((8, 40), jnp.float32))
  with pytest.raises(ValueError, match="n=100"):
    cpu.packed_matmul(jnp.ones((1, 8)), packed, 100)
  with pytest.raises(ValueError, match="n=8"):
    cpu.packed_matmul(jnp.ones((1, 8)), packed, 8)
  with pytest.raises(ValueError, match="features"):
    cpu.packed_matmul(jnp.ones((1, 9)), packed, 40)


def test_a_failed_build_raises_with_the_compiler_output(tmp_path, monkeypatch):
  monkeypatch.setattr(cpu, "SOURCES", (tmp_path / "broken.cc",))
  (tmp_path / "broken.cc").write_text("this is not C++")
  with pytest.raises(RuntimeError, match=r"broken.cc"):
    cpu.build(tmp_path / "out.so")
  assert not (tmp_path / "out.so").exists()


# --------------------------------------------- weights stored in bfloat16, read in half


def _bfloat16_exact(shape, seed):
  w = np.random.default_rng(seed).standard_normal(shape, np.float32)
  return np.asarray(jnp.asarray(w).astype(jnp.bfloat16).astype(jnp.float32))


def test_exactly_bfloat16_is_a_bit_test():
  assert cpu.exactly_bfloat16(_bfloat16_exact((8, 8), 0), jnp.zeros(3))
  assert not cpu.exactly_bfloat16(jnp.float32(1 / 3))
  assert not cpu.exactly_bfloat16(_bfloat16_exact((8, 8), 0), jnp.float32(1 / 3))
  # Subnormals: 2^-130 has one bit in the high half (exact), 1e-40's low bits are set.
  assert cpu.exactly_bfloat16(jnp.float32(2.0**-130), jnp.float32(-0.0))
  assert not cpu.exactly_bfloat16(jnp.float32(1e-40))


def test_bfloat16_pack_holds_the_same_values_in_half_the_bytes():
  w = _bfloat16_exact((5, 70), 1)
  half = cpu.pack(w, jnp.bfloat16)
  assert half.dtype == jnp.bfloat16 and half.nbytes * 2 == cpu.pack(w).nbytes
  np.testing.assert_array_equal(np.asarray(half, np.float32), np.asarray(cpu.pack(w)))
  with pytest.raises(ValueError, match="float16"):
    cpu.pack(w, jnp.float16)


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("k,n", first_in_default(2, [(384, 1152), (64, 33), (576, 49152)]))
def test_bfloat16_packed_product_is_the_float32_kernels_bit_for_bit(rows, k, n):
  """Each bfloat16 weight widens to its float32 value and the sums run in the same
  order, so the half-size copy changes no bit of the product (rows crossing a block of
  8, a partial tile, the SmolLM2 output layer's width)."""
  w = _bfloat16_exact((k, n), rows + n)
  x = np.random.default_rng(rows).standard_normal((rows, k), np.float32)
  product = jax.jit(cpu.packed_matmul, static_argnums=2)
  half = cpu.pack(w, jnp.bfloat16)
  assert cpu.use_kernel(jnp.asarray(x), half)
  got = np.asarray(product(x, half, n))
  np.testing.assert_array_equal(got, np.asarray(product(x, cpu.pack(w), n)))
  np.testing.assert_allclose(got, _numpy_product(x, w), rtol=0, atol=1e-5 * np.sqrt(k))
  hlo = product.lower(jnp.asarray(x), half, n).as_text()
  assert "specdec_packed_matmul_bf16" in hlo


def test_bfloat16_packs_on_the_xla_path_and_under_grad(monkeypatch):
  w = _bfloat16_exact((40, 50), 2)
  x = jnp.asarray(np.random.default_rng(3).standard_normal((3, 40), np.float32))
  half = cpu.pack(w, jnp.bfloat16)
  with_kernel = np.asarray(cpu.packed_matmul(x, half, 50))
  grad = jax.grad(lambda x: jnp.sum(cpu.packed_matmul(x, half, 50) ** 2))(x)
  np.testing.assert_allclose(grad, 2 * with_kernel @ np.asarray(w).T, rtol=1e-5, atol=1e-5)
  monkeypatch.setenv(cpu.ENV_SWITCH, "0")
  assert not cpu.use_kernel(x, half)
  np.testing.assert_allclose(
    np.asarray(cpu.packed_matmul(x, half, 50)), with_kernel, rtol=0, atol=1e-5
  )


def test_pack_tree_chooses_bfloat16_only_where_it_is_exact():
  exact = {
    "a/kernel": (_bfloat16_exact((16, 40), 4), False),
    "b/embedding": (_bfloat16_exact((50, 16), 5), True),
  }
  packed = cpu.pack_tree(exact)
  assert packed["a"]["kernel"].dtype == jnp.bfloat16
  assert packed["b"]["embedding"].shape == (2, 16, cpu.TILE)
  forced = cpu.pack_tree(exact, jnp.float32)
  assert forced["a"]["kernel"].dtype == jnp.float32
  inexact = dict(exact, c=(np.full((16, 8), 1 / 3, np.float32), False))
  assert cpu.pack_tree(inexact)["a"]["kernel"].dtype == jnp.float32
  with pytest.raises(ValueError, match="not all exactly bfloat16"):
    cpu.pack_tree(inexact, jnp.bfloat16)


# ------------------------------------------------- the kernel per lowering platform


def _exported_text(fn, platform, *args):
  checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name, _ in cpu.ALL_TARGETS]
  return jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=checks)(
    *args
  ).mlir_module()


def test_the_kernel_is_chosen_per_lowering_platform():
  """Lowered for a CPU the product is the kernel; for a TPU or a GPU it is `elsewhere`,
  here XLA's product over the unpacked w [64, 80] (the packed copy is not read)."""
  x = jnp.ones((4, 64), jnp.float32)
  w = jnp.ones((64, 80), jnp.float32)
  packed = cpu.pack(w)

  def product(x, packed, w):
    return cpu.packed_matmul(x, packed, 80, lambda x: x @ w)

  assert cpu.use_kernel(x, packed)
  assert "specdec_packed_matmul" in _exported_text(product, "cpu", x, packed, w)
  for platform in ("tpu", "cuda"):
    text = _exported_text(product, platform, x, packed, w)
    assert "custom_call" not in text
    assert "tensor<64x80xf32>) -> tensor<4x80xf32>" in text


def test_the_compiled_cpu_program_is_the_kernel_alone():
  """The platform choice costs the CPU nothing: its compiled program calls the kernel
  and holds no conditional."""
  x = jnp.ones((4, 64), jnp.float32)
  w = jnp.ones((64, 80), jnp.float32)
  hlo = (
    jax.jit(lambda x, packed, w: cpu.packed_matmul(x, packed, 80, lambda x: x @ w))
    .lower(x, cpu.pack(w), w)
    .compile()
    .as_text()
  )
  assert 'custom_call_target="specdec_packed_matmul"' in hlo
  assert " conditional(" not in hlo and " dot(" not in hlo


def test_elsewhere_must_return_the_float32_product():
  x = jnp.ones((2, 8), jnp.float32)
  packed = cpu.pack(jnp.ones((8, 40), jnp.float32))
  with pytest.raises(ValueError, match="elsewhere must return float32 \\(2, 40\\)"):
    cpu.packed_matmul(x, packed, 40, lambda x: jnp.ones((2, 39)))
  with pytest.raises(ValueError, match="elsewhere"):
    jax.jit(lambda x: cpu.packed_matmul(x, packed, 40, lambda x: jnp.ones((2, 40), jnp.bfloat16)))(
      x
    )


# ------------------------------------- the temperature-0 token and its validity flag

_SPECIALS = np.array(
  [np.nan, np.inf, -np.inf, 1e35, -1e35, 1e30, -1e30, 0.0, 3.0, -3e38, 3e38], np.float32
)


def _adversarial_logits(rows, vocab, seed):
  """Small integers (many ties) with NaN, +-inf, values past +-1e30 sprinkled in, and
  rows that are all specials, all -inf, all NaN."""
  rng = np.random.default_rng(seed)
  x = rng.integers(-3, 3, size=(rows, vocab)).astype(np.float32)
  for r in range(rows):
    n = rng.integers(0, vocab // 2 + 2)
    x[r, rng.integers(0, vocab, n)] = rng.choice(_SPECIALS, n)
  x[0] = rng.choice(_SPECIALS, vocab)
  x[1] = -np.inf
  x[2] = np.nan
  x[3, :] = -1e35  # every value finite and below the -1e30 stand-in
  x[3, rng.integers(0, vocab)] = -1e34
  x[4] = -np.inf  # the largest logit is exactly the stand-in, after a -inf
  x[4, vocab - 1] = -1e30
  return x


@pytest.mark.parametrize(
  "vocab", first_in_default(4, [1, 17, 257, 49152, 2, 15, 16, 33, 1000, 32128])
)
def test_greedy_kernel_equals_the_xla_version_on_every_kind_of_input(vocab):
  """The kernel's tokens and flags are the portable XLA version's (the one lowered for
  accelerators), row for row, on ties, NaN, infinities and values beyond +-1e30."""
  from specdec import distributions

  kernel = jax.jit(lambda x: cpu.greedy_checked(x, distributions._greedy_tokens_checked_xla))
  xla = jax.jit(distributions._greedy_tokens_checked_xla)
  for seed in range(3):
    x = _adversarial_logits(8, vocab, seed)
    for shaped in (x, x.reshape(2, 4, vocab)):
      got, want = kernel(shaped), xla(shaped)
      np.testing.assert_array_equal(got[0], want[0])
      np.testing.assert_array_equal(got[1], want[1])
      np.testing.assert_array_equal(got[1], np.asarray(jax.jit(distributions.nonfinite)(shaped)))
    # Each row alone too: the XLA version's token of a row must not depend on
    # whether another row of its batch needs sanitizing.
    for row in range(x.shape[0]):
      got, want = kernel(x[row : row + 1]), xla(x[row : row + 1])
      np.testing.assert_array_equal(got[0], want[0], err_msg=f"row {row}")
      np.testing.assert_array_equal(got[0], kernel(x)[0][row : row + 1])


def test_greedy_kernel_under_vmap_and_in_the_lowered_cpu_program():
  from specdec import distributions

  x = _adversarial_logits(6, 300, 0).reshape(3, 2, 300)
  tokens, bad = jax.vmap(distributions.greedy_tokens_checked)(x)
  want = jax.jit(distributions._greedy_tokens_checked_xla)(x)
  np.testing.assert_array_equal(tokens, want[0])
  np.testing.assert_array_equal(bad, want[1])
  hlo = jax.jit(distributions.greedy_tokens_checked).lower(x).compile().as_text()
  assert 'custom_call_target="specdec_greedy_checked"' in hlo
  assert " conditional(" not in hlo


def test_greedy_kernel_is_chosen_per_lowering_platform():
  """Lowered for a CPU: the kernel; for a TPU or a GPU: the XLA version, no custom call."""
  from specdec import distributions

  x = jnp.ones((3, 32128), jnp.float32)
  assert cpu.use_greedy_kernel(x)
  assert "specdec_greedy_checked" in _exported_text(distributions.greedy_tokens_checked, "cpu", x)
  for platform in ("tpu", "cuda"):
    text = _exported_text(distributions.greedy_tokens_checked, platform, x)
    assert "custom_call" not in text and "specdec_greedy" not in text
