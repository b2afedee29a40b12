"""Programs for accelerators, built on this CPU: `jax.export` of both samplers for TPU and
GPU, with models packed for the CPU kernel (`specdec.backends.cpu`).

The library is for TPUs, and nothing in CI has one: these tests lower the decodes a
user would compile there, from models loaded as `specdec.pretrained` loads them on a
CPU (their weights packed for the kernel), and read the programs. The models are
arguments of the exported function, not constants closed over, as in a served
program. A program for a TPU or a GPU must hold no CPU custom call (the kernel is
chosen per lowering platform), no host callback, and Algorithm 1's loop structure:
one decode `while` whose body holds the draft's loop (the gamma draft steps); the
baseline decode is one `while` with no loop inside.
"""

import collections
import functools
import re

from helpers import first_in_default
import jax
from jax import export

# The MLIR parser with StableHLO's dialects registered, as jax.export itself uses it.
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib.mlir import ir
import jax.numpy as jnp
import numpy as np
import pytest

import specdec
from specdec import pretrained
from specdec.backends import cpu
from specdec.models import llama

PLATFORMS = ("tpu", "cuda")
TEMPERATURES = (0.0, 1.0)
FAMILIES = ("t5", "llama")
GAMMA = 4
MAX_NEW_TOKENS = 8
# Custom calls XLA's own SPMD partitioner emits on every platform; nothing else may
# appear in a program for an accelerator.
XLA_CUSTOM_CALLS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"})
KERNEL_TARGETS = frozenset(name for name, _ in cpu.ALL_TARGETS)


@functools.cache
def _pair(family):
  """(target, draft, inputs int32[2, 6]) packed as `specdec.pretrained` packs on a CPU.

  T5: the shipped Multi30k pair itself. Llama: small random models (the shipped
  SmolLM2 pair is 540 MB to load and pack), a float32 target packed in float32 and a
  draft with bfloat16-exact weights and a tied output layer packed in bfloat16, the
  two kinds `load_pair('smollm2_135m_instruct')` holds.
  """
  if family == "t5":
    target, draft, _ = pretrained.load_pair("multi30k_ende")
    inputs = np.full((2, 6), 5, np.int32)
  else:
    target_cfg = llama.tiny_config(vocab_size=96)
    draft_cfg = llama.tiny_config(
      vocab_size=96,
      hidden_size=16,
      num_layers=1,
      num_heads=2,
      num_kv_heads=1,
      tie_word_embeddings=True,
    )
    target = llama.Llama(target_cfg, llama.random_params(target_cfg, 0))
    rounded = jax.tree.map(
      lambda w: w.astype(jnp.bfloat16).astype(np.float32), llama.random_params(draft_cfg, 1)
    )
    draft = llama.Llama(draft_cfg, rounded)
    target, draft = target.with_packed_weights(), draft.with_packed_weights()
    inputs = np.array([[3, 4, 5, 6, 7, 8], [3, 4, 5, 0, 0, 0]], np.int32)
  # A shipped T5 draft is a T5 under an output shortlist (`OutputShortlist.inner`).
  assert target.packed is not None and getattr(draft, "inner", draft).packed is not None, (
    "the models should be packed for the CPU kernel here (test_kernels checks that "
    "it builds): packed models are what these tests are about"
  )
  return target, draft, jnp.asarray(inputs)


def _speculative(temperature):
  def decode(target, draft, inputs, rng):
    return specdec.speculative_sample(
      target,
      draft,
      inputs,
      rng,
      gamma=GAMMA,
      max_new_tokens=MAX_NEW_TOKENS,
      sampling=specdec.SamplingConfig(temperature=temperature),
      eos_id=1,
    )

  return decode


def _autoregressive(temperature):
  def decode(target, inputs, rng):
    return specdec.autoregressive_sample(
      target,
      inputs,
      rng,
      max_new_tokens=MAX_NEW_TOKENS,
      sampling=specdec.SamplingConfig(temperature=temperature),
      eos_id=1,
    )

  return decode


def _export(family, sampler, temperature, platform, **kwargs):
  target, draft, inputs = _pair(family)
  rng = jax.random.key(0)
  if sampler == "speculative":
    fn, args = _speculative(temperature), (target, draft, inputs, rng)
  else:
    fn, args = _autoregressive(temperature), (target, inputs, rng)
  return export.export(jax.jit(fn), platforms=[platform], **kwargs)(*args)


def custom_call_targets(text):
  return collections.Counter(re.findall(r"stablehlo\.custom_call @([\w.$-]+)", text))


def loop_forest(text):
  """The program's `stablehlo.while` ops as a forest: [children, ...] per loop, nested
  as they run (calls to private functions followed), from `main`."""
  with jax_mlir.make_ir_context():
    module = ir.Module.parse(text)
    functions = {
      ir.StringAttr(op.attributes["sym_name"]).value: op
      for op in module.body.operations
      if op.operation.name == "func.func"
    }

    def loops(op):
      found = []
      for region in op.regions:
        for block in region.blocks:
          for inner in block.operations:
            name = inner.operation.name
            if name == "stablehlo.while":
              found.append(loops(inner))
            elif name == "func.call":
              callee = ir.FlatSymbolRefAttr(inner.attributes["callee"]).value
              found.extend(loops(functions[callee]))
            else:
              found.extend(loops(inner))
      return found

    return loops(functions["main"])


def _assert_accelerator_program(exported, platform):
  assert exported.platforms == (platform,)
  text = exported.mlir_module()
  targets = custom_call_targets(text)
  assert not KERNEL_TARGETS & set(targets), f"the CPU kernel in a {platform} program"
  assert set(targets) <= XLA_CUSTOM_CALLS, f"custom calls {dict(targets)}"
  assert "callback" not in text.lower(), "a host callback in the program"
  assert not exported.ordered_effects and not exported.unordered_effects


@pytest.mark.parametrize("platform", first_in_default(1, PLATFORMS))
@pytest.mark.parametrize("temperature", first_in_default(1, TEMPERATURES))
@pytest.mark.parametrize("family", FAMILIES)
def test_the_speculative_decode_of_packed_models_lowers_for_an_accelerator(
  family, temperature, platform
):
  exported = _export(family, "speculative", temperature, platform)
  _assert_accelerator_program(exported, platform)
  forest = loop_forest(exported.mlir_module())
  assert len(forest) == 1, f"one decode while at the top, got {forest}"
  (decode_body,) = forest
  assert decode_body, "the decode while should hold the draft loop"
  assert all(not inner for draft_loop in decode_body for inner in draft_loop), (
    f"draft loops hold no loops of their own, got {forest}"
  )


@pytest.mark.parametrize("platform", first_in_default(1, PLATFORMS))
@pytest.mark.parametrize("temperature", first_in_default(1, TEMPERATURES))
@pytest.mark.parametrize("family", FAMILIES)
def test_the_baseline_decode_of_a_packed_model_lowers_for_an_accelerator(
  family, temperature, platform
):
  exported = _export(family, "autoregressive", temperature, platform)
  _assert_accelerator_program(exported, platform)
  assert loop_forest(exported.mlir_module()) == [[]], (
    "one decode while, one target call per token and no loop inside"
  )


@pytest.mark.parametrize("family", FAMILIES)
def test_lowered_for_a_cpu_the_packed_models_still_call_the_kernel(family):
  """The platform switch keeps the kernel where it pays: a CPU program of the same
  decode calls it, in the draft steps and in the verification chunk."""
  checks = [export.DisabledSafetyCheck.custom_call(name) for name in KERNEL_TARGETS]
  exported = _export(family, "speculative", 1.0, "cpu", disabled_checks=checks)
  text = exported.mlir_module()
  assert KERNEL_TARGETS & set(custom_call_targets(text))


def test_a_program_for_an_accelerator_serializes_from_the_models_leaves():
  """What a user ships to a TPU host: the program serialized and read back. The
  model and output classes are not registered with jax.export's serialization, so
  the exported function takes the models' leaves and returns plain arrays."""
  target, draft, inputs = _pair("t5")
  leaves, treedef = jax.tree.flatten((target, draft))

  def decode(leaves, inputs, rng):
    out = _speculative(1.0)(*jax.tree.unflatten(treedef, leaves), inputs, rng)
    return out.tokens, out.lengths

  exported = export.export(jax.jit(decode), platforms=["tpu"])(leaves, inputs, jax.random.key(0))
  back = export.deserialize(exported.serialize())
  assert back.platforms == ("tpu",)
  assert [a.shape for a in back.out_avals] == [(2, MAX_NEW_TOKENS), (2,)]
  assert back.mlir_module() == exported.mlir_module()
