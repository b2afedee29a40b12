"""MODEL_CARD.md of a distilled pair, written from pair.json's facts and measurements
alone (no number typed in here), so that a rerun of any stage rewrites it.

A hand-written section (`KEPT_SECTION`, quiet-machine benchmarks) survives the
rewrite.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from specdec.data import lm_prompts

from lm_decodes import round_record


def soft_words(training: dict[str, Any]) -> str:
  soft = training.get("soft_targets") or {}
  words = (
    "cross-entropy on the response tokens only (the prompt is context), "
    f"{training['sequences']:,} sequences, {training['response_tokens']:,} "
    "response tokens"
  )
  if soft.get("top_k"):
    words += (
      f"; on the {soft['sequences']:,} sequences with soft targets, "
      f"{1 - soft['weight']:g} x that + {soft['weight']:g} x cross-entropy "
      f"against the target's top-{soft['top_k']} probabilities at each "
      "position (from one teacher-forced target pass)"
    )
  return words


def vocabulary_words(d: dict[str, Any]) -> str:
  if not d.get("shortlist"):
    return f"vocabulary {d['config']['vocab_size']} (the target's tokenizer)"
  cover = d.get("shortlist_coverage") or {}
  words = (
    f"output over a shortlist of the {d['shortlist']} tokens most frequent in "
    "the training responses, input over those and one id for every other "
    f"token (vocabulary {d['config']['vocab_size']}; `shortlist.json`, "
    "`specdec.drafts.shortlist`: q = 0 off the list, which Algorithm 1 allows"
  )
  if cover:
    words += (
      f"; the list holds {cover['train']:.1%} of the training and "
      f"{cover['validation']:.1%} of the validation response tokens"
    )
  return words + ")"


# A section of MODEL_CARD.md written by hand (quiet-machine benchmarks), kept when
# the card is regenerated.
KEPT_SECTION = "## Measured on a quiet machine"


def kept_section(old_card: str) -> str:
  """The hand-written KEPT_SECTION of an existing card ('' if none)."""
  if KEPT_SECTION not in old_card:
    return ""
  rest = old_card[old_card.index(KEPT_SECTION) :]
  end = rest.find("\n## ", len(KEPT_SECTION))
  return (rest if end < 0 else rest[:end]).rstrip() + "\n"


def write_card(ship: str, info: dict[str, Any]) -> None:
  """MODEL_CARD.md from `info`, keeping the old card's KEPT_SECTION before
  '## Limitations'."""
  path = os.path.join(ship, "MODEL_CARD.md")
  old = pathlib.Path(path).read_text() if os.path.exists(path) else ""
  card, kept = model_card(info), kept_section(old)
  if kept:
    card = card.replace("## Limitations", kept + "\n## Limitations", 1)
  with open(path, "w") as f:
    f.write(card)


def lookup_card_lines(info: dict[str, Any]) -> list[str]:
  """The card's section on the "+lookup" draft ([] without measurements)."""
  cl = info.get("context_lookup")
  if not cl or "teacher_forced_alpha" not in cl:
    return []
  m, a, sp = info.get("metrics", {}), cl["teacher_forced_alpha"], cl["speculative"]
  plain = m.get("teacher_forced_alpha", {})
  lines = [
    "",
    "## With context lookup (`draft+lookup`)",
    "",
    '`pretrained.load_pair(name, draft="draft+lookup")` wraps the draft in '
    "`specdec.drafts.lookup.ContextLookup`: where the context's last "
    f"{cl['min_ngram']}-{cl['max_ngram']} tokens occurred before (in the prompt "
    "or the output so far), q = "
    f"{cl['weight']:g} x one-hot(the token that followed their latest "
    f"occurrence) + {1 - cl['weight']:.2g} x the draft's q; elsewhere the "
    "draft's q (prompt lookup, measured by `scripts/research/distill_lm.py "
    f"--stages=lookup` on the same {sp['0']['rows']} held-out prompts and "
    f"{cl['max_new_tokens']} new tokens):",
    "",
    "| temperature | alpha (teacher-forced) | draft alone | alpha-hat "
    f"(gamma {cl['gamma']}) | tokens / iteration |",
    "|---|---|---|---|---|",
  ]
  for key in ("0", "1"):
    lines.append(
      f"| {key} | {a[key]:.3f} | "
      + (f"{plain[key]:.3f}" if key in plain else "-")
      + f" | {sp[key]['alpha_hat']:.3f} | "
      f"{sp[key]['tokens_per_iteration']:.2f} |"
    )
  c = cl["costs"]
  lines += [
    "",
    f"Greedy speculative decodes equal to the target's greedy decode: "
    f"{sp['0'].get('identical_to_greedy', '-')} of {sp['0']['rows']}. "
    f"t_q = {c['t_q'] * 1e3:.2f} ms (the n-gram match and the mixture "
    f"included), c = {c['c']:.3f}. Predicted speed-up by gamma (the target's "
    "v as above):",
    "",
    "| gamma | " + " | ".join(cl["predicted"]["0"]) + " |",
    "|---|" + "---|" * len(cl["predicted"]["0"]),
  ]
  for key in ("0", "1"):
    lines.append(
      f"| temperature {key} | "
      + " | ".join(f"{v:.2f}x" for v in cl["predicted"][key].values())
      + " |"
    )
  best = ", ".join(f"gamma {g} at temperature {k}" for k, g in cl["best_gamma"].items())
  lines += [
    "",
    f"`best_gamma` for `draft+lookup` (pair.json's `context_lookup`, "
    f"which `specdec.bench.demo` uses): {best}.",
  ]
  return lines


def prompts_words(num_train: int, num_eval: int, max_prompt_tokens: int) -> str:
  return (
    f"{num_train} training prompts and {num_eval} held-out evaluation prompts, "
    "chat-templated user messages built by `specdec.data.lm_prompts` from newstest2014 "
    'English sources ("Translate to German: ", "Continue this text: ", "Explain in '
    f'simple words: "), the first {lm_prompts.CNNDM_SENTENCES} sentences of CNN/DM '
    'test articles ("Summarize: ", "What is this article about? ") and Multi30k '
    'test_2016 English captions ("Describe this scene in more detail: ", "Write a '
    'short story that begins: ", "Translate to German: "); every '
    f"{lm_prompts.HOLDOUT_STRIDE}th text of each source is held out (with any "
    "repeat of it), so no evaluation text is in a training prompt; prompts of at "
    f"most {max_prompt_tokens} tokens."
  )


def decodes_words(counts: dict[str, Any], summary: dict[str, Any], max_new_tokens: int) -> str:
  """One sentence per round of `generate` (`--data_round`)."""
  parts = []
  for r, c in counts.items():
    rec = round_record(summary, int(r))
    first = rec.get("first_prompts", dict(greedy=0, sampled=0))
    parity = ("even", "odd") if int(r) % 2 == 0 else ("odd", "even")
    skipped = (
      f" after the first {first['greedy']} greedy and {first['sampled']} "
      "sampled ones, decoded for an earlier draft"
      if any(first.values())
      else ""
    )
    backend = (
      "transformers' `generate` on the same GGUF weights in bfloat16"
      if rec.get("generate_backend") == "transformers_bf16"
      else "`specdec.autoregressive_sample`, float32"
    )
    batch = f"batches of {rec['gen_batch']}, " if rec.get("gen_batch") else ""
    pools = []  # a round may decode at one temperature only
    if c["rows"]["0"]:
      pools.append(
        f"{c['rows']['0']} training prompts (the {parity[0]} ones of the "
        f"training order{skipped}) decoded greedily ({c['tokens']['0']:,} "
        "response tokens)"
      )
    if c["rows"]["1"]:
      pools.append(
        f"{c['rows']['1']} "
        + ("" if pools else "training prompts ")
        + f"(the {parity[1]} ones"
        + ("" if pools else " of the training order")
        + f") sampled at temperature 1 ({c['tokens']['1']:,} tokens)"
      )
    parts.append(
      f"Round {r}: {' and '.join(pools) or 'no training prompts'}, at most "
      f"{max_new_tokens} new tokens each ({batch}{backend}), "
      f"{rec.get('generate_minutes', 0.0):.1f} min."
    )
  return " ".join(parts)


def warm_start_words(t: dict[str, Any]) -> str:
  """The card's words for a run started from an earlier draft (`--init_from`)."""
  w = t.get("warm_start")
  if not w:
    return ""
  prev = w.get("training", {})
  words = "from an earlier draft"
  if prev:
    words += (
      f" ({prev.get('steps')} steps of {prev.get('batch_size')} sequences, "
      f"{prev.get('minutes')} min, on {prev.get('response_tokens', 0):,} "
      "response tokens"
    )
    alpha = w.get("teacher_forced_alpha")
    if alpha:
      words += f"; teacher-forced alpha {alpha['0']:.3f} / {alpha['1']:.3f}"
    words += ")"
  return words + ", then "


def training_verdict(t: dict[str, Any]) -> str:
  """The card's reading of a run's validation losses (`t`: pair.json's
  draft.training): what to add first, more steps or more data."""
  history = t["history"]
  best = min(history, key=lambda h: h["val_loss"])
  more_data = (
    "more target decodes (`--generate_minutes`, `--num_greedy`, "
    "`--num_sampled`; the caches resume; once every training prompt is "
    "decoded, `--data_round` decodes each at the other temperature, and "
    "rounds past 1 sample again; or more source texts)"
  )
  stopped_early = t.get("stopped_at", t["steps"]) < t.get("planned_steps", t["steps"])
  if stopped_early:  # `--patience` ended the run: later validations were no better
    verdict = (
      "and no later validation was lower (the run stopped at step "
      f"{t['stopped_at']}, {history[-1]['val_loss']:.3f}), so it is limited by "
      f"data rather than steps: {more_data} are the first thing to add"
    )
  elif best is history[-1]:  # its last validation was its best
    verdict = (
      "and was still falling at the last step ("
      f"{history[-1]['val_loss']:.3f} at step {history[-1]['step']}), so "
      "more steps over the same data are the first thing to add "
      f"(`--train_minutes`), then {more_data}"
    )
  elif history[-1]["val_loss"] - best["val_loss"] < 0.01:  # flat after its best
    verdict = (
      "and stayed within 0.01 of it after, without falling further "
      f"({history[-1]['val_loss']:.3f} at the last step, "
      f"{history[-1]['step']}): a plateau, so {more_data} are the first "
      "thing to add"
    )
  else:
    verdict = (
      "and rose after, so it is limited by data rather than steps: "
      f"{more_data} are the first thing to add"
    )
  return verdict


def model_card(info: dict[str, Any]) -> str:
  """MODEL_CARD.md from pair.json's facts and measurements (none typed in here)."""
  d, t, m = info["draft"], info["draft"]["training"], info.get("metrics", {})
  cfg = d["config"]
  lines = (
    [
      f"# Model card: {info['name']}",
      "",
      f"A {d['params']:,}-parameter Llama draft (Mq) for speculative decoding with "
      f"the real SmolLM2-135M-Instruct as the target (Mp): `{info['target']['lm']}` "
      f"({info['target']['description']}, loaded by "
      "`specdec.pretrained.load_lm`). The draft was distilled here from the target's "
      "own decodes of chat prompts (sequence-level distillation) by "
      "`scripts/research/distill_lm.py`, and ships in bfloat16 as a transformers "
      "`LlamaForCausalLM` directory (`draft/`, "
      f'{d["bytes"] / 1e6:.1f} MB); `specdec.pretrained.load_pair("{info["name"]}")` '
      "loads both in float32.",
      "",
      "| | draft |",
      "|---|---|",
      f"| architecture | Llama, d {cfg['hidden_size']}, {cfg['num_layers']} layers, "
      f"{cfg['num_heads']} heads x {cfg['head_dim']} ({cfg['num_kv_heads']} key/value), "
      f"SwiGLU {cfg['intermediate_size']}, RoPE base {cfg['rope_theta']:g}, tied "
      f"embedding, {vocabulary_words(d)} |",
      f"| parameters | {d['params']:,} |",
      f"| size on disk | {d['bytes']:,} bytes (bfloat16 safetensors + config.json) |",
      "| initialisation | "
      + (
        "the earlier draft's parameters (see training; its own initialisation: "
        if t.get("warm_start")
        else ""
      )
      + f"embedding: {t['embedding_init_words']}; the rest random"
      + (")" if t.get("warm_start") else "")
      + " |",
      f"| training | {warm_start_words(t)}{t['steps']} steps of {t['batch_size']} "
      "sequences "
      f"({t['epochs']} epochs), {t['minutes']} min on two CPU cores"
      + (
        f" (the best validation loss of a run stopped at step {t['stopped_at']}, "
        f"cosine schedule for {t['planned_steps']})"
        if t.get("stopped_at", t["steps"]) != t["steps"]
        else ""
      )
      + ", AdamW (peak "
      f"{t['learning_rate']:g}, {t['warmup_steps']} warm-up steps, cosine decay, "
      f"weight decay {t['weight_decay']:g}, clipping 1.0), seed {info['seed']} |",
      f"| loss | {soft_words(t)} |",
      f"| validation loss | {t['final_val_loss']:.3f} (cross-entropy per response "
      "token on the target's decodes of the held-out prompts at temperatures 0 and 1; "
      f"{t['history'][0]['val_loss']:.3f} at initialisation) |",
      "",
      "## Data",
      "",
      f"Prompts: {info['data']['prompts_words']}",
      "",
      f"Target decodes (the training data): {info['data']['decodes_words']}",
      "",
    ]
    + (
      [
        f"The earlier draft this one started from was trained on: "
        f"{t['warm_start']['data']['decodes_words']}",
        "",
      ]
      if t.get("warm_start", {}).get("data", {}).get("decodes_words")
      else []
    )
    + [
      "Sources and terms (`specdec/data/PROVENANCE.md`, "
      "`specdec/weights/multi30k_ende/MODEL_CARD.md`):",
      "",
    ]
  )
  lines += [f"- {k}: {v}" for k, v in info["provenance"].items()]
  if m:
    tf, sp, cost = m["teacher_forced_alpha"], m["speculative"], m["costs"]
    lines += [
      "",
      "## Acceptance and cost (measured by `scripts/research/distill_lm.py --stages=evaluate`)",
      "",
      f"On the {info['eval_prompts']['count']} held-out evaluation prompts "
      f"(`eval_prompts.jsonl`, `specdec.pretrained.lm_eval_prompts`), "
      f"{m['max_new_tokens']} new tokens, the shipped bfloat16 draft upcast to "
      "float32:",
      "",
      "| temperature | alpha (teacher-forced) | alpha-hat (speculative, gamma "
      f"{sp['0']['gamma']}) | tokens / iteration |",
      "|---|---|---|---|",
    ]
    for key in ("0", "1"):
      lines.append(
        f"| {key} | {tf[key]:.3f} | {sp[key]['alpha_hat']:.3f} | "
        f"{sp[key]['tokens_per_iteration']:.2f} |"
      )
    lines += [
      "",
      "alpha teacher-forced is the paper's E[beta], beta = sum_x min(p(x), q(x)), "
      "at every position of the target's own decodes of the prompts "
      "(`bench.alpha.teacher_forced_betas`); alpha-hat is the same mean over the "
      "positions speculative decoding drafted (`speculative_sample`'s stats). "
      f"Greedy speculative decodes equal to the target's greedy decode: "
      f"{sp['0']['identical_to_greedy']} of {sp['0']['rows']}.",
      "",
      f"Cost at batch 1, float32, on this 2-core CPU (`costs.step_costs`, one "
      f"`extend` timed in a compiled loop, minimum of rounds): t_q = "
      f"{cost['t_q'] * 1e3:.2f} ms, t_p1 = {cost['t_p1'] * 1e3:.2f} ms, so c = "
      f"{cost['c']:.3f}; t_p(gamma + 1 = {m['gamma'] + 1}) = "
      f"{cost['t_p_gamma1'] * 1e3:.2f} ms, v = {cost['v']:.2f} (1-minute load "
      f"average {cost['load_average_1min']:.1f} on the 2 cores while timing: times "
      "move by tens of percent with other work on the machine). Predicted "
      f"speed-up E[tokens] / (gamma c + v) at gamma {m['gamma']}: "
      f"{m['predicted_speedup']['0']:.2f}x at temperature 0, "
      f"{m['predicted_speedup']['1']:.2f}x at temperature 1.",
    ]
    if "gamma_sweep" in m:
      sweep = m["gamma_sweep"]
      t_p = sweep["t_p_monotone"]
      lines += [
        "",
        "Predicted speed-up by gamma (v(gamma) = t_p(gamma + 1) / t_p1 measured per "
        "chunk length, as a running maximum over chunk lengths since a longer chunk "
        "cannot cost less (raw times in pair.json); same c; `best_gamma` in "
        "pair.json, which `specdec.bench.demo` uses, is the best of these):",
        "",
        "| gamma | " + " | ".join(sweep["predicted"]["0"]) + " |",
        "|---|" + "---|" * len(sweep["predicted"]["0"]),
        "| v | "
        + " | ".join(f"{t_p[str(int(g) + 1)] / t_p['1']:.2f}" for g in sweep["predicted"]["0"])
        + " |",
      ]
      for key in ("0", "1"):
        lines.append(
          f"| temperature {key} | "
          + " | ".join(f"{v:.2f}x" for v in sweep["predicted"][key].values())
          + " |"
        )
  lines += lookup_card_lines(info)
  history = t["history"]
  best = min(history, key=lambda h: h["val_loss"])
  verdict = training_verdict(t)
  lines += [
    "",
    "## Limitations",
    "",
    f"The draft saw {t['response_tokens']:,} response tokens "
    f"({t['sequences']} target decodes"
    + (
      f", {len(info['data']['rounds'])} rounds of `--data_round`"
      if len(info["data"].get("rounds", {})) > 1
      else ", one per training prompt left after the earlier draft's"
      if t.get("warm_start")
      else ", as many as the target could decode in the time given on a shared 2-core CPU"
    )
    + ") for "
    f"{t['epochs']} epochs; its validation loss was lowest at step "
    f"{best['step']} ({best['val_loss']:.3f}) {verdict}. A draft of this "
    f"size (d {cfg['hidden_size']}, {cfg['num_layers']} layers) on this much "
    "data stays far from the paper's alpha 0.88 (a 6M draft trained on all "
    "of lm1b).",
  ]
  if "candidates" in info:
    lines += [
      "",
      "## Choosing the shape",
      "",
      "One draft `extend` of one token against the target's, random weights, "
      "batch 1, float32 (`--stages=time`, `costs.step_costs`); v as "
      "measured beside each. d 128's float32 embedding (25 MB) fits the "
      "32 MiB L3 cache of the machine they were measured on and d 192's "
      "(38 MB) does not, the likely "
      "reason for the step between them:",
      "",
      "| shape | parameters | t_q ms | c | predicted speed-up at alpha 0.7 / 0.8 / 0.9 |",
      "|---|---|---|---|---|",
    ]
    for name, c in info["candidates"].items():
      p = c["predicted"]
      lines.append(
        f"| {name} | {c['params']:,} | {c['t_q'] * 1e3:.2f} | {c['c']:.3f} | "
        f"{p['0.7']:.2f} / {p['0.8']:.2f} / {p['0.9']:.2f} |"
      )
    if d.get("shortlist"):
      lines += [
        "",
        "These shapes predict over the whole vocabulary, whose output layer "
        f"is most of their cost. Over a shortlist of {d['shortlist']} tokens the "
        f"output layer is {cfg['vocab_size'] * cfg['hidden_size']:,} "
        "parameters, so the shipped draft spends the same budget on a body of "
        f"width {cfg['hidden_size']} (t_q and c above).",
      ]
  lines += [
    "",
    "## Use",
    "",
    "```python",
    "import jax, jax.numpy as jnp, specdec",
    "from specdec import pretrained",
    "from specdec.data import lm_prompts",
    "",
    f'target, draft, tok = pretrained.load_pair("{info["name"]}")',
    f'messages = pretrained.lm_eval_prompts("{info["name"]}")',
    # In ruff's format (.ci/lint checks the Markdown's code blocks too).
    "inputs = jnp.asarray(",
    "  lm_prompts.right_pad([lm_prompts.encode(tok, m) for m in messages[:4]], target.pad_id)",
    ")",
    "out = specdec.speculative_sample(",
    "  target,",
    "  draft,",
    "  inputs,",
    "  jax.random.key(0),",
    "  gamma=4,",
    "  max_new_tokens=64,",
    "  eos_id=tok.eos_id,",
    "  sampling=specdec.SamplingConfig(temperature=0.0),",
    ")",
    "```",
    "",
    "transformers: `LlamaForCausalLM.from_pretrained(pretrained.lm_draft_path())`"
    + (
      " loads the network over the shortlist's ids (map ids with "
      "`shortlist.json`; `specdec.drafts.shortlist`)."
      if d.get("shortlist")
      else "."
    ),
  ]
  if "draft_full" in info:
    f = info["draft_full"]
    lines += [
      "",
      "## The full-vocabulary draft (`draft_full/`)",
      "",
      f"The previous draft, kept for transformers' assisted generation "
      f"(`python -m specdec.bench compare-hf`), which needs the target's vocabulary: "
      f"d {f['config']['hidden_size']}, {f['config']['num_layers']} layers, "
      f"{f['params']:,} parameters, {f['bytes'] / 1e6:.1f} MB; teacher-forced "
      f"alpha {f['alpha']['0']:.3f} / {f['alpha']['1']:.3f} at temperatures 0 "
      '/ 1 on the same prompts. `pretrained.load_pair(name, draft="draft_full")`.',
    ]
  lines += [
    "",
    "Licence: the draft is derived from SmolLM2-135M-Instruct (Apache-2.0) "
    "outputs on the data above; the data terms above apply.",
    "",
  ]
  return "\n".join(lines)
