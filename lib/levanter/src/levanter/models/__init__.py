"""Language models (Llama, Mixtral-shaped MoE), their configs, and the shared loss."""

from levanter.models.llama import LlamaConfig, LlamaLMHeadModel
from levanter.models.lm import LmOutput
from levanter.models.loss import LossSums, fused_next_token_loss, next_token_loss
from levanter.models.moe import MoeConfig, MoeLMHeadModel
from levanter.models.transformer import ConfigError

__all__ = [
    "ConfigError",
    "LlamaConfig",
    "LlamaLMHeadModel",
    "LmOutput",
    "LossSums",
    "MoeConfig",
    "MoeLMHeadModel",
    "fused_next_token_loss",
    "next_token_loss",
]
