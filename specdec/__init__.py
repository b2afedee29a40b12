"""specdec: speculative decoding (Leviathan, Kalman & Matias, ICML 2023) in JAX/Flax.

The contract names:
  speculative_sample, autoregressive_sample  -- Algorithm 1 and its baseline (sample)
  AutoGamma, StepCosts                       -- gamma chosen per iteration (adaptive)
  SamplingConfig                             -- temperature / top-k / top-p
  SampleOutput, SpeculativeStats             -- what the samplers return
  verify                                     -- steps 3 and 4 of Algorithm 1
  drafts                                     -- the Proposer protocol and proposers
  theory                                     -- Section 3's formulas
  models                                     -- the DecodeModel protocol and models
  io                                         -- checkpoints and tokenizers on disk
"""

from specdec import adaptive, drafts, io, sharding, theory, verify
from specdec.adaptive import AutoGamma, StepCosts
from specdec.distributions import SamplingConfig, probabilities
from specdec.models import CausalLM, DecodeModel
from specdec.outputs import AutoregressiveStats, SampleOutput, SpeculativeStats
from specdec.sample import autoregressive_sample, speculative_sample

__version__ = "0.2.0"

__all__ = [
  "AutoGamma",
  "AutoregressiveStats",
  "CausalLM",
  "DecodeModel",
  "SampleOutput",
  "SamplingConfig",
  "SpeculativeStats",
  "StepCosts",
  "adaptive",
  "autoregressive_sample",
  "drafts",
  "io",
  "probabilities",
  "sharding",
  "speculative_sample",
  "theory",
  "verify",
]
