"""Models implementing the `DecodeModel` protocol."""

from specdec.models.base import CausalLM, CausalLMState, DecodeModel

__all__ = ["CausalLM", "CausalLMState", "DecodeModel"]
