"""Models implementing the `DecodeModel` protocol."""

from specdec.models import ngram, t5
from specdec.models.base import CausalLM, CausalLMState, DecodeModel

__all__ = ["CausalLM", "CausalLMState", "DecodeModel", "ngram", "t5"]
