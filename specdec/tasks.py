"""seqio tasks for the paper's WMT EnDe and CNN/DM evaluations and for the shipped
Multi30k pair; `import` registers them.

| task | data | preprocessing | metric |
|---|---|---|---|
| `specdec_wmt14_ende` | newstest2014, 3003 segments | "translate English to German: " | BLEU |
| `specdec_cnn_dailymail` | 250 CNN/DM test examples | "summarize: " | ROUGE |
| `specdec_multi30k_ende` | Multi30k test 2016, 1000 captions | the WMT task's | BLEU |
| `specdec_wmt14_ende_tfds` | TFDS `wmt14_translate/de-en:1.0.0` | the same | BLEU |
| `specdec_cnn_dailymail_tfds` | TFDS `cnn_dailymail:3.4.0` | the same | ROUGE |

The local tasks read the files in `specdec/data` with the readers of `specdec.data` (the
ones `python -m specdec.run` uses), so both runners see the same examples; they have a
'test' split only. The Multi30k task reads the pair's test set with
`specdec.pretrained.test_sentences` (what its model card measures). The TFDS tasks
need the user's own TFDS data (nothing is downloaded here). All of them tokenize with
T5's SentencePiece vocabulary shipped in the package, with 100 sentinels (32,100 ids),
append EOS after trimming, and score with T5's metrics (`specdec.metrics`).

Needs seqio (`pip install 'specdec[t5x]'`); `import specdec` does not import this.
"""

from __future__ import annotations

from specdec import _optional

# seqio brings TensorFlow; both are optional for specdec (the same data without seqio:
# specdec.data).
seqio = _optional.require("seqio", "t5x", purpose="specdec.tasks (seqio tasks)")
tf = _optional.require("tensorflow", "t5x", purpose="specdec.tasks (seqio tasks)")

# After the checks above, so that a missing seqio fails first, with its install hint.
from specdec import (  # noqa: E402 - after the optional-dependency checks, on purpose
  data,
  metrics,
  pretrained,
)

MULTI30K_PAIR = "multi30k_ende"
MULTI30K_SPLIT = "test_2016_flickr"
MULTI30K_TASK = "specdec_multi30k_ende"
WMT_TFDS_TASK = data.WMT_TASK + "_tfds"
CNNDM_TFDS_TASK = data.CNNDM_TASK + "_tfds"
TFDS_SPLITS = ("train", "validation", "test")


def vocabulary() -> seqio.SentencePieceVocabulary:
  """T5's SentencePiece vocabulary from the package, with 100 sentinels (32,100 ids)."""
  return seqio.SentencePieceVocabulary(str(data.VOCAB_FILE), extra_ids=data.EXTRA_IDS)


def output_features() -> dict[str, seqio.Feature]:
  """T5's 'inputs' and 'targets': the shared vocabulary, EOS-terminated."""
  vocab = vocabulary()
  return {
    "inputs": seqio.Feature(vocabulary=vocab, add_eos=True),
    "targets": seqio.Feature(vocabulary=vocab, add_eos=True),
  }


@seqio.map_over_dataset
def translate_en_de(x):
  """{'en', 'de'} -> {'inputs': 'translate English to German: ' + en, 'targets': de}."""
  return {"inputs": tf.strings.join([data.TRANSLATE_PREFIX, x["en"]]), "targets": x["de"]}


@seqio.map_over_dataset
def summarize(x):
  """{'article', 'highlights'} -> {'inputs': 'summarize: ' + article, 'targets': ...}."""
  return {
    "inputs": tf.strings.join([data.SUMMARIZE_PREFIX, x["article"]]),
    "targets": x["highlights"],
  }


# The tf.data twins of `data.translate_en_de` and `data.summarize`.
PREPROCESSORS = {data.WMT_TASK: translate_en_de, data.CNNDM_TASK: summarize}


def local_source(task: str) -> seqio.FunctionDataSource:
  """The shipped test data of `task` (a `specdec.data.TASKS` name) as a seqio source.

  Examples keep the raw fields of the task's TFDS dataset ('en'/'de', or
  'id'/'article'/'highlights'), so local and TFDS tasks share their preprocessing.
  """
  spec = data.task_spec(task)

  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    # One file per split: there is nothing to shuffle at the file level.
    del shuffle_files, seed
    if split != data.TEST_SPLIT:
      raise ValueError(f"split: {task} has only the {data.TEST_SPLIT!r} split, got {split!r}")
    examples = spec.read()
    return tf.data.Dataset.from_tensor_slices(
      {key: [example[key] for example in examples] for key in examples[0]}
    )

  return seqio.FunctionDataSource(dataset_fn, splits=[data.TEST_SPLIT])


def multi30k_source() -> seqio.FunctionDataSource:
  """The test set shipped with the `multi30k_ende` pair, {'en', 'de'} per example (the
  raw fields of the WMT task, whose preprocessing and metric it shares)."""

  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del shuffle_files, seed
    if split != data.TEST_SPLIT:
      raise ValueError(
        f"split: {MULTI30K_TASK} has only the {data.TEST_SPLIT!r} split, got {split!r}"
      )
    pairs = pretrained.test_sentences(MULTI30K_PAIR, MULTI30K_SPLIT)
    return tf.data.Dataset.from_tensor_slices(
      {"en": [en for en, _ in pairs], "de": [de for _, de in pairs]}
    )

  return seqio.FunctionDataSource(dataset_fn, splits=[data.TEST_SPLIT])


def add_task(name: str, source: seqio.DataSourceInterface, like: str) -> seqio.Task:
  """Registers task `name` over `source` with the preprocessing and metric of `like`.

  Args:
    name: the new task's seqio name.
    source: a seqio data source whose examples have the raw fields of `like`.
    like: `specdec.data.WMT_TASK` or `specdec.data.CNNDM_TASK`.

  Returns:
    The registered `seqio.Task`: T5's text preprocessing, tokenization with
    `vocabulary()`, EOS after trimming, and BLEU or ROUGE.
  """
  spec = data.task_spec(like)
  return seqio.TaskRegistry.add(
    name,
    source=source,
    output_features=output_features(),
    preprocessors=[
      PREPROCESSORS[like],
      seqio.preprocessors.tokenize,
      seqio.preprocessors.append_eos_after_trim,
    ],
    metric_fns=[metrics.metric_fn(spec.metric)],
  )


def register() -> None:
  """Registers the tasks of the table above (a no-op for those already there)."""
  registered = set(seqio.TaskRegistry.names())
  if MULTI30K_TASK not in registered:
    add_task(MULTI30K_TASK, multi30k_source(), data.WMT_TASK)
  for like in (data.WMT_TASK, data.CNNDM_TASK):
    if like not in registered:
      add_task(like, local_source(like), like)
    tfds_name = like + "_tfds"
    if tfds_name not in registered:
      add_task(
        tfds_name,
        seqio.TfdsDataSource(tfds_name=data.task_spec(like).tfds_name, splits=TFDS_SPLITS),
        like,
      )


register()
