"""Run by test_llama.py in its own process with 8 simulated CPU devices.

Greedy speculative decoding of a tiny Llama pair (a smaller draft; ragged prompts),
once on one device and once with the parameters sharded over a ('data', 'model') =
(2, 4) mesh and the inputs over 'data'; prints a JSON report: both outputs, the
result shapes of the sharded program's collectives, and the parameters' shapes.
"""

import json
import re

import jax
import numpy as np

import specdec
from specdec import sharding
from specdec.models import llama

GAMMA = 3
MAX_NEW_TOKENS = 10
PAD_ID = 0


def tiny_model(seed, **overrides):
  cfg = llama.tiny_config(**overrides)
  return llama.Llama(cfg, llama.random_params(cfg, seed), pad_id=PAD_ID)


def main():
  # Query, key/value heads, MLP and vocabulary widths divisible by 4, so that 'model'
  # really splits them; grouped-query attention in both models.
  target = tiny_model(0, num_heads=8, num_kv_heads=4, head_dim=8, num_layers=2)
  draft = tiny_model(
    7,
    hidden_size=16,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=32,
    num_layers=1,
    tie_word_embeddings=True,
  )
  rng = np.random.default_rng(2)
  inputs = rng.integers(1, target.vocab_size, (4, 9)).astype(np.int32)
  inputs[1, 5:] = PAD_ID
  inputs[3, 7:] = PAD_ID
  decode = lambda t, d, x: specdec.speculative_sample(
    t,
    d,
    x,
    jax.random.key(0),
    gamma=GAMMA,
    max_new_tokens=MAX_NEW_TOKENS,
    sampling=specdec.SamplingConfig(temperature=0.0),
  )

  single = decode(target, draft, inputs)

  mesh = sharding.make_mesh(2, 4)
  sharded_target = sharding.shard_model(target, mesh)
  sharded_draft = sharding.shard_model(draft, mesh)
  sharded_inputs = jax.device_put(inputs, sharding.batch_sharding(mesh))
  compiled = jax.jit(decode).lower(sharded_target, sharded_draft, sharded_inputs).compile()
  sharded = compiled(sharded_target, sharded_draft, sharded_inputs)
  params = sharded_target.params
  # Result shapes of every collective that could assemble a parameter from its
  # shards, e.g. 'f32[32,64]'.
  gathered = re.findall(
    r"= (\w+\[[\d,]*\])[^=]*? (?:all-gather|all-to-all|"
    r"collective-permute)(?:-start)?\(",
    compiled.as_text(),
  )
  print(
    json.dumps(
      {
        "devices": jax.device_count(),
        "single_tokens": np.asarray(single.tokens).tolist(),
        "sharded_tokens": np.asarray(sharded.tokens).tolist(),
        "single_lengths": np.asarray(single.lengths).tolist(),
        "sharded_lengths": np.asarray(sharded.lengths).tolist(),
        "mlp_shard_shape": list(
          params["layers_0"]["mlp"]["wi_0"]["kernel"].addressable_shards[0].data.shape
        ),
        "key_spec": list(params["layers_0"]["attention"]["key"]["kernel"].sharding.spec),
        "embedding_spec": list(params["token_embedder"]["embedding"].sharding.spec),
        "param_shapes": sorted(
          {
            f"f32[{','.join(map(str, x.shape))}]"
            for x in jax.tree.leaves((target.params, draft.params))
          }
        ),
        "collectives": gathered,
      }
    )
  )


if __name__ == "__main__":
  main()
