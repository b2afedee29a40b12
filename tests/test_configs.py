"""Every gin file in configs/ parses, and builds the objects it names.

Files that import t5x (runs/infer*.gin) are parsed for syntax here; the t5x-marked test
below, and tests/test_t5x.py's `t5x.infer` runs, resolve and build them for real.
"""

import pathlib
import sys

import jax.numpy as jnp
import pytest

pytest.importorskip("gin", reason="gin-config is not installed (specdec[t5x])")
import gin
from gin import config_parser

from specdec import data, pretrained, t5x as specdec_t5x
from specdec.distributions import SamplingConfig
from specdec.models import t5, t5x_decoder

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
ALL_FILES = sorted(CONFIGS.rglob("*.gin"))
T5X_FILES = [p for p in ALL_FILES if "from t5x import" in p.read_text()]
PLAIN_FILES = [p for p in ALL_FILES if p not in T5X_FILES]
SIZES = ("small", "base", "large", "xl", "xxl")
DRAFTS = ("small", "base", "large")
# Table 2 of the paper: gamma per (task, temperature) for the small/base/large drafts.
TABLE2_GAMMA = {
  ("wmt_ende", 0): (7, 7, 7),
  ("wmt_ende", 1): (7, 5, 3),
  ("cnndm", 0): (5, 5, 3),
  ("cnndm", 1): (5, 3, 3),
}
TASK_NAMES = {"wmt_ende": data.WMT_TASK, "cnndm": data.CNNDM_TASK}
DECODER_ONLY_SIZES = ("base", "large", "xl", "xxl")
# The run file each T5X file is built with (their models take different networks;
# None: the file is a whole run).
T5X_RUN_FILE = {
  "infer_decoder_only.gin": "decoder_only_wmt_ende_t0.gin",
  "multi30k_ende_infer.gin": None,
}
MULTI30K_TASK = "specdec_multi30k_ende"


def _name(path: pathlib.Path) -> str:
  return str(path.relative_to(REPO))


@pytest.fixture(autouse=True)
def fresh_gin():
  gin.clear_config(clear_constants=False)
  # Where specdec.run and T5X users find the configs: inside the installed package.
  gin.add_config_file_search_path(specdec_t5x.gin_search_path())
  yield
  gin.clear_config(clear_constants=False)


def _built(value):
  """A queried gin value with its references (macros, @x()) evaluated."""
  while isinstance(value, gin.config.ConfigurableReference):
    value = value.scoped_configurable_fn()
  return value


def _macro(name: str):
  return _built(gin.query_parameter(f"%{name}"))


def _same_config(built: t5.T5Config, preset: t5.T5Config) -> bool:
  return built.replace(dtype=jnp.dtype(built.dtype)) == preset.replace(
    dtype=jnp.dtype(preset.dtype)
  )


def test_the_expected_files_exist():
  names = {_name(p) for p in ALL_FILES}
  assert {f"configs/models/t5_1_1_{s}.gin" for s in SIZES} <= names
  assert {f"configs/pairs/xxl_{d}.gin" for d in DRAFTS} <= names
  assert {
    f"configs/runs/{task}_t{t}_{d}.gin" for (task, t) in TABLE2_GAMMA for d in DRAFTS
  } <= names
  assert {"configs/runs/infer.gin", "configs/runs/infer_decode_fn.gin"} <= names
  assert {f"configs/models/decoder_only_{s}.gin" for s in DECODER_ONLY_SIZES} <= names
  assert {
    "configs/pairs/decoder_only_xxl_base.gin",
    "configs/runs/decoder_only_wmt_ende_t0.gin",
    "configs/runs/infer_decoder_only.gin",
  } <= names
  assert {
    "configs/pairs/multi30k_ende.gin",
    "configs/runs/multi30k_ende.gin",
    "configs/runs/multi30k_ende_infer.gin",
  } <= names


@pytest.mark.parametrize("path", ALL_FILES, ids=_name)
def test_every_file_parses(path):
  # Syntax and structure only: no import, no reference resolved.
  statements = list(
    config_parser.ConfigParser(path.read_text(), gin.config.ParserDelegate(skip_unknown=True))
  )
  assert statements


@pytest.mark.parametrize("size", SIZES)
def test_model_files_build_the_t5_1_1_presets(size):
  gin.parse_config_file(str(CONFIGS / "models" / f"t5_1_1_{size}.gin"))
  module = _macro(f"T5_1_1_{size.upper()}")
  assert isinstance(module, t5.Transformer)
  assert _same_config(module.config, t5.CONFIGS[f"t5_1_1_{size}"])


@pytest.mark.parametrize("size", DECODER_ONLY_SIZES)
def test_decoder_only_model_files_build_the_t5x_decoder_only_presets(size):
  gin.parse_config_file(str(CONFIGS / "models" / f"decoder_only_{size}.gin"))
  module = _macro(f"DECODER_ONLY_{size.upper()}")
  assert isinstance(module, t5x_decoder.Transformer)
  assert _same_config(module.config, t5x_decoder.CONFIGS[size])


def test_decoder_only_run_file_binds_the_pair_and_a_prefix_lm():
  gin.parse_config_file(str(CONFIGS / "runs" / "decoder_only_wmt_ende_t0.gin"))
  assert _same_config(_macro("TARGET_MODULE").config, t5x_decoder.CONFIGS["xxl"])
  assert _same_config(_macro("DRAFT_MODULE").config, t5x_decoder.CONFIGS["base"])
  # T5X publishes no decoder-only checkpoints: the user must name them.
  assert _macro("TARGET_CHECKPOINT_PATH") is gin.REQUIRED
  assert _macro("DRAFT_CHECKPOINT_PATH") is gin.REQUIRED
  assert _macro("TASK") == data.WMT_TASK
  assert (_macro("GAMMA"), _macro("TEMPERATURE")) == (7, 0.0)
  assert _macro("INPUTS_BIDIRECTIONAL_ATTENTION") is True


@pytest.mark.parametrize("draft", DRAFTS)
def test_pair_files_build_table2_pairs(draft):
  gin.parse_config_file(str(CONFIGS / "pairs" / f"xxl_{draft}.gin"))
  assert _same_config(_macro("TARGET_MODULE").config, t5.CONFIGS["t5_1_1_xxl"])
  assert _same_config(_macro("DRAFT_MODULE").config, t5.CONFIGS[f"t5_1_1_{draft}"])
  base = "gs://t5-data/pretrained_models/t5x"
  assert _macro("TARGET_CHECKPOINT_PATH") == f"{base}/t5_1_1_xxl/checkpoint_1000000"
  assert _macro("DRAFT_CHECKPOINT_PATH") == f"{base}/t5_1_1_{draft}/checkpoint_1000000"


@pytest.mark.parametrize(
  "task,temperature,draft", [(task, t, d) for (task, t) in TABLE2_GAMMA for d in DRAFTS]
)
def test_run_files_bind_table2_settings_to_specdec_run(task, temperature, draft):
  gin.parse_config_file(str(CONFIGS / "runs" / f"{task}_t{temperature}_{draft}.gin"))
  expected_gamma = TABLE2_GAMMA[(task, temperature)][DRAFTS.index(draft)]
  assert _macro("GAMMA") == expected_gamma
  assert _macro("BATCH_SIZE") == 1
  assert _macro("TASK") == TASK_NAMES[task]
  assert set(_macro("TASK_FEATURE_LENGTHS")) == {"inputs", "targets"}
  assert _same_config(_macro("DRAFT_MODULE").config, t5.CONFIGS[f"t5_1_1_{draft}"])
  # What specdec.run calls: evaluate's bindings, built.
  bound = {
    name: _built(gin.query_parameter(f"specdec.run.evaluate.{name}"))
    for name in ("task", "gamma", "sampling", "target_module", "batch_size")
  }
  assert bound["sampling"] == SamplingConfig(temperature=float(temperature))
  assert bound["gamma"] == expected_gamma and bound["batch_size"] == 1
  assert bound["task"] == TASK_NAMES[task]
  assert _same_config(bound["target_module"].config, t5.CONFIGS["t5_1_1_xxl"])


def test_multi30k_pair_file_is_the_shipped_pair_with_its_checkpoints():
  gin.parse_config_file("configs/pairs/multi30k_ende.gin")
  info = pretrained.pair_info("multi30k_ende")
  for role, which in (("TARGET", "target"), ("DRAFT", "draft_distilled")):
    config = _macro(f"{role}_MODULE").config
    assert jnp.dtype(config.dtype) == jnp.float32
    assert config == t5.T5Config(
      **{
        **info[which]["config"],
        "dtype": config.dtype,
        "mlp_activations": ("gelu", "linear"),
        "dropout_rate": 0.0,
      }
    )
    path = pathlib.Path(_macro(f"{role}_CHECKPOINT_PATH"))
    assert path == pretrained.pair_dir("multi30k_ende") / info[which]["checkpoint"]
    assert list(path.glob("*/.zarray"))


def test_multi30k_task_file_holds_every_example_whole():
  gin.parse_config_file("configs/runs/multi30k_ende.gin")
  assert _macro("TASK") == MULTI30K_TASK and _macro("BATCH_SIZE") == 1
  lengths = _macro("TASK_FEATURE_LENGTHS")
  vocab = data.Vocabulary()
  pairs = pretrained.test_sentences("multi30k_ende")
  # +1: EOS.
  assert (
    max(len(vocab.encode(data.TRANSLATE_PREFIX + en)) + 1 for en, _ in pairs) <= lengths["inputs"]
  )
  assert max(len(vocab.encode(de)) + 1 for _, de in pairs) <= lengths["targets"]


@pytest.mark.parametrize(
  "pair,which,error",
  [
    ("multi30k_ende", "draft_x", "which must be one of \\['target', 'draft'"),
    ("wmt", "target", "name: unknown pair"),
    ("smollm2_135m_instruct", "target", "decoder-only LM pair"),
  ],
)
def test_shipped_checkpoint_names_bad_arguments(pair, which, error):
  with pytest.raises(ValueError, match=error):
    specdec_t5x.shipped_checkpoint(pair, which)


def test_output_dir_is_required():
  gin.parse_config_file(str(CONFIGS / "runs" / "wmt_ende_t0_small.gin"))
  assert _macro("OUTPUT_DIR") is gin.REQUIRED


@pytest.mark.t5x
@pytest.mark.parametrize("path", T5X_FILES, ids=_name)
def test_t5x_files_build_their_model(path, monkeypatch):
  t5x_infer = pytest.importorskip(
    "t5x.infer", reason="t5x is not installed (not on PyPI; see specdec.t5x)"
  )
  import t5x

  # T5X's runs/infer.gin binds `__main__.infer`, which `python -m t5x.infer` provides.
  monkeypatch.setattr(sys.modules["__main__"], "infer", t5x_infer.infer, raising=False)
  gin.add_config_file_search_path(str(pathlib.Path(t5x.__file__).parent.parent))
  run_file = T5X_RUN_FILE.get(path.name, "wmt_ende_t0_small.gin")
  if run_file is None:
    gin.parse_config_files_and_bindings([str(path)], ["OUTPUT_DIR = '/tmp/unused'"])
  else:
    gin.parse_config_files_and_bindings(
      [str(path), str(CONFIGS / "runs" / run_file)],
      [
        "OUTPUT_DIR = '/tmp/unused'",
        "TARGET_CHECKPOINT_PATH = '/tmp/unused'",
        "DRAFT_CHECKPOINT_PATH = '/tmp/unused'",
      ],
    )
  model = _macro("MODEL")
  task = MULTI30K_TASK if path.name == "multi30k_ende_infer.gin" else data.WMT_TASK
  assert _macro("MIXTURE_OR_TASK_NAME") == task
  assert model.output_vocabulary.vocab_size == 32100
  if path.name == "infer_decoder_only.gin":
    assert type(model).__name__ == "SpeculativeDecoderOnlyModel"
    assert model.gamma == 7 and model.sampling == SamplingConfig(temperature=0.0)
    assert model._inputs_bidirectional_attention
  if path.name in ("infer.gin", "multi30k_ende_infer.gin"):
    assert type(model).__name__ == "SpeculativeEncoderDecoderModel"
    assert model.gamma == 7 and model.sampling == SamplingConfig(temperature=0.0)
    restore = gin.query_parameter("utils.RestoreCheckpointConfig.state_transformation_fns")
    assert len(restore) == 1
  if path.name == "multi30k_ende_infer.gin":
    # Nothing left to set but OUTPUT_DIR: the checkpoints are the package's own.
    assert pathlib.Path(_macro("CHECKPOINT_PATH")) == pathlib.Path(
      specdec_t5x.shipped_checkpoint("multi30k_ende", "target")
    )
    assert gin.query_parameter("utils.RestoreCheckpointConfig.dtype") == "float32"
    info = pretrained.pair_info("multi30k_ende")
    assert model.module.config.emb_dim == info["target"]["config"]["emb_dim"] == 256
    assert model.draft_module.config.emb_dim == info["draft_distilled"]["config"]["emb_dim"] == 32
