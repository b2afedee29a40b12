"""The cacheless CausalLM adapter honours the DecodeModel protocol."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec.models import CausalLM, DecodeModel


def _logits(tokens, w):
  # Causal: position t sees a running sum of one-hot tokens 0..t.
  return jnp.cumsum(jax.nn.one_hot(tokens, w.shape[0]), axis=1) @ w


def _model():
  w = jax.random.normal(jax.random.key(0), (11, 11))
  return CausalLM.from_fn(_logits, 11, params=w), w


def test_it_is_a_decode_model():
  assert isinstance(_model()[0], DecodeModel)


def test_a_chunk_equals_single_steps_and_the_full_forward_pass():
  model, w = _model()
  prompt = jnp.array([[1, 2, 3], [4, 5, 6]])
  new = jnp.array([[7, 8, 9, 10], [1, 1, 2, 2]])
  state = model.init(prompt, 8)
  chunk_logits, chunk_state = model.extend(
    state, jnp.concatenate([model.start_tokens(prompt)[:, None], new], axis=1)
  )
  step_logits = []
  for tok in jnp.concatenate([prompt[:, -1:], new], axis=1).T:
    out, state = model.extend(state, tok[:, None])
    step_logits.append(out[:, 0])
  full = _logits(jnp.concatenate([prompt, new], axis=1), w)[:, 2:]
  np.testing.assert_allclose(chunk_logits, jnp.stack(step_logits, 1), atol=1e-5)
  np.testing.assert_allclose(chunk_logits, full, atol=1e-5)
  np.testing.assert_array_equal(model.lengths(chunk_state), [7, 7])


def test_rewind_is_per_row_and_overwrites_stale_positions():
  model, w = _model()
  prompt = jnp.array([[1, 2], [3, 4]])
  state = model.init(prompt, 6)
  _, state = model.extend(state, jnp.array([[2, 5, 5], [4, 6, 6]]))
  state = model.rewind(state, jnp.array([2, 3]))
  np.testing.assert_array_equal(model.lengths(state), [2, 3])
  logits, _ = model.extend(state, jnp.array([[9], [9]]))
  np.testing.assert_allclose(logits[0, 0], _logits(jnp.array([[1, 2, 9]]), w)[0, -1], atol=1e-5)
  np.testing.assert_allclose(logits[1, 0], _logits(jnp.array([[3, 4, 6, 9]]), w)[0, -1], atol=1e-5)


@pytest.mark.parametrize(
  "kwargs,error,name",
  [
    (dict(logits_fn=None, vocab_size=3), TypeError, "logits_fn"),
    (dict(logits_fn=_logits, vocab_size=0), ValueError, "vocab_size"),
    (dict(logits_fn=_logits, vocab_size=3, max_length=0), ValueError, "max_length"),
  ],
)
def test_from_fn_checks_its_arguments(kwargs, error, name):
  with pytest.raises(error, match=name):
    CausalLM.from_fn(**kwargs)


def test_init_refuses_more_positions_than_max_length():
  model = CausalLM.from_fn(_logits, 11, max_length=5, params=jnp.eye(11))
  model.init(jnp.ones((1, 2), jnp.int32), 3)
  with pytest.raises(ValueError, match="max_length"):
    model.init(jnp.ones((1, 2), jnp.int32), 4)
