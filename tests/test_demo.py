"""The README's first command runs end to end: `python -m specdec.bench demo`
(`specdec.bench.demo`), the paper's Table 2 in shape (EnDe, CNN/DM, Chat), on tiny
models in the default suite and on the shipped pairs behind the slow marker; and the
command line's persistent compilation cache (`specdec.bench.compile_cache`)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from specdec import _cache, adaptive, data, pretrained, sample
from specdec.bench import compile_cache, demo as bench_demo, demo_prompts
from specdec.data import lm_prompts
from specdec.models import llama, t5


class _ByteTokenizer:
  """A stand-in chat tokenizer: one id per byte of a fixed chat rendering."""

  eos_id, pad_id = 2, 1

  def apply_chat_template(self, messages, add_generation_prompt=True):
    return [3 + (b % 60) for b in f"<u>{messages[0]['content']}<a>".encode()]

  def decode(self, ids):
    return " ".join(map(str, ids))


class _ByteVocab:
  """A stand-in T5 vocabulary: one id per byte, EOS 1, then padding (`pad_id`)."""

  def __init__(self, pad_id=0):
    self.pad_id = pad_id

  def encode_padded(self, text, length):
    ids = [3 + (b % 60) for b in text.encode()][: length - 1] + [data.EOS_ID]
    return np.asarray(ids + [self.pad_id] * (length - len(ids)), np.int32)

  def decode(self, ids):
    return " ".join(map(str, ids))


def _tiny_llamas(pad_id):
  target_cfg = llama.tiny_config()
  draft_cfg = llama.tiny_config(num_layers=1, hidden_size=16, num_heads=2, num_kv_heads=1)
  return (
    llama.Llama(
      target_cfg, llama.random_params(target_cfg, 0), pad_id=pad_id
    ).with_packed_weights(),
    llama.Llama(draft_cfg, llama.random_params(draft_cfg, 1), pad_id=pad_id).with_packed_weights(),
  )


def _tiny_pairs(monkeypatch, t5_pair=True):
  """The shipped pairs replaced by tiny random models, with model cards naming
  gammas and AutoGamma rules; returns the rules asked for.

  `t5_pair`: EnDe runs a tiny T5; else the decoder-only pair's own tiny Llamas, fed
  the encoded sentences as prompts (padding 0, EOS 1: the byte tokenizer's EOS), so
  that all three tasks run the same compiled programs (the fast variant)."""
  if t5_pair:
    lm_pair = (*_tiny_llamas(pad_id=1), _ByteTokenizer())
    t5_cfg, t5_draft_cfg = t5.tiny_config(), t5.tiny_config(num_decoder_layers=1)
    ende_pair = (
      t5.T5(t5_cfg, t5.random_params(t5_cfg, 2)),
      t5.T5(t5_draft_cfg, t5.random_params(t5_draft_cfg, 3)),
      _ByteVocab(),
    )
  else:
    tokenizer = _ByteTokenizer()
    tokenizer.eos_id, tokenizer.pad_id = data.EOS_ID, 0
    lm_pair = (*_tiny_llamas(pad_id=0), tokenizer)
    ende_pair = (*lm_pair[:2], _ByteVocab(pad_id=0))

  def load_pair(name, draft="draft"):
    assert draft == "draft", draft
    return {bench_demo.LM_PAIR: lm_pair, bench_demo.T5_PAIR: ende_pair}[name]

  cards = {
    bench_demo.LM_PAIR: {
      "best_gamma": {"0": 2, "1": 3},
      "context_lookup": {"weight": 0.9, "best_gamma": {"0": 4, "1": 1}},
    },
    bench_demo.T5_PAIR: {
      "metrics": {
        "best": {
          "multi30k_test_2016": [{"temperature": 0.0, "gamma": 2}, {"temperature": 1.0, "gamma": 1}]
        }
      }
    },
  }
  rules = []

  def auto_gamma(name, temperature, batch, draft):
    rules.append((name, temperature, batch, draft))
    return adaptive.AutoGamma.from_c(0.05, gammas=(0, 1, 2), prior=0.5)

  monkeypatch.setattr(pretrained, "load_pair", load_pair)
  monkeypatch.setattr(pretrained, "pair_info", lambda name: cards[name])
  monkeypatch.setattr(pretrained, "best_draft", lambda name, temperature: "draft")
  monkeypatch.setattr(pretrained, "auto_gamma", auto_gamma)
  monkeypatch.setattr(
    pretrained,
    "test_sentences",
    lambda name: [
      ("A dog runs.", "Ein Hund rennt."),
      ("Two men talk.", "Zwei Männer reden."),
      ("A red car.", "Ein rotes Auto."),
    ],
  )
  # Short articles: the byte tokenizer's prompts then fit the tiny Llama's positions,
  # all of them padded to 64.
  monkeypatch.setattr(demo_prompts, "ARTICLE_MAX_CHARS", 40)
  return rules


def _check_rows(result, temperatures):
  rows = result["rows"]
  assert [(r["task"], r["temperature"]) for r in rows] == [
    (task, t) for task in bench_demo.TASKS for t in temperatures
  ]
  for r in rows:
    assert 0.0 <= r["alpha"] <= 1.0 and r["c"] > 0 and r["v"] > 0
    assert r["speedup"] > 0 and r["predicted_speedup"] > 0
    assert r["auto_speedup"] > 0 and r["auto_predicted_speedup"] > 0
    assert sum(r["auto_histogram"].values()) > 0
    assert r["nonfinite_positions"] == 0
    if r["temperature"] == 0.0:
      # Both speculative decodes give the baseline's greedy output token for token.
      assert r["identical_fixed"] and r["identical_auto"] and r["identical_to_baseline"]
    else:
      assert "identical_to_baseline" not in r
  assert set(result["examples"]) == set(bench_demo.TASKS)


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_the_demo_runs_all_three_tasks_on_tiny_models(monkeypatch):
  """The fast variant: one tiny Llama pair serves all three tasks, so that the whole
  demo compiles three decode loops (`test_the_demo_runs_both_temperatures_on_tiny_pairs`
  runs a tiny T5 for EnDe)."""
  rules = _tiny_pairs(monkeypatch, t5_pair=False)
  config = bench_demo.Config(
    quick=True,
    num_sentences=2,
    num_articles=2,
    num_prompts=2,
    lm_max_new_tokens=6,
    max_new_tokens=6,
    input_length=64,
    lm_draft="draft",
    progress=False,
  )
  lowered = []
  for name in ("lower_speculative_sample", "lower_autoregressive_sample"):
    lower = getattr(sample, name)
    monkeypatch.setattr(
      sample, name, lambda *a, lower=lower, name=name, **k: lowered.append(name) or lower(*a, **k)
    )
  result = bench_demo.run(config)
  _check_rows(result, (0.0,))
  # Every program lowered ahead of time, once: per pair a baseline, a fixed gamma and
  # a rule; CNN/DM and Chat share SmolLM2's three.
  assert sorted(lowered) == ["lower_autoregressive_sample"] * 2 + ["lower_speculative_sample"] * 4
  by_task = {r["task"]: r for r in result["rows"]}
  # The card's gamma per pair, draft and temperature; the rule of the same draft.
  assert [by_task[t]["gamma"] for t in bench_demo.TASKS] == [2, 2, 2]
  assert [by_task[t]["draft"] for t in bench_demo.TASKS] == ["draft"] * 3
  assert rules == [
    (bench_demo.T5_PAIR, 0.0, 1, "draft"),
    (bench_demo.LM_PAIR, 0.0, 1, "draft"),
    (bench_demo.LM_PAIR, 0.0, 1, "draft"),
  ]
  assert result["settings"]["cnndm_articles"] == list(demo_prompts.CNNDM_ARTICLES[:2])
  # Both decoder-only tasks' prompts padded to one length: one compile per decoder.
  assert result["settings"]["lm_prompt_length"] == 64
  assert [len(result["examples"][t]) for t in bench_demo.TASKS] == [2, 2, 2]
  assert result["examples"]["ende"][0]["reference"] == "Ein Hund rennt."
  assert result["examples"]["cnndm"][0]["source"].startswith(demo_prompts.SUMMARIZE)
  assert result["examples"]["chat"][1]["source"] == lm_prompts.DEMO_PROMPTS[1]
  seconds = result["seconds"]
  assert seconds["compile"] > 0 and seconds["decode"] > 0
  assert len(seconds["programs"]) == 6
  assert all(p["compile"] > 0 and p["trace_and_lower"] > 0 for p in seconds["programs"])
  assert seconds["total"] == pytest.approx(seconds["load"] + seconds["compile"] + seconds["decode"])
  text = bench_demo.render(result)
  for name in ("EnDe", "CNN/DM", "Chat", "meas / pred", "compiling", "REF  Ein Hund"):
    assert name in text, name
  json.dumps(result)


@pytest.mark.slow
def test_the_demo_runs_both_temperatures_on_tiny_pairs(monkeypatch, tmp_path):
  rules = _tiny_pairs(monkeypatch)
  result = bench_demo.run(
    bench_demo.Config(
      num_sentences=2,
      num_articles=1,
      num_prompts=2,
      lm_max_new_tokens=6,
      max_new_tokens=6,
      progress=False,
      plot=str(tmp_path / "plot.png"),
    )
  )
  _check_rows(result, (0.0, 1.0))
  # The card's gamma per pair, draft ("+lookup": its own) and temperature.
  assert [r["gamma"] for r in result["rows"]] == [2, 1, 4, 1, 4, 1]
  assert [r["draft"] for r in result["rows"]] == ["draft"] * 2 + ["draft+lookup"] * 4
  assert len(rules) == 6
  assert (tmp_path / "plot.png").stat().st_size > 1000


def test_the_demo_config_is_checked():
  for config, name in [
    (bench_demo.Config(tasks=("nope",)), "tasks"),
    (bench_demo.Config(num_prompts=0), "num_prompts"),
    (bench_demo.Config(temperatures=(-1.0,)), "temperatures"),
    (bench_demo.Config(quick=True, full=True), "quick"),
    (bench_demo.Config(gamma=0), "gamma"),
    (bench_demo.Config(lm_draft="draft_full"), "lm_draft"),
  ]:
    with pytest.raises(ValueError, match=name):
      bench_demo.run(config)
  with pytest.raises(ValueError, match="num_articles"):
    demo_prompts.cnndm_articles(len(demo_prompts.CNNDM_ARTICLES) + 1)


def test_the_presets_and_explicit_options():
  quick = bench_demo.settings(bench_demo.Config(quick=True))
  assert quick["temperatures"] == (0.0,) and quick["num_prompts"] == 2
  default = bench_demo.settings(bench_demo.Config())
  assert default["temperatures"] == (0.0, 1.0)
  assert bench_demo.settings(bench_demo.Config(quick=True, num_prompts=5))["num_prompts"] == 5
  full = bench_demo.settings(bench_demo.Config(full=True))
  assert full["num_articles"] == len(demo_prompts.CNNDM_ARTICLES)


def test_lm_inputs_pad_every_prompt_to_one_length_with_the_pad_id():
  inputs = bench_demo.lm_inputs(_ByteTokenizer(), ["x", "y" * 70], pad_id=1)
  assert [x.shape for x in inputs] == [(1, 128), (1, 128)]  # 7 and 76 bytes
  assert int(inputs[0][0, 6]) != 1 and int(inputs[0][0, 7]) == 1
  assert [x.shape for x in bench_demo.lm_inputs(_ByteTokenizer(), ["x"], 1)] == [(1, 64)]


def test_the_demo_prompts_are_english_and_held_out_of_every_distillation_prompt():
  """The chat prompts play to a small instruct model's strengths and are not the text
  the draft was distilled or tuned on: no training or evaluation prompt holds one."""
  assert len(lm_prompts.DEMO_PROMPTS) >= 6
  for p in lm_prompts.DEMO_PROMPTS:
    assert p.isascii() and "German" not in p and "Translate" not in p
  contents = [p.content for p in lm_prompts.all_prompts()]
  texts = {p.text for p in lm_prompts.all_prompts()}
  for p in lm_prompts.DEMO_PROMPTS:
    assert p not in contents and p not in texts
    assert not any(p in c or (len(c) > 30 and c in p) for c in contents), p


def test_the_cnndm_articles_were_never_trained_or_tuned_on():
  """Each demo article is held out of the SmolLM2 draft's training prompts
  (`lm_prompts.split`) and is not among the pair's evaluation prompts (on which its
  context lookup was tuned); no training prompt holds any of its text."""
  train, _ = lm_prompts.split()
  trained = {p.index for p in train if p.source == "cnndm"}
  evaluation = pretrained.lm_eval_prompts(bench_demo.LM_PAIR)
  articles = data.read_jsonl(data.CNNDM_FILE, ("article",))
  for index, prompt in zip(
    demo_prompts.CNNDM_ARTICLES, demo_prompts.cnndm_articles(len(demo_prompts.CNNDM_ARTICLES))
  ):
    assert lm_prompts.is_heldout(index) and index not in trained
    head = lm_prompts.first_sentences(articles[index]["article"])
    assert prompt.startswith(head[:100])
    assert not any(head[:100] in c for c in evaluation), index
  train_texts = [p.text for p in train if p.source == "cnndm"]
  for prompt in demo_prompts.cnndm_articles(len(demo_prompts.CNNDM_ARTICLES)):
    assert not any(prompt[:80] in t for t in train_texts)


@pytest.mark.slow
def test_the_demo_runs_the_shipped_pairs():
  """The shipped pairs end to end (one input per task, a few tokens, temperature 0):
  they load, pack, decode, and temperature 0 equals the baseline."""
  pytest.importorskip("tokenizers")
  try:
    pretrained.lm_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  result = bench_demo.run(
    bench_demo.Config(
      quick=True,
      num_sentences=1,
      num_articles=1,
      num_prompts=1,
      lm_max_new_tokens=6,
      max_new_tokens=6,
      progress=False,
    )
  )
  _check_rows(result, (0.0,))


# ------------------------------------------------------------------------------
# The persistent compilation cache of the command line.
# ------------------------------------------------------------------------------
def test_the_cache_directory_follows_the_environment(tmp_path):
  home = {"HOME": str(tmp_path)}
  assert compile_cache.cache_dir(home) == tmp_path / ".cache" / "specdec" / "jax"
  assert compile_cache.cache_dir({**home, "XDG_CACHE_HOME": "/x/c"}) == (
    pathlib.Path("/x/c/specdec/jax")
  )
  # A relative XDG_CACHE_HOME is ignored (the XDG spec), so nothing lands in the cwd.
  assert compile_cache.cache_dir({**home, "XDG_CACHE_HOME": "rel"}) == (
    tmp_path / ".cache" / "specdec" / "jax"
  )
  assert compile_cache.cache_dir({**home, "SPECDEC_CACHE_DIR": "/y"}) == (pathlib.Path("/y/jax"))
  for off in ("", "0", "off", "OFF", "false", "none"):
    env = {**home, "SPECDEC_CACHE_DIR": off}
    assert compile_cache.cache_dir(env) is None and _cache.cache_root(env) is None


def test_the_cpu_kernel_is_cached_in_a_temporary_folder_when_caching_is_off(monkeypatch, tmp_path):
  """The kernel's library shares specdec's cache; with caching off it is built in a
  temporary folder, not in a folder named after the setting ("off") in the cwd."""
  from specdec.backends import cpu

  monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "c"))
  assert cpu.cache_dir() == tmp_path / "c"
  monkeypatch.setenv("SPECDEC_CACHE_DIR", "off")
  assert cpu.cache_dir().is_absolute() and cpu.cache_dir().name.startswith("specdec-")
  assert cpu.cache_dir() == cpu.cache_dir()


def _run(tmp_path, args, **env):
  """`python args...` in a fresh process from the checkout's root, with `env` on top
  of a home and an XDG cache directory inside tmp_path."""
  environ = {
    k: v
    for k, v in os.environ.items()
    if k not in ("SPECDEC_CACHE_DIR", "XDG_CACHE_HOME", "JAX_COMPILATION_CACHE_DIR")
  }
  environ.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"), **env)
  proc = subprocess.run(
    [sys.executable, *args],
    capture_output=True,
    text=True,
    timeout=600,
    env=environ,
    cwd=pathlib.Path(bench_demo.__file__).resolve().parents[2],
  )
  assert proc.returncode == 0, proc.stderr[-2000:]


# What the command line does first, then one compilation.
_CONFIGURE_AND_COMPILE = (
  "from specdec.bench import compile_cache; print(compile_cache.configure()); "
  "import jax, jax.numpy as jnp; "
  "jax.block_until_ready(jax.jit(lambda x: x * 2 + 1)(jnp.arange(3.0)))"
)


def _files(path):
  return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def test_compiled_programs_are_cached_where_the_environment_says(tmp_path):
  _run(tmp_path, ["-c", _CONFIGURE_AND_COMPILE])  # $XDG_CACHE_HOME/specdec/jax
  assert _files(tmp_path / "xdg" / "specdec" / "jax")
  moved = tmp_path / "moved"
  _run(tmp_path, ["-c", _CONFIGURE_AND_COMPILE], SPECDEC_CACHE_DIR=str(moved))
  assert _files(moved / "jax")
  assert not (tmp_path / "home").exists()


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_no_cache_is_written_when_it_is_off(tmp_path):
  for off in ("off", "0"):
    _run(tmp_path, ["-c", _CONFIGURE_AND_COMPILE], SPECDEC_CACHE_DIR=off)
  assert not _files(tmp_path)


def test_the_command_line_configures_the_cache_first(monkeypatch):
  """`python -m specdec.bench` turns the cache on (or off) before any subcommand runs;
  `main` called from Python leaves JAX's settings alone."""
  import runpy

  calls = []
  monkeypatch.setattr(compile_cache, "configure", lambda: calls.append("configure"))
  monkeypatch.setattr(sys, "argv", ["specdec.bench", "demo", "--help"])
  with pytest.raises(SystemExit):
    runpy.run_module("specdec.bench", run_name="__main__", alter_sys=False)
  assert calls == ["configure"]


@pytest.mark.slow
def test_the_command_line_caches_compiled_programs_only_when_on(tmp_path):
  command = [
    "-m",
    "specdec.bench",
    "sampler",
    "--vocab=16",
    "--gammas=1",
    "--max-new-tokens=4",
    "--repeats=1",
    "--temperatures=0",
    "--out=",
  ]
  _run(tmp_path / "off", command, SPECDEC_CACHE_DIR="off")
  assert not _files(tmp_path / "off")
  _run(tmp_path / "on", command)
  assert _files(tmp_path / "on" / "xdg" / "specdec" / "jax")
