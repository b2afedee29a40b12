"""Models implementing the `DecodeModel` protocol."""

from specdec.models import llama, t5
from specdec.models.base import CausalLM, CausalLMState, DecodeModel

__all__ = ["CausalLM", "CausalLMState", "DecodeModel", "llama", "t5"]
