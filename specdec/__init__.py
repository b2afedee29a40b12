"""specdec: speculative decoding (Leviathan, Kalman & Matias, ICML 2023) in JAX/Flax.

The contract names:
  speculative_sample, autoregressive_sample  -- Algorithm 1 and its baseline
  SamplingConfig                             -- temperature / top-k / top-p
  SampleOutput, SpeculativeStats             -- what the samplers return
  theory                                     -- Section 3's formulas
  models                                     -- the DecodeModel protocol and models
"""

from specdec import checkpoints, sharding, theory
from specdec.distributions import SamplingConfig, probabilities
from specdec.models import CausalLM, DecodeModel
from specdec.sample import (AutoregressiveStats, SampleOutput, SpeculativeStats,
                            autoregressive_sample, speculative_sample)

__version__ = "0.1.0"

__all__ = [
    "AutoregressiveStats",
    "CausalLM",
    "DecodeModel",
    "SampleOutput",
    "SamplingConfig",
    "SpeculativeStats",
    "autoregressive_sample",
    "checkpoints",
    "probabilities",
    "sharding",
    "speculative_sample",
    "theory",
]
