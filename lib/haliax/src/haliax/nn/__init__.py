"""Neural-network layers whose parameters declare their logical axis names."""

from haliax.nn.attention import AttentionImplementationError, attend, attention_mask, dot_product_attention
from haliax.nn.embedding import Embedding
from haliax.nn.linear import Linear
from haliax.nn.norm import RMSNorm
from haliax.nn.rotary import RopeScaling, apply_rotary, rotary_cos_sin

__all__ = [
    "AttentionImplementationError",
    "Embedding",
    "Linear",
    "RMSNorm",
    "RopeScaling",
    "apply_rotary",
    "attend",
    "attention_mask",
    "dot_product_attention",
    "rotary_cos_sin",
]
