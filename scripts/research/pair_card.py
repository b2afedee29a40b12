"""The model card of the shipped Multi30k pair (`specdec/weights/multi30k_ende/`),
written from its pair.json alone: what `package_pair.py` recorded of the models and
their training, and the measurements (BLEU, alpha per draft and temperature, the
batch-1 speed-ups) stored in its "metrics".

    python scripts/research/pair_card.py [--pair=multi30k_ende]
"""

from __future__ import annotations

from absl import app, flags

from specdec import pretrained

FLAGS = flags.FLAGS


def model_card(info: dict) -> str:
  """MODEL_CARD.md from pair.json (`info`): the models, their training, and the
  measured BLEU, alpha and speed-ups (none typed in here)."""
  m = info["metrics"]
  models = [("target", info["target"])] + [
    (d, info[d]) for d in sorted(info) if d.startswith("draft") and "config" in info[d]
  ]

  def size(cfg):
    return (
      f"emb {cfg['emb_dim']}, {cfg['num_heads']} heads x {cfg['head_dim']}, mlp "
      f"{cfg['mlp_dim']}, {cfg['num_encoder_layers']}+{cfg['num_decoder_layers']} "
      f"layers"
    )

  def row(label, fn):
    return f"| {label} | " + " | ".join(fn(e) for _, e in models) + " |"

  data_names = {
    "references": "Multi30k train references",
    "distill": "the target's greedy outputs on Multi30k train (sequence-level distillation)",
  }
  lines = [
    f"# Model card: {info['name']}",
    "",
    "A T5 v1.1 target (Mp) and two much smaller T5 v1.1 drafts (Mq) of one "
    "architecture for speculative decoding, trained from scratch by "
    "`scripts/research/train_pair.py` on Multi30k English->German with T5's "
    f'SentencePiece vocabulary (32128 logits) and the prefix "{info["prefix"]}". Stored in '
    "bfloat16 in the T5X checkpoint layout. `draft` learns the references; "
    "`draft_distilled` learns what the target says (its greedy outputs); which is "
    "accepted more often at each temperature is measured below, and "
    "`specdec.pretrained.best_draft` picks by those alphas.",
    "",
    *_shortlist_lines(info),
    "| | " + " | ".join(name for name, _ in models) + " |",
    "|---|" + "---|" * len(models),
    row("architecture", lambda e: size(e["config"])),
    row("parameters", lambda e: f"{e['params']:,}"),
    row("training data", lambda e: data_names[e["training"].get("data", "references")]),
    row(
      "training",
      lambda e: (
        f"{e['training']['steps']} steps "
        f"({e['training']['epochs']} epochs, batch {e['training']['batch_size']}), "
        f"{e['training']['minutes']} min"
      ),
    ),
    row(
      "validation loss (Multi30k val references)",
      lambda e: f"{e['training']['final_val_loss']:.3f}",
    ),
    *(
      [
        row("training settings", _settings),
        row(
          "training arithmetic rate",
          lambda e: (
            f"{e['training']['gflop_per_s']} GFLOP/s"
            if "gflop_per_s" in e["training"]
            else "not recorded"
          ),
        ),
      ]
      if any("settings" in e["training"] for _, e in models)
      else []
    ),
    "",
    "Training: the optimizer in each model's settings (AdamW with gradient clipping "
    "1.0, or T5's Adafactor), warm-up then cosine decay, seed 0, "
    "length-bucketed batches, on two CPU cores; data: Multi30k train (29,000 pairs), "
    "validation on 512 val pairs (the loss without label smoothing; of the exported "
    "average where there is one). The distilled draft's validation loss is against the "
    "references, which it is not trained to predict. The arithmetic rate counts 6 x "
    "weights x tokens (padding included) plus the 32128-way output layer over the "
    "training time, compiles included.",
    "",
    *[f"{name}: {e['training']['note']}" for name, e in models if e["training"].get("note")],
    *([""] if any(e["training"].get("note") for _, e in models) else []),
    "## Quality and acceptance",
    "",
    "| | Multi30k test_2016 | newstest2014 |",
    "|---|---|---|",
    f"| target BLEU (greedy, sacrebleu) | {m['bleu']['multi30k_test_2016']:.1f} | "
    f"{m['bleu']['newstest2014']:.1f} |",
    *_quality_rows(m),
    f"| sentences (BLEU / alpha) | {m['sentences']['multi30k_test_2016']['bleu']} / "
    f"{m['sentences']['multi30k_test_2016']['alpha']} | "
    f"{m['sentences']['newstest2014']['bleu']} / "
    f"{m['sentences']['newstest2014']['alpha']} |",
  ]
  for draft_name in m["alpha"]:
    for temp in ("0", "1"):
      a = m["alpha"][draft_name]
      lines.append(
        f"| alpha, {draft_name}, temperature {temp} | "
        f"{a['multi30k_test_2016'][temp]:.3f} | {a['newstest2014'][temp]:.3f} |"
      )
  lines += [
    "",
    "alpha is the paper's: the mean of beta = sum min(p, q) over the positions "
    "of speculative decodes (gamma 4, batch 128), pooled over the sentences. The "
    "n-gram drafts (Table 3) are estimated from the Multi30k train references.",
    "",
  ]
  if m.get("best"):
    lines += [
      "## Speed on this machine (batch 1, the best draft per temperature)",
      "",
      "| test set | temp | draft | best gamma | alpha | speed-up | predicted | meas/pred |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in m["best"].items():
      for r in rows:
        lines.append(
          f"| {name} | {r['temperature']:g} | {r['draft']} | {r['gamma']} | "
          f"{r['alpha']:.3f} | {r['speedup']:.2f}x | "
          f"{r['predicted_speedup']:.2f}x | "
          f"{r['measured_over_predicted']:.2f} |"
        )
    lines += [
      "",
      "predicted = E[tokens](alpha, gamma) / (gamma c + v) with c and v "
      "measured in the same run (`specdec.bench.measure`); on a CPU v, the cost "
      "of verifying gamma + 1 tokens in target steps, is well above the paper's "
      "accelerator premise of 1.",
      "",
    ]
  lines += [
    "The pair is trained on image captions: newstest2014 is far out of its "
    "domain, which its BLEU shows; it is there to measure acceptance on the "
    "paper's test set, not translation quality."
    + (
      " The target often repeats a word to the length limit; the distilled "
      "draft learns those repetitions too, which is much of its "
      "temperature-0 acceptance."
      if _repeats_often(m)
      else ""
    ),
    "",
    f"Measured by `scripts/research/evaluate_pair.py` ({m['seconds']:.0f} s); the "
    "translations and the batch-1 gamma sweep are in "
    "`out/evaluate_pair/evaluation.json` and `sweep.md` when rerun.",
    "",
    "Data: " + "; ".join(f"{k}: {v}" for k, v in info["provenance"].items()) + ".",
  ]
  return "\n".join(lines) + "\n"


def _shortlist_lines(info: dict) -> list[str]:
  """The drafts' output shortlist (`shortlist_pair.py`), where they have one."""
  s = info.get("output_shortlist")
  if not s:
    return []
  return [
    f"The drafts ship with their output layer cut to a shortlist of {s['size']:,} "
    f"of the {s['vocab_size']:,} ids (`shortlist.json`: {s['source']}; "
    f"{100 * s['test_2016_reference_coverage']:.1f} % of the test_2016 reference "
    "tokens): `specdec.pretrained.load_pair` gives `OutputShortlist` drafts whose "
    "q is the full draft's conditioned on the list (lossless; the checkpoints keep "
    "the full layer, `shortlist=False`). The alphas below are those drafts'.",
    "",
  ]


def _repeats_often(m: dict) -> bool:
  """More than 5 % of the test outputs repeat a word 4+ times in a row, as measured."""
  q = m.get("quality", {}).get("multi30k_test_2016")
  return q is not None and q["repeat_rate"] > 0.05


def _settings(entry: dict) -> str:
  s = entry["training"].get("settings")
  if not s:
    return "not recorded"
  text = (
    f"{s.get('optimizer', 'adamw')}, peak lr {s['learning_rate']:g}, warm-up {s['warmup_steps']}"
  )
  if s.get("reparam"):
    text += ", embeddings and queries trained rescaled (`--reparam`)"
  if s.get("output_vocab") == "train":
    text += (
      f", loss over the training targets' tokens (every "
      f"{s.get('full_vocab_every', 4)}th step the full vocabulary)"
    )
  if s.get("label_smoothing"):
    text += f", label smoothing {s['label_smoothing']:g}"
  if s.get("ema_decay"):
    text += f", exported: EMA {s['ema_decay']:g} of the weights"
  return text


def _quality_rows(m: dict) -> list[str]:
  """The degeneration rates, where the evaluation measured them."""
  q = m.get("quality")
  if not q:
    return []
  return [
    f"| outputs that hit the length limit | "
    f"{100 * q['multi30k_test_2016']['length_limit_rate']:.1f} % | "
    f"{100 * q['newstest2014']['length_limit_rate']:.1f} % |",
    f"| outputs repeating a word 4+ times in a row | "
    f"{100 * q['multi30k_test_2016']['repeat_rate']:.1f} % | "
    f"{100 * q['newstest2014']['repeat_rate']:.1f} % |",
  ]


def write_card(name: str) -> str:
  """Rewrites the pair's MODEL_CARD.md from its pair.json; returns its path."""
  path = pretrained.pair_dir(name) / "MODEL_CARD.md"
  path.write_text(model_card(pretrained.pair_info(name)))
  return str(path)


def main(argv):
  del argv
  print(f"wrote {write_card(FLAGS.pair)}")


if __name__ == "__main__":
  flags.DEFINE_string("pair", "multi30k_ende", "A shipped T5 pair.")
  app.run(main)
