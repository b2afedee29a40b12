"""`python -m specdec.bench compare-hf`: specdec against a peer implementation,
Hugging Face transformers' assisted generation.

    python -m specdec.bench compare-hf [--gamma=3] [--sentences=16] [--repeats=3]
    python -m specdec.bench compare-hf --pair=smollm2_135m_instruct [--sentences=8]

Speculative decoding (Leviathan, Kalman & Matias, "Fast Inference from Transformers
via Speculative Decoding", ICML 2023) is implemented by `specdec` (JAX, Algorithm 1
compiled into one `lax.while_loop`) and by transformers (PyTorch, "assisted
generation", whose greedy case accepts the draft's tokens up to the first one the
target's argmax disagrees with: Algorithm 1 at temperature 0). This exports
the shipped pair (`specdec.pretrained`) to transformers' `T5ForConditionalGeneration`
with `specdec.io.save_hf` and decodes the same Multi30k test_2016 prompts,
greedily, at batch 1, in float32, on the same CPU, with:

  * hf_baseline: `target.generate(..., do_sample=False, num_beams=1)`;
  * hf_assisted: `target.generate(..., assistant_model=draft)` with the draft's
    `num_assistant_tokens = gamma`, schedule "constant" and
    `assistant_confidence_threshold = 0` (exactly gamma drafts per iteration, as in
    Algorithm 1); hf_assisted_heuristic: the same with transformers' "heuristic"
    schedule (+2 drafts after a fully accepted iteration, -1 otherwise), restarted at
    gamma on every call; hf_assisted_defaults: whatever the installed transformers
    does when nothing is set (recorded in the output);
  * specdec_baseline: `specdec.autoregressive_sample` (greedy, eos_id=1);
  * specdec_speculative: `specdec.speculative_sample` with the same gamma.

For each: ms per generated token (EOS included), the median over --repeats timed
runs of each prompt after one untimed run (warm-up and, for JAX, compilation), summed
over prompts; its speed-up over its own implementation's baseline; target and draft
forward calls; and whether its tokens equal the specdec baseline's on every prompt
(they should: both decode greedily from start token 0 with the same weights). Then
the specdec / transformers ratios: baseline ms/token, speculative / assisted
ms/token, and speed-up over speed-up. torch runs under `torch.inference_mode()` with
`torch.set_num_threads(os.cpu_count())`, the cores XLA's CPU backend uses. Prints the
table and writes it with the JSON (`--out`).

`--pair=smollm2_135m_instruct` runs the same comparison on the decoder-only pair
(`specdec.pretrained.load_pair`: SmolLM2-135M-Instruct and its distilled Llama draft)
on the pair's held-out chat prompts (`pretrained.lm_eval_prompts`, the chat template
applied with the assistant's generation prompt): transformers' `LlamaForCausalLM`
loads the target from the same GGUF file (`pretrained.lm_path`, dequantized by
transformers itself) and the draft from its shipped transformers directory
(`pretrained.lm_draft_path`, checked to hold specdec's draft weights), both float32.
Both implementations stop on the tokenizer's EOS, generate at most --max-new-tokens
with no minimum length (`eos_token_id`, `min_length=0`, `min_new_tokens=None` passed
to `generate`), and continue the same prompt ids: transformers gets them unpadded,
specdec right-padded with the pad id to a multiple of --lm-pad-multiple (its
prefill then covers those few padding positions too). There, two more systems
compare prompt lookup: hf_prompt_lookup (`generate(..., prompt_lookup_num_tokens=
gamma, max_matching_ngram_size=4)`: copies of the context as drafts, no draft model)
and specdec_speculative_lookup (`specdec.drafts.lookup.ContextLookup` around the same
draft, the pair's settings: the copy mixed into the draft's q).
"""

from __future__ import annotations

from collections.abc import Sequence
import contextlib
import dataclasses
import os
import platform
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec import _optional, data, pretrained
from specdec.bench import cli, report
from specdec.costs import median_seconds
from specdec.data.lm_prompts import right_pad
from specdec.distributions import SamplingConfig
from specdec.io.hf import export_hf, llama_params_to_hf, save_hf
from specdec.sample import autoregressive_sample, speculative_sample

torch = _optional.require("torch", "hf", purpose="python -m specdec.bench compare-hf")
transformers = _optional.require("transformers", "hf", purpose="python -m specdec.bench compare-hf")

# The decoder-only pair: its target is transformers-loaded from the same GGUF file.
LM_PAIR = "smollm2_135m_instruct"
DEFAULT_PROMPTS = {"multi30k_ende": 16, LM_PAIR: 8}


@dataclasses.dataclass(frozen=True)
class Config:
  pair: str = cli.field("multi30k_ende", f"A shipped pair: multi30k_ende or {LM_PAIR}.")
  sentences: int | None = cli.field(
    None,
    "Prompts: Multi30k test_2016 sentences "
    f"(default 16), or {LM_PAIR}'s held-out chat "
    "prompts (default 8).",
  )
  gamma: int = cli.field(3, "Draft tokens per iteration (both).")
  max_new_tokens: int = cli.field(48, "Tokens generated at most.")
  input_length: int = cli.field(48, "Encoder length (specdec pads).")
  repeats: int = cli.field(3, "Timed runs per prompt (median).")
  progress: bool = cli.field(True, "Show a progress bar.")
  torch_threads: int = cli.field(
    0,
    "torch.set_num_threads (0: os.cpu_count()). On a machine where another job "
    "holds a core, torch's spinning OpenMP threads slow its decode down by 10x at 2 "
    "threads (not at 1): measure on an idle machine.",
  )
  lm_packed_weights: bool = cli.field(
    True,
    f"{LM_PAIR}: specdec's target and draft with packed weights "
    "(`llama.Llama.with_packed_weights`; a no-op where specdec.backends.cpu is not "
    "enabled).",
  )
  lm_pad_multiple: int = cli.field(
    32,
    f"{LM_PAIR}: specdec's prompts are right-padded with the pad id to a "
    "multiple of this (few compiled shapes); transformers gets them unpadded.",
  )


GREEDY = SamplingConfig(temperature=0.0)
HF_BASELINE = "hf_baseline"
SPECDEC_BASELINE = "specdec_baseline"
SPECDEC_SPECULATIVE = "specdec_speculative"
REFERENCE = SPECDEC_BASELINE
# The draft's generation-config fields that steer assisted generation.
ASSISTANT_FIELDS = (
  "num_assistant_tokens",
  "num_assistant_tokens_schedule",
  "assistant_confidence_threshold",
)


def hf_assisted_variants(gamma: int) -> dict[str, dict[str, Any]]:
  """{system name: the draft generation-config fields it sets} ({}: library defaults)."""
  fixed = dict(num_assistant_tokens=gamma, assistant_confidence_threshold=0.0)
  return {
    "hf_assisted": dict(fixed, num_assistant_tokens_schedule="constant"),
    "hf_assisted_heuristic": dict(fixed, num_assistant_tokens_schedule="heuristic"),
    "hf_assisted_defaults": {},
  }


# Prompt lookup, in both implementations (decoder-only pairs, `lookup_draft` given):
# transformers' `prompt_lookup_num_tokens` drafts copies of the context and no model;
# specdec's `ContextLookup` mixes the same kind of proposal into the draft's q.
HF_PROMPT_LOOKUP = "hf_prompt_lookup"
SPECDEC_LOOKUP = "specdec_speculative_lookup"


def system_names(gamma: int = 1, lookup: bool = False) -> list[str]:
  """Every system `run_comparison` measures, in table order (`lookup`: with the
  prompt-lookup systems)."""
  hf = [HF_BASELINE, *hf_assisted_variants(gamma)] + ([HF_PROMPT_LOOKUP] if lookup else [])
  return hf + [SPECDEC_BASELINE, SPECDEC_SPECULATIVE] + ([SPECDEC_LOOKUP] if lookup else [])


# ------------------------------------------------------------------------------
# The same weights in transformers.
# ------------------------------------------------------------------------------
def load_hf(directory: str | os.PathLike, model) -> Any:
  """`T5ForConditionalGeneration` from a `save_hf` directory, float32, eval mode,
  checked to hold exactly `model`'s exported weights."""
  verbosity = transformers.logging.get_verbosity()
  # v1.1 checkpoints store lm_head apart from the shared embedding; transformers 5
  # warns that it will not tie them, which is what they need.
  transformers.logging.set_verbosity_error()
  transformers.logging.disable_progress_bar()
  try:
    hf = transformers.T5ForConditionalGeneration.from_pretrained(os.fspath(directory))
  finally:
    transformers.logging.set_verbosity(verbosity)
    transformers.logging.enable_progress_bar()
  hf = hf.to(torch.float32).eval()
  state = hf.state_dict()
  for name, array in export_hf(model.params, model.config).items():
    if name not in state or not np.array_equal(state[name].numpy(), np.asarray(array, np.float32)):
      raise ValueError(
        f"{directory}: transformers loaded {name!r} differently from the exported weights"
      )
  if (
    not model.config.logits_via_embedding
    and hf.lm_head.weight.data_ptr() == hf.shared.weight.data_ptr()
  ):
    raise ValueError(f"{directory}: transformers tied lm_head to the embedding")
  return hf


def export_pair(target, draft, directory: str | os.PathLike) -> tuple[Any, Any]:
  """Writes both `T5`s in transformers' format under `directory`/{target,draft} and
  loads them back: (hf_target, hf_draft)."""
  out = []
  for name, model in (("target", target), ("draft", draft)):
    path = os.path.join(os.fspath(directory), name)
    save_hf(path, model.params, model.config)
    out.append(load_hf(path, model))
  return out[0], out[1]


def load_hf_llama(directory: str | os.PathLike, model=None) -> Any:
  """`LlamaForCausalLM` from a transformers directory (config.json, model.safetensors),
  float32, eval mode; with `model` (a specdec `llama.Llama`), checked to hold exactly
  its weights."""
  hf = transformers.LlamaForCausalLM.from_pretrained(
    os.fspath(directory), dtype=torch.float32
  ).eval()
  if model is not None:
    state = hf.state_dict()
    for name, array in llama_params_to_hf(model.params, model.config).items():
      if name not in state or not np.array_equal(
        state[name].numpy(), np.asarray(array, np.float32)
      ):
        raise ValueError(
          f"{directory}: transformers loaded {name!r} differently from the specdec model's weights"
        )
  return hf


def _target_lm(pair: str) -> str:
  """The `pretrained.LMS` name of a decoder-only pair's target."""
  return pretrained.pair_info(pair).get("target", {}).get("lm", pair)


def load_hf_lm_pair(pair: str, draft, draft_name: str = "draft") -> tuple[Any, Any]:
  """(hf_target, hf_draft) of a decoder-only shipped pair: the target from the GGUF
  file of `pretrained.lm_path` (`pretrained.load_lm_transformers`), the draft
  `draft_name` from its shipped transformers directory (`pretrained.lm_draft_path`),
  checked against specdec's `draft`."""
  return (
    pretrained.load_lm_transformers(_target_lm(pair)),
    load_hf_llama(pretrained.lm_draft_path(pair, draft_name), draft),
  )


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int, multiple: int) -> list[np.ndarray]:
  """Each prompt [1, S] right-padded with `pad_id` to a multiple of `multiple`: a few
  shapes for specdec to compile, a little padding for its prefill."""
  out = []
  for p in prompts:
    length = -(-len(p) // multiple) * multiple
    out.append(right_pad([p], pad_id, length))
  return out


# ------------------------------------------------------------------------------
# Decoding.
# ------------------------------------------------------------------------------
def hf_tokens(sequences: torch.Tensor, eos_id: int = data.EOS_ID, start: int = 1) -> list[int]:
  """Generated ids of a [1, start + n] `generate` output: the first `start` ids dropped
  (an encoder-decoder's decoder start token; a decoder-only model's prompt), cut after
  the first EOS (anything later is padding)."""
  ids = sequences[0, start:].tolist()
  return ids[: ids.index(eos_id) + 1] if eos_id in ids else ids


def specdec_tokens(out) -> list[int]:
  return np.asarray(out.tokens[0, : int(out.lengths[0])]).tolist()


def _unpadded(x: np.ndarray, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
  """The prompt's ids without specdec's trailing run of `pad_id`, and an all-ones
  mask."""
  ids = np.asarray(x).reshape(-1)
  ids = ids[: int(np.max(np.nonzero(ids != pad_id)[0], initial=-1)) + 1]
  tensor = torch.from_numpy(ids.astype(np.int64))[None]
  return tensor, torch.ones_like(tensor)


@contextlib.contextmanager
def _count_forwards(*modules):
  """Counts the forward calls of each module while the context is open."""
  counts = [0] * len(modules)
  handles = [
    m.register_forward_pre_hook(lambda *_, i=i: counts.__setitem__(i, counts[i] + 1))
    for i, m in enumerate(modules)
  ]
  try:
    yield counts
  finally:
    for h in handles:
      h.remove()


def _effective_assistant_settings(generation_config) -> dict[str, Any]:
  """The assisted-generation fields as transformers will resolve them."""
  defaults = {}
  if hasattr(generation_config, "_get_default_generation_params"):
    defaults = generation_config._get_default_generation_params()  # transformers >= 5.
  out = {}
  for name in ASSISTANT_FIELDS:
    value = getattr(generation_config, name, None)
    out[name] = defaults.get(name) if value is None else value
  return out


def _hf_systems(
  hf_target,
  hf_draft,
  max_new_tokens: int,
  gamma: int,
  generate_kwargs: dict[str, Any] | None = None,
  lookup_ngram: int | None = None,
):
  """{name: (decode(ids, mask) -> sequences, settings)} of the transformers systems;
  `generate_kwargs` go to every `generate` call; `lookup_ngram`: with prompt lookup,
  matching suffixes of up to that many tokens."""
  common = dict(
    max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, **(generate_kwargs or {})
  )

  def baseline(ids, mask):
    with torch.inference_mode():
      return hf_target.generate(input_ids=ids, attention_mask=mask, **common)

  systems = {HF_BASELINE: (baseline, dict(common))}
  original = {k: getattr(hf_draft.generation_config, k, None) for k in ASSISTANT_FIELDS}
  for name, overrides in hf_assisted_variants(gamma).items():
    values = dict(original, **overrides)

    def assisted(ids, mask, values=values):
      # Set on every call: the "heuristic" schedule writes its last draft length back
      # into the draft's generation config, and the next call would start from there.
      for k, v in values.items():
        setattr(hf_draft.generation_config, k, v)
      with torch.inference_mode():
        return hf_target.generate(
          input_ids=ids, attention_mask=mask, assistant_model=hf_draft, **common
        )

    for k, v in values.items():
      setattr(hf_draft.generation_config, k, v)
    settings = dict(
      common,
      assistant_model="draft",
      set_on_draft=overrides,
      effective=_effective_assistant_settings(hf_draft.generation_config),
    )
    systems[name] = (assisted, settings)
  for k, v in original.items():
    setattr(hf_draft.generation_config, k, v)
  if lookup_ngram is not None:
    lookup_kwargs = dict(
      common, prompt_lookup_num_tokens=gamma, max_matching_ngram_size=lookup_ngram
    )

    def prompt_lookup(ids, mask):
      with torch.inference_mode():
        return hf_target.generate(input_ids=ids, attention_mask=mask, **lookup_kwargs)

    systems[HF_PROMPT_LOOKUP] = (prompt_lookup, dict(lookup_kwargs))
  return systems


def _specdec_systems(
  target, draft, max_new_tokens: int, gamma: int, eos_id: int = data.EOS_ID, lookup_draft=None
):
  key = jax.random.key(0)
  common = dict(max_new_tokens=max_new_tokens, temperature=0.0, eos_id=eos_id)

  def baseline(x):
    return autoregressive_sample(
      target, x, key, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_id=eos_id
    )

  def speculative(x):
    return speculative_sample(
      target,
      draft,
      x,
      key,
      gamma=gamma,
      max_new_tokens=max_new_tokens,
      sampling=GREEDY,
      eos_id=eos_id,
    )

  systems = {
    SPECDEC_BASELINE: (baseline, dict(common)),
    SPECDEC_SPECULATIVE: (speculative, dict(common, gamma=gamma)),
  }
  if lookup_draft is not None:

    def speculative_lookup(x):
      return speculative_sample(
        target,
        lookup_draft,
        x,
        key,
        gamma=gamma,
        max_new_tokens=max_new_tokens,
        sampling=GREEDY,
        eos_id=eos_id,
      )

    systems[SPECDEC_LOOKUP] = (
      speculative_lookup,
      dict(
        common,
        gamma=gamma,
        weight=lookup_draft.weight,
        min_ngram=lookup_draft.min_ngram,
        max_ngram=lookup_draft.max_ngram,
      ),
    )
  return systems


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return min(len(a), len(b))


def environment(threads: int) -> dict[str, Any]:
  """Versions, threads and devices of both implementations."""
  return dict(
    transformers=transformers.__version__,
    torch=torch.__version__,
    jax=jax.__version__,
    python=platform.python_version(),
    machine=platform.machine(),
    cpu_count=os.cpu_count(),
    torch_threads=torch.get_num_threads(),
    torch_interop_threads=torch.get_num_interop_threads(),
    torch_set_num_threads=threads,
    torch_mode="inference_mode",
    jax_backend=jax.default_backend(),
    jax_devices=[str(d) for d in jax.devices()],
    dtype="float32",
  )


def run_comparison(
  target,
  draft,
  hf_target,
  hf_draft,
  prompts: Sequence[Any],
  gamma: int,
  max_new_tokens: int,
  repeats: int,
  threads: int | None = None,
  progress: bool = False,
  eos_id: int = data.EOS_ID,
  pad_id: int = 0,
  lookup_draft=None,
) -> dict[str, Any]:
  """Decodes every prompt with every system and measures them (see the module doc).

  Two model families: an encoder-decoder pair (specdec `T5`s; transformers'
  `T5ForConditionalGeneration`, `export_pair`), whose prompts are encoder ids and
  whose decodes start from the decoder start token; or a decoder-only pair (specdec
  `llama.Llama`s; transformers' `LlamaForCausalLM`, `load_hf_lm_pair`), whose prompts
  are the whole context (chat template applied) and whose decodes continue them. The
  family is read from `hf_target.config.is_encoder_decoder`.

  Args:
    target, draft: specdec models; hf_target, hf_draft: the same weights in
      transformers.
    prompts: ids, each [S] or [1, S], right-padded with `pad_id` (specdec gets them
      as they are, transformers without the trailing padding).
    gamma: draft tokens per iteration of specdec and of hf_assisted(_heuristic).
    max_new_tokens: generated tokens at most, EOS included.
    repeats: timed runs per prompt and system (median), after one untimed run.
    threads: `torch.set_num_threads`; None: os.cpu_count().
    eos_id: the token that ends a decode, in both implementations (T5: 1).
    pad_id: the prompts' right padding (T5: 0; a `llama.Llama`: its pad_id).
    lookup_draft: decoder-only pairs: a `lookup.ContextLookup` around `draft`; adds
      transformers' prompt lookup (`prompt_lookup_num_tokens=gamma`) and specdec with
      this draft, compared with each other.

  Returns:
    {"settings", "systems": {name: measurements}, "ratios": [specdec / transformers
    per transformers assisted system], "agreement", "reference_tokens"}.
  """
  threads = threads or os.cpu_count() or 1
  torch.set_num_threads(threads)
  decoder_only = not getattr(hf_target.config, "is_encoder_decoder", False)
  # Decoder-only: stop on the same EOS as specdec, no minimum length, so that both
  # implementations' token streams are comparable (T5's generation config already has
  # EOS 1 and no minimum).
  generate_kwargs = (
    dict(eos_token_id=eos_id, pad_token_id=eos_id, min_length=0, min_new_tokens=None)
    if decoder_only
    else {}
  )
  if lookup_draft is not None and not decoder_only:
    raise ValueError("lookup_draft: prompt lookup is compared on decoder-only pairs")
  lookup = lookup_draft is not None
  hf = _hf_systems(
    hf_target,
    hf_draft,
    max_new_tokens,
    gamma,
    generate_kwargs,
    lookup_draft.max_ngram if lookup else None,
  )
  sd = _specdec_systems(target, draft, max_new_tokens, gamma, eos_id, lookup_draft)
  names = list(hf) + list(sd)
  results = {
    n: dict(prompt_seconds=[], prompt_tokens=[], target_calls=0, draft_calls=0) for n in names
  }
  outputs: dict[str, list[list[int]]] = {n: [] for n in names}
  bar = None
  if progress:
    bar = cli.progress_bar(total=len(prompts) * len(names), desc="decoding", unit="decode")
  # Prompt by prompt, every system in turn: drifts of the machine hit all alike.
  for x in prompts:
    x = np.asarray(x, np.int32).reshape(1, -1)
    ids, mask = _unpadded(x, pad_id)
    start = ids.shape[1] if decoder_only else 1
    for name, (decode, _) in hf.items():
      with _count_forwards(hf_target, hf_draft) as calls:
        tokens = hf_tokens(decode(ids, mask), eos_id, start)
      seconds = median_seconds(
        lambda decode=decode, ids=ids, mask=mask: decode(ids, mask), repeats, warmup=0
      )
      r = results[name]
      r["target_calls"] += calls[0]
      r["draft_calls"] += calls[1]
      r["prompt_seconds"].append(seconds)
      r["prompt_tokens"].append(len(tokens))
      outputs[name].append(tokens)
      bar and bar.update(1)
    xj = jnp.asarray(x)
    for name, (decode, _) in sd.items():
      out = jax.block_until_ready(decode(xj))
      seconds = median_seconds(lambda decode=decode, xj=xj: decode(xj).tokens, repeats, warmup=0)
      tokens = specdec_tokens(out)
      r = results[name]
      r["target_calls"] += int(np.sum(out.stats.iterations))
      r["draft_calls"] += int(np.sum(getattr(out.stats, "drafted", 0)))
      r["prompt_seconds"].append(seconds)
      r["prompt_tokens"].append(len(tokens))
      outputs[name].append(tokens)
      bar and bar.update(1)
  if bar is not None:
    bar.close()

  reference = outputs[REFERENCE]
  disagreements = []
  for name in names:
    r = results[name]
    r["implementation"] = "transformers" if name in hf else "specdec"
    r["settings"] = (hf if name in hf else sd)[name][1]
    r["seconds"] = float(sum(r["prompt_seconds"]))
    r["tokens"] = int(sum(r["prompt_tokens"]))
    r["ms_per_token"] = r["seconds"] * 1e3 / max(r["tokens"], 1)
    r["tokens_per_target_call"] = r["tokens"] / max(r["target_calls"], 1)
    r["identical_to_reference"] = sum(o == ref for o, ref in zip(outputs[name], reference))
    for i, (o, ref) in enumerate(zip(outputs[name], reference)):
      if o != ref:
        disagreements.append(
          dict(
            system=name,
            prompt=i,
            first_difference=_first_difference(o, ref),
            tokens=o,
            reference=ref,
          )
        )
  for name in names:
    base = HF_BASELINE if name in hf else SPECDEC_BASELINE
    results[name]["baseline"] = base
    results[name]["speedup"] = results[base]["ms_per_token"] / results[name]["ms_per_token"]

  def ratio(specdec_name: str, name: str) -> dict[str, Any]:
    spec = results[specdec_name]
    return dict(
      specdec_system=specdec_name,
      hf_system=name,
      baseline_ms_per_token=(
        results[SPECDEC_BASELINE]["ms_per_token"] / results[HF_BASELINE]["ms_per_token"]
      ),
      speculative_ms_per_token=(spec["ms_per_token"] / results[name]["ms_per_token"]),
      speedup=spec["speedup"] / results[name]["speedup"],
    )

  ratios = [
    ratio(SPECDEC_SPECULATIVE, name) for name in hf if name not in (HF_BASELINE, HF_PROMPT_LOOKUP)
  ]
  if lookup:
    ratios.append(ratio(SPECDEC_LOOKUP, HF_PROMPT_LOOKUP))
  settings = dict(
    environment(threads),
    gamma=gamma,
    max_new_tokens=max_new_tokens,
    repeats=repeats,
    warmup_runs=1,
    prompts=len(prompts),
    batch=1,
    input_length=int(np.asarray(prompts[0]).size) if prompts else 0,
    decoding="greedy",
    eos_id=eos_id,
    hf_attn_implementation=getattr(hf_target.config, "_attn_implementation", None),
    reference=REFERENCE,
  )
  if decoder_only:
    settings.update(
      family="decoder-only",
      pad_id=pad_id,
      input_lengths=[int(np.asarray(p).size) for p in prompts],
      prompt_tokens=[int(_unpadded(p, pad_id)[0].shape[1]) for p in prompts],
      hf_generate_kwargs=generate_kwargs,
    )
  else:
    settings.update(
      family="encoder-decoder",
      decoder_start_token_id=int(hf_target.generation_config.decoder_start_token_id),
    )
  agreement = dict(
    reference=REFERENCE,
    prompts=len(prompts),
    identical={n: results[n]["identical_to_reference"] for n in names},
    all_agree=not disagreements,
    disagreements=disagreements,
  )
  return dict(
    settings=settings,
    systems=results,
    ratios=ratios,
    agreement=agreement,
    reference_tokens=reference,
  )


# ------------------------------------------------------------------------------
# Reporting.
# ------------------------------------------------------------------------------
def _describe(name: str, r: dict[str, Any]) -> str:
  s = r["settings"]
  if name == SPECDEC_SPECULATIVE:
    return f"gamma {s['gamma']}"
  if name == SPECDEC_LOOKUP:
    return (
      f"gamma {s['gamma']}, draft + lookup (n {s['min_ngram']}-{s['max_ngram']}, "
      f"weight {s['weight']:g})"
    )
  if name == HF_PROMPT_LOOKUP:
    return (
      f"{s['prompt_lookup_num_tokens']} drafts, n-grams up to "
      f"{s['max_matching_ngram_size']}, no draft model"
    )
  if "effective" in s:
    e = s["effective"]
    start = "from " if e["num_assistant_tokens_schedule"] != "constant" else ""
    return (
      f"{start}{e['num_assistant_tokens']} drafts, "
      f"{e['num_assistant_tokens_schedule']}, confidence threshold "
      f"{e['assistant_confidence_threshold']:g}"
    )
  return "greedy"


def markdown(result: dict[str, Any]) -> str:
  """The systems table, the specdec / transformers ratios and the settings."""
  s, agree = result["settings"], result["agreement"]
  header = (
    "system",
    "settings",
    "tokens",
    "ms/token",
    "speed-up (own baseline)",
    "target calls",
    "tokens/target call",
    "draft calls",
    f"identical to {agree['reference']}",
  )
  lines = [
    report.markdown_table(
      header,
      [
        [
          name,
          _describe(name, r),
          r["tokens"],
          f"{r['ms_per_token']:.3f}",
          f"{r['speedup']:.2f}x",
          r["target_calls"],
          f"{r['tokens_per_target_call']:.2f}",
          r["draft_calls"],
          f"{r['identical_to_reference']}/{agree['prompts']}",
        ]
        for name, r in result["systems"].items()
      ],
    )
  ]
  lines += [
    "",
    report.markdown_table(
      ["specdec / transformers", "baseline ms/token", "speculative ms/token", "speed-up"],
      [
        [
          f"{q.get('specdec_system', SPECDEC_SPECULATIVE)} vs {q['hf_system']}",
          f"{q['baseline_ms_per_token']:.3f}",
          f"{q['speculative_ms_per_token']:.3f}",
          f"{q['speedup']:.3f}",
        ]
        for q in result["ratios"]
      ],
    ),
  ]
  if s.get("family") == "decoder-only":
    shape = (
      f"chat prompts of {min(s['prompt_tokens'])}-{max(s['prompt_tokens'])} "
      f"tokens, right-padded for specdec to {sorted(set(s['input_lengths']))}, "
      f"EOS {s['eos_id']}"
    )
  else:
    shape = f"encoder length {s['input_length']}"
  lines += [
    "",
    f"Greedy, batch 1, float32, {s['prompts']} prompts ({shape}), "
    f"max_new_tokens {s['max_new_tokens']}, median of "
    f"{s['repeats']} timed runs per prompt after {s['warmup_runs']} untimed; "
    f"transformers {s['transformers']} (attention {s['hf_attn_implementation']}), "
    f"torch {s['torch']} ({s['torch_threads']} threads, inference_mode), jax "
    f"{s['jax']} ({s['jax_backend']}), {s['cpu_count']} CPUs. Ratios < 1: "
    "specdec is faster (ms/token) or gains less (speed-up).",
    f"All systems give the same tokens on every prompt: {'yes' if agree['all_agree'] else 'NO'}.",
  ]
  return "\n".join(lines)


def run_lm(config: Config, pair: str, num: int) -> dict[str, Any]:
  """The decoder-only pair on its held-out chat prompts (module doc)."""
  # Assisted generation needs a draft over the target's whole vocabulary: the
  # shipped one transformers can run (`pretrained.lm_transformers_draft`), for both.
  draft_name = pretrained.lm_transformers_draft(pair)
  target, draft, tok = pretrained.load_pair(pair, draft=draft_name)
  messages = list(pretrained.lm_eval_prompts(pair))[:num]
  # transformers gets the draft's weights checked against the unpacked model.
  hf_target, hf_draft = load_hf_lm_pair(pair, draft, draft_name)
  if config.lm_packed_weights:
    target, draft = target.with_packed_weights(), draft.with_packed_weights()
  ids = [
    tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True)
    for m in messages
  ]
  prompts = pad_prompts(ids, target.pad_id, config.lm_pad_multiple)
  result = run_comparison(
    target,
    draft,
    hf_target,
    hf_draft,
    prompts,
    config.gamma,
    config.max_new_tokens,
    config.repeats,
    threads=config.torch_threads or None,
    progress=config.progress,
    eos_id=tok.eos_id,
    pad_id=target.pad_id,
    lookup_draft=pretrained.with_context_lookup(pair, draft),
  )
  result["settings"].update(
    pad_multiple=config.lm_pad_multiple,
    specdec_packed_weights=dict(target=target.packed is not None, draft=draft.packed is not None),
    hf_target_source=str(pretrained.lm_path(_target_lm(pair))),
    draft=draft_name,
    hf_draft_source=str(pretrained.lm_draft_path(pair, draft_name)),
  )
  result["examples"] = [
    dict(prompt=m, output=tok.decode(t, skip_special_tokens=True))
    for m, t in zip(messages[:3], result["reference_tokens"])
  ]
  return result


def run(config: Config) -> dict[str, Any]:
  """The comparison of the module doc on `config.pair`."""
  pair = config.pair
  if pair not in DEFAULT_PROMPTS:
    raise ValueError(f"pair: {pair!r} is not one of {list(DEFAULT_PROMPTS)}")
  cli.check_positive(
    config, "gamma", "max_new_tokens", "input_length", "repeats", "lm_pad_multiple"
  )
  num = config.sentences if config.sentences is not None else DEFAULT_PROMPTS[pair]
  if num < 1:
    raise ValueError(f"sentences must be >= 1, got {num}")
  with jax.default_device(jax.local_devices(backend="cpu")[0]):
    if pair == LM_PAIR:
      result = run_lm(config, pair, num)
    else:
      # The full draft: transformers runs it over the whole vocabulary, so both
      # implementations run the same q (no output shortlist).
      target, draft, vocab = pretrained.load_pair(pair, shortlist=False)
      sentences = pretrained.test_sentences(pair)[:num]
      prompts = [
        vocab.encode_padded(data.TRANSLATE_PREFIX + en, config.input_length) for en, _ in sentences
      ]
      with tempfile.TemporaryDirectory() as tmp:
        hf_target, hf_draft = export_pair(target, draft, tmp)
        result = run_comparison(
          target,
          draft,
          hf_target,
          hf_draft,
          prompts,
          config.gamma,
          config.max_new_tokens,
          config.repeats,
          threads=config.torch_threads or None,
          progress=config.progress,
        )
      result["examples"] = [
        dict(source=en, reference=de, output=vocab.decode(ids))
        for (en, de), ids in zip(sentences[:3], result["reference_tokens"])
      ]
  result["settings"]["pair"] = pair
  return result


def render(result: dict[str, Any]) -> str:
  return (
    f"specdec vs transformers {result['settings']['transformers']} assisted "
    f"generation, {result['settings']['pair']}\n\n" + markdown(result)
  )
