"""Run by test_sharding.py in its own process with 8 simulated CPU devices.

Greedy speculative decoding of a tiny T5 pair (a smaller draft), once on one device
and once with the parameters sharded over a ('data', 'model') = (2, 4) mesh and the
inputs over 'data'; prints a JSON report: both outputs, the all-gathers of the sharded
program's collectives, and how T5-small's parameters would shard.
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax
import numpy as np

import specdec
from specdec import sharding
from specdec.models import t5

from t5_helpers import random_inputs, tiny_model

GAMMA = 3
MAX_NEW_TOKENS = 10
EOS_ID = 1


def main():
  # 4 heads and MLP/vocab widths divisible by 4, so that 'model' really splits them;
  # one layer each, to keep compilation short. The draft is smaller, as in the paper.
  target = tiny_model("1.1", num_heads=4, num_encoder_layers=1, num_decoder_layers=1)
  draft = tiny_model(
    "1.1", seed=7, emb_dim=16, num_heads=4, mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1
  )
  inputs = random_inputs(4, 9, 64, seed=2, pad_from={1: 5, 3: 7})
  decode = lambda t, d, x: specdec.speculative_sample(
    t,
    d,
    x,
    jax.random.key(0),
    gamma=GAMMA,
    max_new_tokens=MAX_NEW_TOKENS,
    sampling=specdec.SamplingConfig(temperature=0.0),
    eos_id=EOS_ID,
  )

  single = decode(target, draft, inputs)

  mesh = sharding.make_mesh(2, 4)
  sharded_target = sharding.shard_model(target, mesh)
  sharded_draft = sharding.shard_model(draft, mesh)
  sharded_inputs = jax.device_put(inputs, sharding.batch_sharding(mesh))
  compiled = jax.jit(decode).lower(sharded_target, sharded_draft, sharded_inputs).compile()
  sharded = compiled(sharded_target, sharded_draft, sharded_inputs)
  kernel = sharded_target.params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]

  # Result shapes of every collective that could assemble a parameter from its
  # shards, e.g. 'f32[32,64]'.
  gathered = re.findall(
    r"= (\w+\[[\d,]*\])[^=]*? (?:all-gather|all-to-all|"
    r"collective-permute)(?:-start)?\(",
    compiled.as_text(),
  )
  # T5-small's 6 heads do not divide 4 devices: its relative position table is
  # replicated, while its 6 x 64 = 384 joined heads still split.
  small = sharding.param_shardings(t5.CONFIGS["t5_1_1_small"], mesh)["encoder"]
  print(
    json.dumps(
      {
        "small_relpos_spec": list(small["relpos_bias"]["rel_embedding"].spec),
        "small_query_spec": list(small["layers_0"]["attention"]["query"]["kernel"].spec),
        "devices": jax.device_count(),
        "single_tokens": np.asarray(single.tokens).tolist(),
        "sharded_tokens": np.asarray(sharded.tokens).tolist(),
        "single_lengths": np.asarray(single.lengths).tolist(),
        "sharded_lengths": np.asarray(sharded.lengths).tolist(),
        "kernel_shard_shape": list(kernel.addressable_shards[0].data.shape),
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
