r"""What a Llama-family model's chunked step and greedy decode cost here.

    python scripts/bench_llama.py [--config=smollm2_135m] [--weights=PATH] \
        [--dtype=float32] [--prompt_length=32] [--max_chunk=8] [--rounds=5] \
        [--decode_tokens=64] [--compare_transformers] [--output=out/bench_llama.json]

For a preset of `specdec.models.llama.CONFIGS` (random weights) or a checkpoint
(`--weights`: a `.gguf` file, or a Hugging Face `LlamaForCausalLM` directory, whose
config then replaces `--config`), at batch 1:

* t(k): one `Llama.extend` over a chunk of k = 1..max_chunk tokens against a cache
  primed with the prompt, each timed inside a compiled loop
  (`specdec.benchmarking.extend_seconds`), the rounds interleaved so that a slow spell
  of a shared machine hits every k alike, the minimum over rounds reported; and
  v(k) = t(k) / t(1), the cost of verifying k = gamma + 1 tokens in target steps
  (Leviathan et al. 2023 assume v = 1). Both ways of computing the products side by
  side: `packed` (`Llama.with_packed_weights`: `specdec.kernels` reads each weight
  once per chunk, the default on a CPU) and `xla` (XLA's own matrix products);
* the roofline: the same weights streamed by one matrix-vector product each, in one
  compiled program (`specdec.benchmarking.weight_stream_seconds`), in ms and GB/s --
  what reading a step's weights once costs on this machine, which t(1) and every
  t(k) are held to;
* the baseline: `specdec.autoregressive_sample`, greedy, `--decode_tokens` new tokens,
  in ms/token (minimum of `--decode_repeats`), and with `--compare_transformers` the
  same weights and prompt in transformers' `generate(do_sample=False)` (torch, float32);
* memory: XLA's compiled memory of that decode (parameters, temporaries) and the
  process's peak resident set.

It prints a table and writes JSON. Measure on a quiet machine: a benchmark beside
other jobs reads high. `--config=tiny` (`llama.tiny_config()`) checks the script.
"""

from __future__ import annotations

import dataclasses
import resource
import tempfile
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec import benchmarking, checkpoints
from specdec.models import llama

_CONFIG = flags.DEFINE_enum("config", "smollm2_135m", sorted(llama.CONFIGS) + ["tiny"],
                            "Preset of the random-weight model (not with --weights).")
_WEIGHTS = flags.DEFINE_string("weights", "", "A .gguf file or a Hugging Face Llama "
                               "directory; empty for random weights.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Parameter and activation dtype.")
_PROMPT_LENGTH = flags.DEFINE_integer("prompt_length", 32, "Prompt tokens (random ids).")
_MAX_CHUNK = flags.DEFINE_integer("max_chunk", 8, "Chunks of 1..max_chunk tokens.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved rounds (minimum reported).")
_STEPS = flags.DEFINE_integer("steps", 16, "extend calls per compiled loop.")
_DECODE_TOKENS = flags.DEFINE_integer("decode_tokens", 64, "Greedy tokens decoded.")
_DECODE_REPEATS = flags.DEFINE_integer("decode_repeats", 3, "Timed decodes (minimum).")
_COMPARE = flags.DEFINE_bool("compare_transformers", False,
                             "Also time transformers' greedy generate on the same "
                             "weights and prompt (float32 only).")
_TORCH_THREADS = flags.DEFINE_integer("torch_threads", 0,
                                      "torch threads for --compare_transformers "
                                      "(0: torch's default).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random weights and prompt.")
_OUTPUT = flags.DEFINE_string("output", "out/bench_llama.json", "JSON output.")


def load_model(config: str, weights: str, dtype) -> tuple[llama.Llama, str]:
  """(the model, a description of its weights)."""
  if weights.endswith(".gguf"):
    from specdec import checkpoints_gguf  # pylint: disable=g-import-not-at-top
    cfg, params = checkpoints_gguf.load_gguf(weights, dtype=dtype)
    source = f"GGUF {weights}"
  elif weights:
    cfg, params = checkpoints.load_hf_llama(weights, dtype=dtype)
    source = f"Hugging Face {weights}"
  else:
    cfg = llama.tiny_config() if config == "tiny" else llama.CONFIGS[config]
    cfg = dataclasses.replace(cfg, dtype=dtype)
    params = llama.random_params(cfg, seed=_SEED.value, dtype=dtype)
    source = f"random {config}"
  # On the device once: numpy leaves would be copied in again on every call.
  return llama.Llama(cfg, jax.device_put(params)), source


def step_costs(models: dict[str, llama.Llama], prompt: jax.Array, max_chunk: int,
               rounds: int, steps: int) -> dict[str, dict[int, float]]:
  """{name: {k: seconds of one extend of k tokens}}, the minimum over rounds that
  interleave every model and k."""
  states = {name: m.init(prompt, max_chunk + 1) for name, m in models.items()}
  start = next(iter(models.values())).start_tokens(prompt)[:, None]
  best = {name: {k: float("inf") for k in range(1, max_chunk + 1)} for name in models}
  for _ in range(rounds):
    for name, m in models.items():
      for k in best[name]:
        seconds = benchmarking.extend_seconds(m, states[name], jnp.tile(start, (1, k)),
                                              repeats=1, steps=steps)
        best[name][k] = min(best[name][k], seconds)
  return best


def decode_memory(model: llama.Llama, prompt: jax.Array, tokens: int) -> dict[str, int]:
  """XLA's compiled memory of the greedy decode, in bytes."""
  decode = jax.jit(lambda m, x: specdec.autoregressive_sample(
      m, x, jax.random.key(0), max_new_tokens=tokens,
      sampling=specdec.SamplingConfig(temperature=0.0)).tokens)
  analysis = decode.lower(model, prompt).compile().memory_analysis()
  if analysis is None:
    return {}
  memory = {name: int(getattr(analysis, f"{name}_size_in_bytes"))
            for name in ("argument", "output", "temp", "alias")}
  memory["peak"] = (memory["argument"] + memory["output"] + memory["temp"]
                    - memory["alias"])
  return memory


def transformers_ms_per_token(model: llama.Llama, prompt: np.ndarray, tokens: int,
                              repeats: int, threads: int) -> tuple[float, list[int]]:
  """transformers' greedy generate on the same weights (saved as safetensors)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  if threads:
    torch.set_num_threads(threads)
  with tempfile.TemporaryDirectory() as path:
    checkpoints.save_hf_llama(path, model.config,
                              jax.tree.map(lambda x: np.asarray(x, np.float32),
                                           model.params))
    theirs = transformers.LlamaForCausalLM.from_pretrained(path).eval()
  x = torch.tensor(prompt)
  kwargs = dict(do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                attention_mask=torch.ones_like(x))
  best = float("inf")
  with torch.no_grad():
    out = theirs.generate(x, **kwargs)
    for _ in range(repeats):
      start = time.perf_counter()
      theirs.generate(x, **kwargs)
      best = min(best, time.perf_counter() - start)
  return best / tokens * 1e3, out[0, prompt.shape[1]:].tolist()


def measure() -> dict:
  dtype = jnp.dtype(_DTYPE.value)
  model, source = load_model(_CONFIG.value, _WEIGHTS.value, dtype)
  cfg = model.config
  rng = np.random.default_rng(_SEED.value)
  prompt_np = rng.integers(0, cfg.vocab_size, (1, _PROMPT_LENGTH.value)).astype(np.int32)
  prompt = jnp.asarray(prompt_np)

  models = {"xla": model}
  packed = model.with_packed_weights()
  if packed.packed is not None:
    models = {"packed": packed, "xla": model}
  costs = step_costs(models, prompt, _MAX_CHUNK.value, _ROUNDS.value, _STEPS.value)
  roofline_s, weight_bytes = benchmarking.weight_stream_seconds(
      llama.decode_matrices(cfg, model.params), repeats=max(5, _ROUNDS.value))
  default = next(iter(models))
  t = costs[default]
  decode = benchmarking.autoregressive_decoder(
      models[default], _DECODE_TOKENS.value, specdec.SamplingConfig(temperature=0.0),
      None)
  seconds_per_token, outputs = benchmarking.time_decodes(
      decode, [prompt], jax.random.key(0), repeats=_DECODE_REPEATS.value)
  result = {
      "weights": source,
      "config": {k: (str(v) if k == "dtype" else v) for k, v in cfg.__dict__.items()},
      "parameters": llama.param_count(cfg),
      "devices": [str(d) for d in jax.devices()],
      "prompt_length": _PROMPT_LENGTH.value,
      "products": default,
      "t_ms": {str(k): v * 1e3 for k, v in t.items()},
      "v": {str(k): v / t[1] for k, v in t.items()},
      "strategies": {name: {"t_ms": {str(k): v * 1e3 for k, v in c.items()},
                            "v": {str(k): v / c[1] for k, v in c.items()}}
                     for name, c in costs.items()},
      "weight_bytes": weight_bytes,
      "roofline_ms": roofline_s * 1e3,
      "roofline_gb_per_s": weight_bytes / roofline_s / 1e9,
      "t1_over_roofline": t[1] / roofline_s,
      "decode_tokens": _DECODE_TOKENS.value,
      "baseline_ms_per_token": seconds_per_token * 1e3,
      "baseline_tokens": np.asarray(outputs[0].tokens[0]).tolist(),
      "decode_memory_bytes": decode_memory(models[default], prompt,
                                           _DECODE_TOKENS.value),
  }
  if _COMPARE.value:
    ms, tokens = transformers_ms_per_token(model, prompt_np, _DECODE_TOKENS.value,
                                           _DECODE_REPEATS.value, _TORCH_THREADS.value)
    result["transformers_ms_per_token"] = ms
    result["transformers_same_tokens"] = tokens == result["baseline_tokens"]
  # ru_maxrss is in KiB on Linux.
  result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  return result


def table(result: dict) -> str:
  names = list(result["strategies"])
  lines = [f"{result['weights']}: {result['parameters']:,} parameters, "
           f"{result['config']['dtype']}, batch 1, prompt {result['prompt_length']}; "
           f"roofline (its {result['weight_bytes'] / 1e6:.0f} MB of step weights "
           f"streamed once by matrix-vector products): {result['roofline_ms']:.2f} ms "
           f"({result['roofline_gb_per_s']:.1f} GB/s)",
           "| k | " + " | ".join(f"t(k) {n} ms | v(k) {n}" for n in names)
           + " | t(k) / roofline |", "|---|" + "---|---|" * len(names) + "---|"]
  for k, ms in result["t_ms"].items():
    cells = " | ".join(f"{result['strategies'][n]['t_ms'][k]:.2f} | "
                       f"{result['strategies'][n]['v'][k]:.2f}" for n in names)
    lines.append(f"| {k} | {cells} | {ms / result['roofline_ms']:.2f} |")
  lines.append(f"baseline (greedy, {result['decode_tokens']} tokens): "
               f"{result['baseline_ms_per_token']:.2f} ms/token")
  if "transformers_ms_per_token" in result:
    lines.append(f"transformers generate: {result['transformers_ms_per_token']:.2f} "
                 f"ms/token (same tokens: {result['transformers_same_tokens']})")
  memory = result["decode_memory_bytes"]
  if memory:
    lines.append(f"decode memory (XLA): peak {memory['peak'] / 2**20:.1f} MiB "
                 f"(arguments {memory['argument'] / 2**20:.1f} MiB, temporaries "
                 f"{memory['temp'] / 2**20:.1f} MiB)")
  lines.append(f"process peak RSS: {result['peak_rss_bytes'] / 2**20:.0f} MiB")
  return "\n".join(lines)


def main(argv):
  del argv
  result = measure()
  print(table(result))
  if _OUTPUT.value:
    benchmarking.write_json(_OUTPUT.value, result)


if __name__ == "__main__":
  app.run(main)
