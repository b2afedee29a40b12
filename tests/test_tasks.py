"""The shipped data, its plain readers, T5's metrics, and the seqio tasks over them."""

import hashlib
import json

import numpy as np
import pytest

from specdec import data, metrics

HOUSE = "The house is wonderful."
HOUSE_IDS = [13959, 1566, 12, 2968, 10, 37, 629, 19, 1627, 5, 1]
# sha256 of the shipped files (PROVENANCE.md).
SHA256 = {
  data.WMT14_EN_FILE: "7294bccf2879a97b3706b95c9595f1459617a8ee7130d5d8581c910e69736971",
  data.WMT14_DE_FILE: "ae5d110486bc33d7175e9e28c7d0051eb3e5fcd2166dd93371089852c091a20e",
  data.CNNDM_FILE: "a378d57f8a5b45d3f33094292071fbcc1920fdbd351f82a00e3b477c88edc5bb",
  data.VOCAB_FILE: "d60acb128cf7b7f2536e8f38a5b18a05535c9e14c7a355904270e15b0945ea86",
}
SIZES = {data.WMT_TASK: 3003, data.CNNDM_TASK: 250}
LENGTHS = {"inputs": 512, "targets": 256}


# ------------------------------------------------------------------ plain Python
@pytest.mark.parametrize("path", list(SHA256), ids=lambda p: p.name)
def test_shipped_files_are_the_recorded_ones(path):
  assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256[path]
  assert path.name in (data.DATA_DIR / "PROVENANCE.md").read_text()


@pytest.mark.parametrize("task", list(SIZES))
def test_plain_loaders_yield_the_shipped_examples(task):
  examples = data.load_examples(task)
  assert len(examples) == SIZES[task]
  prefix = data.TRANSLATE_PREFIX if task == data.WMT_TASK else data.SUMMARIZE_PREFIX
  assert all(e["inputs"].startswith(prefix) and e["targets"] for e in examples)


def test_plain_loaders_keep_lines_whole():
  en = data.read_lines(data.WMT14_EN_FILE)
  assert en[0] == "Gutach: Increased safety for pedestrians" and len(en) == 3003
  cnndm = data.load_examples(data.CNNDM_TASK)
  first = json.loads(data.CNNDM_FILE.read_text(encoding="utf-8").split("\n")[0])
  assert cnndm[0]["inputs"] == "summarize: " + first["article"]
  assert cnndm[0]["targets"] == first["highlights"]


def test_vocabulary_encodes_as_t5():
  vocab = data.Vocabulary()
  assert vocab.vocab_size == 32100
  assert vocab.encode(data.TRANSLATE_PREFIX + HOUSE) + [data.EOS_ID] == HOUSE_IDS
  padded = vocab.encode_padded(data.TRANSLATE_PREFIX + HOUSE, 16)
  assert padded.dtype == np.int32 and padded.tolist() == HOUSE_IDS + [0] * 5
  assert vocab.encode_padded(data.TRANSLATE_PREFIX + HOUSE, 4).tolist() == (
    HOUSE_IDS[:3] + [data.EOS_ID]
  )
  assert vocab.decode(HOUSE_IDS + [0, 0, 57, 99]) == data.TRANSLATE_PREFIX + HOUSE
  assert vocab.encode("<extra_id_0>") == [32099]
  # Ids past the 32,100 of the vocabulary (the embedding has 32,128) decode as UNK.
  assert vocab.decode([32127, 1]) == vocab.decode([2, 1])


@pytest.mark.parametrize(
  "call,error",
  [
    (lambda: data.load_examples("wmt"), "task: unknown task"),
    (lambda: data.load_examples(data.WMT_TASK, "train"), "split"),
    (lambda: data.read_lines("/no/such/file"), "no such file"),
    (lambda: data.Vocabulary("/no/such.model"), "model_file"),
    (lambda: data.Vocabulary(extra_ids=-1), "extra_ids"),
    (lambda: data.Vocabulary().encode_padded("x", 1), "length"),
    (lambda: metrics.metric_fn("meteor"), "metric: unknown"),
    (lambda: metrics.bleu(["a"], ["a", "b"]), "same length"),
    (lambda: metrics.rouge([], []), "no examples"),
  ],
)
def test_bad_arguments_are_named(call, error):
  with pytest.raises((ValueError, TypeError, FileNotFoundError), match=error):
    call()


def test_read_parallel_and_jsonl_check_their_files(tmp_path):
  (tmp_path / "a").write_text("x\ny\n")
  (tmp_path / "b").write_text("x\n")
  with pytest.raises(ValueError, match="not line-aligned"):
    data.read_parallel(tmp_path / "a", tmp_path / "b", "en", "de")
  (tmp_path / "c.jsonl").write_text('{"article": "x"}\n')
  with pytest.raises(ValueError, match=r"c.jsonl:1: missing field"):
    data.read_jsonl(tmp_path / "c.jsonl", ("article", "highlights"))


def test_metrics_of_references_against_themselves_are_perfect():
  wmt = data.load_examples(data.WMT_TASK)
  targets = [e["targets"] for e in wmt]
  assert metrics.bleu(targets, targets) == {"bleu": pytest.approx(100.0)}
  # 100 summaries: rouge-score's bootstrap is slow, and 100 make the point.
  summaries = [e["targets"] for e in data.load_examples(data.CNNDM_TASK)][:100]
  assert metrics.rouge(summaries, summaries) == {
    k: pytest.approx(100.0) for k in metrics.ROUGE_KEYS
  }
  # A negative control: references against other references score low.
  assert metrics.bleu(targets[:100], targets[1:101])["bleu"] < 5
  assert metrics.rouge(summaries[:50], summaries[1:51])["rouge2"] < 20


# ------------------------------------------------------------------ seqio
@pytest.fixture(scope="module")
def seqio_tasks():
  pytest.importorskip("seqio", reason="seqio is not installed (specdec[t5x])")
  import specdec.tasks

  return specdec.tasks


def _dataset(task, lengths=None):
  import seqio

  return seqio.get_mixture_or_task(task).get_dataset(
    sequence_length=lengths or LENGTHS, split="test", shuffle=False
  )


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_seqio_wmt_task_encodes_as_t5(seqio_tasks):
  import seqio
  import tensorflow as tf

  source = seqio.FunctionDataSource(
    lambda split, shuffle_files: tf.data.Dataset.from_tensor_slices(
      {"en": [HOUSE], "de": ["Das Haus ist wunderbar."]}
    ),
    splits=["test"],
  )
  name = "specdec_test_house"
  seqio.TaskRegistry.remove(name)
  seqio_tasks.add_task(name, source, data.WMT_TASK)
  example = next(_dataset(name, {"inputs": 64, "targets": 64}).as_numpy_iterator())
  seqio.TaskRegistry.remove(name)
  assert example["inputs"].tolist() == HOUSE_IDS
  assert example["inputs_pretokenized"].decode() == data.TRANSLATE_PREFIX + HOUSE


@pytest.mark.parametrize("task", list(SIZES))
def test_seqio_tasks_yield_the_shipped_examples_as_specdec_run_sees_them(seqio_tasks, task):
  vocab = data.Vocabulary()
  plain = data.load_examples(task)
  examples = list(_dataset(task).as_numpy_iterator())
  assert len(examples) == SIZES[task]
  for ours, theirs in zip(plain, examples):
    assert theirs["inputs_pretokenized"].decode() == ours["inputs"]
    assert theirs["targets_pretokenized"].decode() == ours["targets"]
    ids = vocab.encode_padded(ours["inputs"], LENGTHS["inputs"])
    assert theirs["inputs"].tolist() == ids[ids > 0].tolist()


def test_seqio_vocabulary_and_metrics(seqio_tasks):
  import seqio

  vocab = seqio_tasks.vocabulary()
  assert vocab.vocab_size == 32100 and vocab.eos_id == 1
  assert vocab.decode(HOUSE_IDS + [0, 7]) == data.Vocabulary().decode(HOUSE_IDS)
  wmt = seqio.get_mixture_or_task(data.WMT_TASK)
  cnndm = seqio.get_mixture_or_task(data.CNNDM_TASK)
  assert [f.__name__ for f in wmt.metric_fns] == ["bleu"]
  assert [f.__name__ for f in cnndm.metric_fns] == ["rouge"]
  targets = ["Das Haus ist wunderbar.", "Ein zweiter Satz."]
  assert wmt.metric_fns[0](targets, targets)["bleu"] == pytest.approx(100.0)


def test_tfds_variants_are_registered_and_not_read(seqio_tasks):
  import seqio

  for task, tfds_name in (
    (seqio_tasks.WMT_TFDS_TASK, "wmt14_translate/de-en:1.0.0"),
    (seqio_tasks.CNNDM_TFDS_TASK, "cnn_dailymail:3.4.0"),
  ):
    registered = seqio.get_mixture_or_task(task)
    assert registered.source.tfds_dataset.name == tfds_name
    assert set(registered.splits) == {"train", "validation", "test"}


def test_local_source_rejects_other_splits(seqio_tasks):
  source = seqio_tasks.local_source(data.WMT_TASK)
  with pytest.raises(ValueError, match="split"):
    source.get_dataset(split="train")


def test_seqio_multi30k_task_yields_the_shipped_pairs_test_set(seqio_tasks):
  import seqio

  from specdec import pretrained

  pairs = pretrained.test_sentences("multi30k_ende")
  examples = list(
    _dataset(seqio_tasks.MULTI30K_TASK, {"inputs": 64, "targets": 64}).as_numpy_iterator()
  )
  assert len(examples) == len(pairs) == 1000
  for (en, de), theirs in zip(pairs, examples):
    assert theirs["inputs_pretokenized"].decode() == data.TRANSLATE_PREFIX + en
    assert theirs["targets_pretokenized"].decode() == de
  task = seqio.get_mixture_or_task(seqio_tasks.MULTI30K_TASK)
  assert [f.__name__ for f in task.metric_fns] == ["bleu"]
  with pytest.raises(ValueError, match="split"):
    seqio_tasks.multi30k_source().get_dataset(split="validation")
