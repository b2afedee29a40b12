"""The Proposer protocol: every kind of draft is plugged into the loop the same way."""

import flax.struct
from helpers import GREEDY, bigram_model, first_in_default
import jax
import jax.numpy as jnp
from llama_helpers import feature_draft, ragged_inputs, tiny_model as tiny_llama
import numpy as np
import pytest

import specdec
from specdec import drafts
from specdec.distributions import SamplingConfig
from specdec.drafts import lookup, ngram, shortlist


def every_kind_of_draft():
  target = tiny_llama(0, num_layers=4)
  small = tiny_llama(1, num_layers=1)
  vocab = target.vocab_size
  ids = np.arange(0, vocab, 2)
  inner = tiny_llama(2, num_layers=1, vocab_size=len(ids) + 1)
  return target, {
    "model": small,
    "layer_skip": target.with_layers([0, 2]),
    "lookup": lookup.ContextLookup.create(small),
    "shortlist": shortlist.Shortlist.create(inner, ids, vocab),
    "bigram": ngram.Bigram.from_corpus([[1, 2, 3, 4, 5, 1, 2]], vocab),
    "feature": feature_draft(target),
  }


@pytest.mark.slow  # the default suite stays under 6 minutes; .ci/run runs it after
def test_every_shipped_kind_of_draft_is_a_proposer_and_decodes_greedy_mp():
  target, kinds = every_kind_of_draft()
  x = ragged_inputs(3, 5, target.vocab_size, [5, 2, 4], seed=1)
  base = specdec.autoregressive_sample(
    target, x, jax.random.key(0), max_new_tokens=10, sampling=GREEDY, eos_id=3
  )
  for name, draft in kinds.items():
    proposer = drafts.as_proposer(draft)
    assert isinstance(proposer, drafts.Proposer), name
    assert proposer.reads_target_features == (name == "feature"), name
    assert drafts.as_proposer(proposer) is proposer
    out = specdec.speculative_sample(
      target, draft, x, jax.random.key(1), gamma=3, max_new_tokens=10, sampling=GREEDY, eos_id=3
    )
    np.testing.assert_array_equal(out.tokens, base.tokens, err_msg=name)


def test_a_feature_draft_on_a_target_without_features_is_refused_by_name():
  target, kinds = every_kind_of_draft()
  cacheless = specdec.CausalLM.from_fn(
    lambda t: jnp.zeros(t.shape + (target.vocab_size,)), target.vocab_size
  )
  with pytest.raises(TypeError, match="init_with_features / extend_with_features"):
    specdec.speculative_sample(
      cacheless,
      kinds["feature"],
      jnp.ones((1, 2), jnp.int32),
      jax.random.key(0),
      gamma=2,
      max_new_tokens=4,
    )


@flax.struct.dataclass
class Echo:
  """A user's own proposer: always proposes the token it last saw committed."""

  vocab_size: int = flax.struct.field(pytree_node=False)
  reads_target_features = False

  def start(self, inputs, capacity, max_gamma, zero_gamma, target_features):
    return inputs[:, -1]

  def propose(self, state, keys, sampling, gamma):
    x = jnp.tile(state[:, None], (1, gamma))
    q = None if sampling.greedy else jax.nn.one_hot(x, self.vocab_size)
    return x, q, jnp.zeros(state.shape, jnp.int32), state

  def commit(self, state, chunk, n, gamma, features, active):
    return jnp.where(active, jnp.take_along_axis(chunk, n[:, None], 1)[:, 0], state)


def test_a_users_own_proposer_plugs_in_and_keeps_the_law():
  table = np.eye(5, dtype=np.float32) * 2.0  # the target likes repeating a token
  target = bigram_model(table)
  echo = Echo(vocab_size=5)
  assert isinstance(drafts.as_proposer(echo), drafts.Proposer)
  x = jnp.asarray([[1], [3]], jnp.int32)
  greedy = specdec.speculative_sample(
    target, echo, x, jax.random.key(0), gamma=3, max_new_tokens=8, sampling=GREEDY
  )
  base = specdec.autoregressive_sample(
    target, x, jax.random.key(0), max_new_tokens=8, sampling=GREEDY
  )
  np.testing.assert_array_equal(greedy.tokens, base.tokens)
  assert int(greedy.stats.accepted.sum()) == int(greedy.stats.drafted.sum())
  sampled = specdec.speculative_sample(
    target,
    echo,
    jnp.ones((20_000, 1), jnp.int32),
    jax.random.key(1),
    gamma=2,
    max_new_tokens=1,
    sampling=SamplingConfig(1.0),
  )
  p = np.exp(table[1]) / np.exp(table[1]).sum()
  freq = np.bincount(np.asarray(sampled.tokens[:, 0]), minlength=5) / 20_000
  # sd <= 0.0036 at 20k draws: 0.015 is > 4 sd, a false-alarm rate below 1e-4.
  np.testing.assert_allclose(freq, p, atol=0.015)


def test_anything_else_as_a_draft_is_refused_by_name():
  with pytest.raises(TypeError, match="draft"):
    drafts.as_proposer("a draft")


@pytest.mark.parametrize("owed", first_in_default(1, [[9, 4, 11], [9], [9, 4], [9, 4, 11, 8, 2]]))
def test_after_iterations_without_drafts_the_draft_sees_every_token_it_can(owed):
  """Gamma-0 iterations leave tokens owed to a model draft; the loop's `catch_up`
  feeds them (all but the last) in one call, and the next draft step's q is the
  draft's own on the whole context: the prompt and every owed token, as far back as
  the window of 4 keeps (older ones are dropped, which changes q, never the law)."""
  draft = tiny_llama(1, num_layers=1)
  proposer = drafts.as_proposer(draft)
  prompt = jnp.asarray([[5, 6, 7]], jnp.int32)
  sampling, one = SamplingConfig(1.0), jnp.ones((1,), bool)
  state = proposer.start(prompt, 32, 3, True, None)
  for t in owed:
    state = proposer.propose(state, jnp.zeros((1, 0, 2), jnp.uint32), sampling, 0)[3]
    state = proposer.commit(
      state, jnp.asarray([[t]], jnp.int32), jnp.zeros((1,), jnp.int32), 0, None, one
    )
  assert bool(proposer.owes(state)[0]) == (len(owed) >= 2)
  state = proposer.catch_up(state)
  assert not bool(proposer.owes(state)[0])
  keys = jax.random.split(jax.random.key(0), 2)[None]
  x, q, bad, _ = proposer.propose(state, keys, sampling, 2)
  assert int(bad[0]) == 0
  dropped = max(0, len(owed) - 3)  # the window holds the prompt's last token + 3
  if dropped:
    return  # Tokens fell out of the window: q is the draft's on a shorter context.
  context = jnp.concatenate([prompt, jnp.asarray([owed], jnp.int32)], axis=1)
  for j in range(2):
    ref_state = draft.init(context, 8)
    logits, _ = draft.extend(ref_state, context[:, -1:])
    expected, _ = specdec.distributions.probabilities_checked(logits[:, 0], sampling)
    np.testing.assert_allclose(q[0, j], expected[0], atol=2e-6)
    context = jnp.concatenate([context, x[:, j : j + 1]], axis=1)
