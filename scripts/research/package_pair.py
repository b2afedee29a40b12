"""Packages a pair trained by `train_pair.py` into `specdec/weights/<name>/`.

    python scripts/research/package_pair.py --train_dir=out/train_pair \\
        --distilled_dir=out/distill --multi30k_dir=../shared/data/multi30k

Copies the exported bfloat16 T5X checkpoints and the Multi30k test_2016 sentences the
demo translates, and writes `pair.json`: the model configs, checkpoint paths, the
training summary and the provenance of the data. `evaluate_pair.py` adds the measured
quality and acceptance and writes the model card.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

from absl import app, flags

from specdec.bench.cli import write_json

from common import config_json
import train_pair  # the presets the pair was trained with

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line; defined when run as a command only (importing this file
  registers no flag)."""
  flags.DEFINE_string(
    "train_dir",
    "out/train_pair",
    "train_pair.py --out_dir of the target and draft (empty: keep the packaged ones).",
  )
  flags.DEFINE_string(
    "multi30k_dir",
    "../shared/data/multi30k",
    "Multi30k raw files (for the shipped test sentences).",
  )
  flags.DEFINE_string(
    "distilled_dir",
    "",
    "train_pair.py --which=draft --draft_data=distill --out_dir: shipped as "
    "'draft_distilled' beside the reference-trained 'draft' (empty: none).",
  )
  flags.DEFINE_multi_string(
    "note",
    [],
    "A sentence on a model's training that its run summary does not hold (e.g. the "
    "earlier phases it started from), as name=text; it goes into pair.json and the "
    "card.",
  )
  flags.DEFINE_string("name", "multi30k_ende", "Name of the pair.")
  flags.DEFINE_string("weights_dir", "specdec/weights", "Where pairs live.")


TEST_SETS = {"test_2016_flickr": {"en": "test_2016_flickr.en", "de": "test_2016_flickr.de"}}
PROVENANCE = {
  "multi30k": "Multi30k task 1 raw captions (Elliott et al. 2016), multi30k/dataset @ "
  "a3d2e0d26b56f3846f66a952536ffed4e401d05a : data/task1/raw; "
  "non-commercial research and education use",
  "vocabulary": "T5's public SentencePiece model (cc_all.32000), Apache-2.0",
}


def main(argv):
  del argv
  out = pathlib.Path(FLAGS.weights_dir) / FLAGS.name
  out.mkdir(parents=True, exist_ok=True)
  previous = out / "pair.json"
  info = {}
  if previous.exists():  # Keep what this run does not replace, measurements included.
    with open(previous) as f:
      info = json.load(f)
  info.update(
    name=FLAGS.name,
    family="t5",
    alpha_test_set="multi30k_test_2016",
    task="Multi30k English->German",
    prefix=train_pair.PREFIX,
    test_sets=TEST_SETS,
    provenance=PROVENANCE,
  )
  entries = []
  if FLAGS.train_dir:
    with open(os.path.join(FLAGS.train_dir, "summary.json")) as f:
      summary = json.load(f)
    entries += [("target", "target", summary["target"]), ("draft", "draft", summary["draft"])]
  if FLAGS.distilled_dir:
    with open(os.path.join(FLAGS.distilled_dir, "summary.json")) as f:
      entries.append(("draft_distilled", "draft", json.load(f)["draft"]))
  notes = dict(entry.split("=", 1) for entry in FLAGS.note)
  unknown = sorted(set(notes) - {which for which, _, _ in entries})
  if unknown:
    raise ValueError(f"--note: no model {unknown} is packaged by this run")
  for which, preset, run in entries:
    source = pathlib.Path(run["checkpoint"])
    dest = out / which / source.name
    for stale in (out / which).glob("checkpoint_*"):  # One checkpoint per model ships.
      shutil.rmtree(stale)
    shutil.copytree(source, dest)
    history = run["history"]
    info[which] = dict(
      config=config_json(train_pair.PRESETS[preset]),
      checkpoint=str(dest.relative_to(out)),
      params=run["params"],
      training=dict(
        steps=run["steps"],
        epochs=run["epochs"],
        batch_size=run["batch_size"],
        data=run.get("data", "references"),
        minutes=round(run["seconds"] / 60, 1),
        final_val_loss=history[-1]["val_loss"],
        history=history,
      ),
    )
    if "settings" in run:
      info[which]["training"].update(
        settings=run["settings"],
        gflop_per_s=round(run["flops"] / max(run["seconds"], 1e-9) / 1e9, 1),
      )
      if "val_loss_ema" in history[-1]:
        info[which]["training"]["final_val_loss"] = history[-1]["val_loss_ema"]
    if which in notes:
      info[which]["training"]["note"] = notes[which]
    if which == "draft_distilled":
      info[which]["training"]["teacher"] = (
        "the target's greedy outputs on Multi30k train (max 48 tokens), "
        "scripts/research/train_pair.py --draft_data=distill"
      )
  for files in TEST_SETS.values():
    for name in files.values():
      shutil.copyfile(os.path.join(FLAGS.multi30k_dir, name), out / name)
  write_json(str(previous), info)
  print(f"packaged {FLAGS.name} into {out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
