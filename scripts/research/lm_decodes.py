"""The training data of a distilled draft: chat prompts, and the target's own decodes
of them (sequence-level distillation, Kim & Rush 2016), cached on disk in batches.

Prompts come from `specdec.data.lm_prompts` (held-out evaluation prompts apart). The target
decodes them with `specdec.autoregressive_sample` (or transformers' `generate` on the
same weights), one .npz file per batch, so that an interrupted run resumes; the `soft`
stage adds the target's top-k log-probabilities along each decode beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
import functools
import glob
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import specdec
from specdec import pretrained
from specdec.data import lm_prompts

from common import log

NAME = "smollm2_135m_instruct"
GREEDY = specdec.SamplingConfig(temperature=0.0)
SAMPLED = specdec.SamplingConfig(temperature=1.0)
# Prompts are padded to a multiple of this, so that few decode shapes compile.
PROMPT_BUCKET = 32


# ------------------------------------------------------------------------------
# Prompts.
# ------------------------------------------------------------------------------
def prompt_split(
  tok, max_prompt_tokens: int, num_eval: int
) -> tuple[list[lm_prompts.Prompt], list[lm_prompts.Prompt]]:
  """(training, evaluation) prompts whose chat ids fit `max_prompt_tokens`."""
  return lm_prompts.split(
    num_eval=num_eval, fits=lambda c: len(lm_prompts.encode(tok, c)) <= max_prompt_tokens
  )


def round_pools(
  train_prompts: Sequence[lm_prompts.Prompt],
  data_round: int,
  first: dict[str, int],
  num_greedy: int,
  num_sampled: int,
  greedy_before: int = 0,
) -> tuple[list[lm_prompts.Prompt], list[lm_prompts.Prompt]]:
  """(greedy, sampled) training prompts of `data_round` (`--data_round`): even and
  odd positions of the training order, swapped every round, so that each
  temperature's prompts do not depend on the other's count and the caches stay
  valid when either changes.

  Round r >= 2 decodes greedily only prompts that round r - 2 (the same parity) did
  not: those before its first greedy one, `greedy_before` (its `--first_greedy`, from
  the summary); a greedy decode of the same prompt would repeat its output.
  """
  if data_round < 0:
    raise ValueError(f"data_round: must be >= 0, got {data_round}")
  if data_round >= 2 and num_greedy > 0 and first["greedy"] + num_greedy > greedy_before:
    raise ValueError(
      f"data_round: round {data_round} would decode greedily prompts that round "
      f"{data_round - 2} did (same outputs): it decoded them from greedy prompt "
      f"{greedy_before} on, and this round asks for {first['greedy']} to "
      f"{first['greedy'] + num_greedy - 1}; set --num_greedy to at most "
      f"{max(greedy_before - first['greedy'], 0)}"
    )
  greedy = list(train_prompts[data_round % 2 :: 2][first["greedy"] :][:num_greedy])
  sampled = list(train_prompts[(data_round + 1) % 2 :: 2][first["sampled"] :][:num_sampled])
  return greedy, sampled


def round_dir(out_dir: str, key: str, data_round: int) -> str:
  """The cache of one round's training decodes (`key` train_t0 or train_t1)."""
  return os.path.join(out_dir, f"gen_{key}" + (f"_r{data_round}" if data_round else ""))


def round_dirs(out_dir: str, key: str) -> list[str]:
  """Every round's cache of `key` on disk, in round order."""
  rounds = [0] + sorted(
    int(d.rsplit("_r", 1)[1])
    for d in glob.glob(os.path.join(out_dir, f"gen_{key}_r*"))
    if d.rsplit("_r", 1)[1].isdigit()
  )
  return [round_dir(out_dir, key, r) for r in rounds if os.path.isdir(round_dir(out_dir, key, r))]


def round_record(summary: dict[str, Any], data_round: int) -> dict[str, Any]:
  """What `generate` recorded of one round (summaries from before rounds kept
  round 0's record at the top level)."""
  rounds = summary.get("rounds", {})
  if str(data_round) in rounds:
    return rounds[str(data_round)]
  if data_round == 0 and "generate_backend" in summary:
    return dict(
      generate_backend=summary["generate_backend"],
      first_prompts=summary.get("first_prompts", dict(greedy=0, sampled=0)),
      generate_minutes=summary.get("generate_minutes", 0.0),
      gen_batch=summary.get("gen_batch"),
    )
  return {}


def bucketed(ids: Sequence[Sequence[int]], pad_id: int, bucket: int) -> np.ndarray:
  """Right-padded prompts, the width rounded up to a multiple of `bucket`."""
  inputs = lm_prompts.right_pad(ids, pad_id)
  width = -(-inputs.shape[1] // bucket) * bucket
  return np.pad(inputs, ((0, 0), (0, width - inputs.shape[1])), constant_values=pad_id)


def length_sorted_batches(lengths: Sequence[int], batch: int) -> list[np.ndarray]:
  """Index batches of similar prompt lengths (less padding per decode), in a fixed
  order."""
  order = np.argsort(np.asarray(lengths), kind="stable")
  return [order[i : i + batch] for i in range(0, len(order), batch)]


# ------------------------------------------------------------------------------
# Generation.
# ------------------------------------------------------------------------------
def decode_batch(
  target, tok, ids: Sequence[Sequence[int]], batch: int, max_new_tokens: int, sampling, key
) -> dict[str, np.ndarray]:
  """The target's decodes of up to `batch` prompts (the batch filled with copies of
  the first, so that one shape serves every batch); only the real rows returned."""
  rows = len(ids)
  filled = list(ids) + [ids[0]] * (batch - rows)
  inputs = bucketed(filled, target.pad_id, PROMPT_BUCKET)
  out = specdec.autoregressive_sample(
    target,
    jnp.asarray(inputs),
    key,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    eos_id=tok.eos_id,
  )
  return dict(
    inputs=inputs[:rows],
    prompt_lengths=np.array([len(p) for p in ids], np.int32),
    tokens=np.asarray(out.tokens)[:rows],
    lengths=np.asarray(out.lengths)[:rows],
  )


def responses(generated: np.ndarray, eos_id: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, lengths) of generated rows as `autoregressive_sample` returns them: a
  row's length counts its tokens up to and including the first EOS (all of them
  where there is none); pad_id after it."""
  generated = np.asarray(generated)
  is_eos = generated == eos_id
  lengths = np.where(is_eos.any(1), is_eos.argmax(1) + 1, generated.shape[1])
  keep = np.arange(generated.shape[1])[None, :] < lengths[:, None]
  return (np.where(keep, generated, pad_id).astype(np.int32), lengths.astype(np.int32))


def left_padded(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """(ids, attention mask), int64 [B, longest]: each sequence at the right end,
  `pad_id` and mask 0 before it (transformers' batched layout)."""
  width = max(len(q) for q in seqs)
  ids = np.full((len(seqs), width), pad_id, np.int64)
  mask = np.zeros((len(seqs), width), np.int64)
  for row, q in enumerate(seqs):
    ids[row, width - len(q) :] = q
    mask[row, width - len(q) :] = 1
  return ids, mask


def decode_batch_transformers(
  model, tok, ids: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, seed: int
) -> dict[str, np.ndarray]:
  """`decode_batch` by transformers' `generate` (`model`: a `LlamaForCausalLM`):
  the same prompt ids, left-padded with an attention mask; plain sampling at
  `temperature` (no top-k or top-p), greedy at 0; the same output arrays."""
  import torch

  left, mask = left_padded(ids, tok.pad_id)
  width = left.shape[1]
  torch.manual_seed(seed)
  sampling = (
    dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    if temperature > 0
    else dict(do_sample=False)
  )
  with torch.inference_mode():
    out = model.generate(
      input_ids=torch.from_numpy(left),
      attention_mask=torch.from_numpy(mask),
      max_new_tokens=max_new_tokens,
      min_new_tokens=0,
      eos_token_id=tok.eos_id,
      pad_token_id=tok.pad_id,
      num_beams=1,
      **sampling,
    )
  generated = np.full((len(ids), max_new_tokens), tok.pad_id, np.int64)
  new = out[:, width:].numpy()
  generated[:, : new.shape[1]] = new
  tokens, lengths = responses(generated, tok.eos_id, tok.pad_id)
  inputs = bucketed(ids, tok.pad_id, PROMPT_BUCKET)
  return dict(
    inputs=inputs,
    prompt_lengths=np.array([len(p) for p in ids], np.int32),
    tokens=tokens,
    lengths=lengths,
  )


def transformers_target(dtype_name: str = "bfloat16"):
  """The target as transformers' `LlamaForCausalLM` (`pretrained.load_lm_transformers`)
  on all the machine's cores."""
  import torch

  torch.set_num_threads(os.cpu_count() or 1)
  return pretrained.load_lm_transformers(NAME, dtype_name)


def generate_window(
  target,
  tok,
  prompts: Sequence[lm_prompts.Prompt],
  directory: str,
  window: int,
  temperature: float,
  batch: int,
  max_new_tokens: int,
  seed: int,
  deadline: float = float("inf"),
  hf_model=None,
) -> int:
  """Decodes `prompts` (one window) into directory/batch_WWWW_JJ.npz, batches of
  similar length, skipping files already there (so that a rerun resumes) and
  starting none past `deadline` (perf_counter); returns the tokens decoded now.
  With `hf_model` transformers decodes (`decode_batch_transformers`)."""
  os.makedirs(directory, exist_ok=True)
  ids = [lm_prompts.encode(tok, p.content) for p in prompts]
  sampling = GREEDY if temperature == 0 else specdec.SamplingConfig(temperature=temperature)
  tokens = 0
  for number, index in enumerate(length_sorted_batches([len(p) for p in ids], batch)):
    path = os.path.join(directory, f"batch_{window:04d}_{number:02d}.npz")
    if os.path.exists(path) or time.perf_counter() > deadline:
      continue
    if hf_model is not None:
      result = decode_batch_transformers(
        hf_model,
        tok,
        [ids[i] for i in index],
        max_new_tokens,
        temperature,
        seed * 1_000_003 + window * 1000 + number,
      )
    else:
      key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), window), number)
      result = decode_batch(
        target, tok, [ids[i] for i in index], batch, max_new_tokens, sampling, key
      )
    np.savez(path + ".tmp.npz", **result)
    os.replace(path + ".tmp.npz", path)
    tokens += int(result["lengths"].sum())
  return tokens


def generate_training(
  target,
  tok,
  pools: dict[str, Sequence[lm_prompts.Prompt]],
  dirs: dict[str, str],
  window: int,
  batch: int,
  max_new_tokens: int,
  seed: int,
  minutes: float,
  hf_model=None,
) -> None:
  """Windows of `window` prompts, each temperature's pool in turn (0 then 1), until
  both pools are used or `minutes` have passed (counted from this call: a resumed
  run skips the batches on disk quickly and continues); no batch starts after."""
  start = time.perf_counter()
  deadline = start + 60 * minutes
  tokens = 0
  for w in range(max(-(-len(p) // window) for p in pools.values())):
    for key, pool in pools.items():
      chunk = pool[w * window : (w + 1) * window]
      if not chunk:
        continue
      tokens += generate_window(
        target,
        tok,
        chunk,
        dirs[key],
        w,
        0.0 if key.endswith("t0") else 1.0,
        batch,
        max_new_tokens,
        seed,
        deadline,
        hf_model,
      )
      seconds = time.perf_counter() - start
      log(
        f"{key}: window {w + 1} done; {tokens} new tokens in {seconds:.0f} s "
        f"({tokens / max(seconds, 1e-9):.1f} tok/s)"
      )
      if seconds > 60 * minutes:
        log(f"generation budget of {minutes} min reached")
        return


def sample_user_turns(
  target,
  tok,
  prefix: Sequence[int],
  directory: str,
  batches: int,
  batch: int,
  max_tokens: int,
  seed: int,
  deadline: float = float("inf"),
) -> dict[str, int]:
  """User messages the target writes itself: `batches` decodes of `batch` rows of the
  chat template's ids up to the user's text (`prefix`,
  `lm_chat_prompts.user_turn_prefix`), sampled at temperature 1 until the turn ends
  (the tokenizer's EOS) or `max_tokens`; one directory/self_NNNN.jsonl shard per
  batch ({"text", "ended"} a row), shards already there skipped (a rerun resumes),
  none started past `deadline` (perf_counter). Returns rows and tokens decoded now."""
  os.makedirs(directory, exist_ok=True)
  inputs = jnp.asarray(np.tile(np.asarray(prefix, np.int32)[None], (batch, 1)))
  done = dict(rows=0, tokens=0)
  for number in range(batches):
    path = os.path.join(directory, f"self_{number:04d}.jsonl")
    if os.path.exists(path) or time.perf_counter() > deadline:
      continue
    out = specdec.autoregressive_sample(
      target,
      inputs,
      jax.random.fold_in(jax.random.key(seed), number),
      max_new_tokens=max_tokens,
      sampling=SAMPLED,
      eos_id=tok.eos_id,
    )
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      for row, n in zip(tokens, lengths):
        ended = bool(n > 0 and row[n - 1] == tok.eos_id)
        text = tok.decode([int(t) for t in row[: n - 1 if ended else n]])
        f.write(json.dumps(dict(text=text, ended=ended), ensure_ascii=False) + "\n")
    os.replace(path + ".tmp", path)
    done["rows"] += batch
    done["tokens"] += int(lengths.sum())
  return done


def load_decodes(directory: str) -> list[dict[str, np.ndarray]]:
  """The cached batches of `generate`, in order, each with its soft targets
  (`soft_log_probs`, `soft_ids`) when the `soft` stage has computed them."""
  out = []
  for path in sorted(glob.glob(os.path.join(directory, "batch_*.npz"))):
    if ".tmp." in path:  # an interrupted write
      continue
    b = dict(np.load(path))
    soft = soft_path(path)
    if os.path.exists(soft):
      b.update(np.load(soft))
    out.append(b)
  return out


def soft_path(batch_path: str) -> str:
  return batch_path.replace("batch_", "soft_")


@functools.partial(jax.jit, static_argnames=("top_k",))
def _top_log_probs(target, inputs, tokens, top_k: int):
  # The target's distributions along its own decode, all positions in one `extend`
  # (as `bench.alpha.teacher_forced_betas` does), at temperature 1.
  start = target.start_tokens(inputs)[:, None]
  chunk = jnp.concatenate([start, tokens[:, :-1]], axis=1)
  logits, _ = target.extend(target.init(inputs, tokens.shape[1]), chunk)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  return jax.lax.top_k(log_probs, top_k)


def top_log_probs_transformers(
  model, prompts: Sequence[np.ndarray], tokens: np.ndarray, top_k: int, chunk: int = 32
) -> tuple[np.ndarray, np.ndarray]:
  """`_top_log_probs` by a transformers `LlamaForCausalLM`: each row's prompt and
  its response tokens [R] left-padded into one teacher-forced pass (positions from
  the attention mask), the log-probabilities of response positions 0..R-1; `chunk`
  rows per pass. (values float32 [B, R, k], ids int32 [B, R, k])."""
  import torch

  rows, response = tokens.shape
  values = np.zeros((rows, response, top_k), np.float32)
  ids = np.zeros((rows, response, top_k), np.int32)
  for r0 in range(0, rows, chunk):
    part = range(r0, min(rows, r0 + chunk))
    seqs = [np.concatenate([prompts[r], tokens[r]]) for r in part]
    x, mask = left_padded(seqs, 0)
    width = x.shape[1]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.inference_mode():
      logits = model(
        input_ids=torch.from_numpy(x),
        attention_mask=torch.from_numpy(mask),
        position_ids=torch.from_numpy(positions),
      ).logits
      # Position width - R - 1 + j predicts response token j.
      logits = logits[:, width - response - 1 : width - 1].float()
      top = torch.topk(torch.log_softmax(logits, dim=-1), top_k, dim=-1)
    values[r0 : r0 + len(seqs)] = top.values.numpy()
    ids[r0 : r0 + len(seqs)] = top.indices.numpy()
  return values, ids


def soft_targets_one(
  target, path: str, batch: int, top_k: int, deadline: float, hf_model=None
) -> int:
  """Top-k log-probabilities of the target at every position of one cached decode
  batch (soft_*.npz beside its batch_*.npz), unless present or past `deadline`
  (perf_counter); 1 if computed now."""
  if os.path.exists(soft_path(path)) or time.perf_counter() > deadline:
    return 0
  b = np.load(path)
  rows = len(b["lengths"])
  # Filled to the full batch with copies of row 0: one compiled shape per width.
  fill = lambda x: np.concatenate([x, np.repeat(x[:1], batch - rows, axis=0)])
  if hf_model is not None:
    prompts = [b["inputs"][r, : b["prompt_lengths"][r]] for r in range(rows)]
    values, ids = top_log_probs_transformers(hf_model, prompts, b["tokens"], top_k)
  else:
    values, ids = _top_log_probs(
      target, jnp.asarray(fill(b["inputs"])), jnp.asarray(fill(b["tokens"])), top_k=top_k
    )
  np.savez(
    soft_path(path) + ".tmp.npz",
    soft_log_probs=np.asarray(values[:rows], np.float16),
    soft_ids=np.asarray(ids[:rows], np.int32),
  )
  os.replace(soft_path(path) + ".tmp.npz", soft_path(path))
  return 1


def examples(batches: Sequence[dict[str, np.ndarray]]) -> list[tuple]:
  """(prompt ids, response ids, soft targets or None) per decoded row; the response
  keeps its EOS; soft targets are (log-probs [R, k], ids [R, k])."""
  out = []
  for b in batches:
    for row in range(len(b["lengths"])):
      prompt = b["inputs"][row, : b["prompt_lengths"][row]]
      n = b["lengths"][row]
      soft = (b["soft_log_probs"][row, :n], b["soft_ids"][row, :n]) if "soft_ids" in b else None
      out.append((prompt, b["tokens"][row, :n], soft))
  return out


def round_counts(out_dir: str) -> dict[str, dict[str, dict[str, int]]]:
  """{round: {'rows': {temperature: n}, 'tokens': {temperature: n}}} of the
  training decodes on disk (the target-written prompts' caches, gen_self_t*,
  included)."""
  out = {}
  for t, key in (("0", "train_t0"), ("1", "train_t1"), ("0", "self_t0"), ("1", "self_t1")):
    for d in round_dirs(out_dir, key):
      r = d.rsplit("_r", 1)[1] if "_r" in os.path.basename(d) else "0"
      batches = load_decodes(d)
      c = out.setdefault(r, dict(rows={"0": 0, "1": 0}, tokens={"0": 0, "1": 0}))
      c["rows"][t] += int(sum(len(b["lengths"]) for b in batches))
      c["tokens"][t] += int(sum(b["lengths"].sum() for b in batches))
  return dict(sorted(out.items(), key=lambda kv: int(kv[0])))
