"""scripts/research/train_pair.py trains, logs validation loss, and resumes exactly."""

import jax
import numpy as np
import pytest

from specdec.models import t5

import train_pair

pytestmark = pytest.mark.research

CFG = t5.tiny_config("1.1", vocab_size=32, num_encoder_layers=1, num_decoder_layers=1)


def _examples(n, seed=0):
  """A learnable toy translation: the target is the input, token for token."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    x = rng.integers(2, 32, rng.integers(3, 8)).astype(np.int32)
    out.append((np.append(x, 1).astype(np.int32), np.append(x, 1).astype(np.int32)))
  return out


def _config(**kw):
  return train_pair.TrainConfig(
    **dict(
      dict(
        batch_size=8,
        epochs=6.0,
        learning_rate=1e-2,
        warmup_steps=5,
        eval_every=10,
        eval_examples=16,
        checkpoint_every=1000,
        seed=0,
      ),
      **kw,
    )
  )


def test_training_lowers_the_validation_loss(tmp_path):
  result = train_pair.train_model(
    "tiny", CFG, _examples(64), _examples(16, seed=1), _config(), str(tmp_path), progress=False
  )
  losses = [h["val_loss"] for h in result["history"]]
  assert result["steps"] == 48 and len(losses) == 6  # step 0, then every 10 and the end
  assert losses[-1] < losses[0] - 0.5


def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path):
  train, val, cfg = _examples(64), _examples(16, seed=1), _config(epochs=2.0)
  straight = train_pair.train_model("a", CFG, train, val, cfg, str(tmp_path / "a"), progress=False)
  train_pair.train_model("b", CFG, train, val, cfg, str(tmp_path / "b"), progress=False, stop_at=7)
  resumed = train_pair.train_model("b", CFG, train, val, cfg, str(tmp_path / "b"), progress=False)
  assert resumed["steps"] == straight["steps"] == 16
  for a, b in zip(jax.tree.leaves(straight["params"]), jax.tree.leaves(resumed["params"])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_batches_are_length_bucketed_and_seeded():
  examples = _examples(200)
  a = train_pair.epoch_batches(examples, 8, seed=3, epoch=0)
  assert a == train_pair.epoch_batches(examples, 8, seed=3, epoch=0)
  assert a != train_pair.epoch_batches(examples, 8, seed=3, epoch=1)
  assert sorted(i for b in a for i in b) == sorted(set(i for b in a for i in b))
  batch = train_pair.make_batch([examples[i] for i in a[0]])
  np.testing.assert_array_equal(
    batch["decoder_input_tokens"][:, 1:], batch["decoder_target_tokens"][:, :-1]
  )
  assert (batch["decoder_input_tokens"][:, 0] == 0).all()


def test_distillation_targets_are_the_teachers_greedy_outputs(tmp_path):
  """--draft_data=distill: each example's target becomes the teacher's greedy decode
  of its source (in the sources' order, whatever the batching), cached on disk."""
  import specdec

  teacher = t5.T5(CFG, t5.random_params(CFG, seed=4))
  examples = _examples(11)
  cache = str(tmp_path / "teacher.npz")
  distilled = train_pair.distilled_examples(examples, teacher, 6, cache, batch_size=4)
  assert [s for s, _ in distilled] == [s for s, _ in examples]
  for src, out in distilled:
    base = specdec.autoregressive_sample(
      teacher,
      src[None],
      jax.random.key(0),
      max_new_tokens=6,
      sampling=specdec.SamplingConfig(temperature=0.0),
      eos_id=1,
    )
    np.testing.assert_array_equal(out, base.tokens[0, : base.lengths[0]])
  # The cache is read back instead of decoding again (a teacher that would fail).
  again = train_pair.distilled_examples(examples, None, 6, cache)
  for (_, a), (_, b) in zip(again, distilled):
    np.testing.assert_array_equal(a, b)


def test_the_shortlist_loss_is_the_cross_entropy_over_the_shortlisted_columns():
  import jax.numpy as jnp

  module = t5.Transformer(CFG)
  params = t5.init_params(CFG, jax.random.key(0))
  examples = [(s, np.minimum(t, 15)) for s, t in _examples(8)]  # targets in 0..15
  batch = train_pair.make_batch(examples)
  ids = train_pair.output_vocabulary(examples, CFG.vocab_size)
  assert ids[0] == 0 and 1 in ids and ids.max() <= 15
  rng = jax.random.key(1)
  full_ids = jnp.arange(CFG.vocab_size, dtype=jnp.int32)
  for smoothing in (0.0, 0.1):
    # The whole vocabulary as the shortlist is the plain loss.
    np.testing.assert_allclose(
      train_pair.loss_fn(params, module, batch, rng, False, smoothing, full_ids),
      train_pair.loss_fn(params, module, batch, rng, False, smoothing),
      rtol=1e-5,
    )
    # A shortlist: log-softmax over its columns of the full logits.
    logits = module.apply(
      {"params": params},
      batch["encoder_input_tokens"],
      batch["decoder_input_tokens"],
      batch["decoder_target_tokens"],
    )
    logp = jax.nn.log_softmax(logits[..., ids], axis=-1)
    targets = batch["decoder_target_tokens"]
    pos = np.searchsorted(ids, targets)
    nll = -np.take_along_axis(np.asarray(logp), pos[..., None], axis=-1)[..., 0]
    per = (1 - smoothing) * nll - smoothing * np.asarray(logp).mean(-1)
    weights = targets > 0
    expected = (per * weights).sum() / weights.sum()
    got = train_pair.loss_fn(params, module, batch, rng, False, smoothing, jnp.asarray(ids))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
  grads = jax.grad(train_pair.loss_fn)(params, module, batch, rng, False, 0.0, jnp.asarray(ids))
  kernel = np.asarray(grads["decoder"]["logits_dense"]["kernel"])
  outside = np.setdiff1d(np.arange(CFG.vocab_size), ids)
  assert not kernel[:, outside].any() and kernel[:, ids].any()


def test_training_on_the_shortlist_lowers_the_full_vocabulary_validation_loss(tmp_path):
  result = train_pair.train_model(
    "tiny",
    CFG,
    _examples(64),
    _examples(16, seed=1),
    _config(output_vocab="train"),
    str(tmp_path),
    progress=False,
  )
  losses = [h["val_loss"] for h in result["history"]]
  assert losses[-1] < losses[0] - 0.5
  assert result["history"][-1]["output_vocab"] == "train"
  assert result["history"][-1]["full_vocab_every"] == 4
  with pytest.raises(ValueError, match="output_vocab"):
    train_pair.train_model(
      "bad",
      CFG,
      _examples(64),
      _examples(16, seed=1),
      _config(output_vocab="some"),
      str(tmp_path / "bad"),
      progress=False,
    )


def test_the_reparametrization_trains_the_same_model_and_exports_t5s_own_values(tmp_path):
  params = t5.init_params(CFG, jax.random.key(0))
  mults = train_pair.multipliers(params, CFG)
  flat = {jax.tree_util.keystr(k): m for k, m in jax.tree_util.tree_leaves_with_path(mults)}
  assert flat["['token_embedder']['embedding']"] == pytest.approx(np.sqrt(CFG.emb_dim))
  queries = [m for k, m in flat.items() if "['query']" in k]
  assert queries and all(m == pytest.approx(CFG.head_dim**-0.5) for m in queries)
  assert sum(m != 1.0 for m in flat.values()) == 1 + len(queries)
  raw = jax.tree.map(lambda p, m: p / m, params, mults)
  for a, b in zip(jax.tree.leaves(train_pair.effective(raw, mults)), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  # Trained in it, the exported model is a T5 whose loss is the one the run logged.
  train, val = _examples(64), _examples(16, seed=1)
  result = train_pair.train_model(
    "r", CFG, train, val, _config(reparam=True), str(tmp_path), progress=False
  )
  loss = np.mean(
    [
      train_pair.loss_fn(
        result["params"],
        t5.Transformer(CFG),
        train_pair.make_batch(val[i : i + 8]),
        jax.random.key(0),
        False,
      )
      for i in (0, 8)
    ]
  )
  assert float(loss) == pytest.approx(result["history"][-1]["val_loss"], rel=1e-4)
  assert result["history"][-1]["val_loss"] < result["history"][0]["val_loss"] - 0.5
