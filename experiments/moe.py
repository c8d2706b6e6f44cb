"""Mixture-of-experts sizes, Mixtral-shaped (Llama attention + top-k routed SwiGLU experts).

Names give total and active (per-token) parameters, embeddings included, with the vocabulary noted
beside each; ``lib/levanter/tests/test_models_sizes.py`` checks both against the name.
``olmoe_1b_7b`` and ``mixtral_8x7b`` are the published OLMoE-1B-7B and Mixtral-8x7B shapes.
"""

from levanter.models.moe import MoeConfig

from experiments.llama import LLAMA3_VOCAB_SIZE

MIXTRAL_VOCAB_SIZE = 32_000
OLMOE_VOCAB_SIZE = 50_304

# Trains on a laptop CPU, next to llama_nano.
moe_nano = MoeConfig(
    hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2,
    num_experts=4, num_experts_per_token=2, max_seq_len=2048, tie_word_embeddings=True,
)
moe_140m_a65m = MoeConfig(
    hidden_dim=512, intermediate_dim=1024, num_layers=8, num_heads=8, num_kv_heads=8,
    num_experts=8, num_experts_per_token=2, max_seq_len=4096,
)
moe_1_2b_a250m = MoeConfig(
    hidden_dim=1024, intermediate_dim=1408, num_layers=16, num_heads=16, num_kv_heads=8,
    num_experts=16, num_experts_per_token=2, max_seq_len=4096,
)
# llama_600m's attention and per-token FLOPs with its MLP split into 8 half-width experts, 2 per
# token: it compares routing against the dense model at equal compute (bench/mfu.py's MoE row).
moe_1_4b_a600m = MoeConfig(
    hidden_dim=1024, intermediate_dim=1792, num_layers=24, num_heads=16, num_kv_heads=8,
    num_experts=8, num_experts_per_token=2, max_seq_len=4096,
)
olmoe_1b_7b = MoeConfig(
    hidden_dim=2048, intermediate_dim=1024, num_layers=16, num_heads=16, num_kv_heads=16,
    num_experts=64, num_experts_per_token=8, max_seq_len=4096,
)
mixtral_8x7b = MoeConfig(
    hidden_dim=4096, intermediate_dim=14336, num_layers=32, num_heads=32, num_kv_heads=8,
    num_experts=8, num_experts_per_token=2, max_seq_len=32768, rope_theta=1_000_000.0,
)

# name -> (config, vocabulary size, total parameters, active parameters) as the name states them
MOE_SIZES = {
    "moe_140m_a65m": (moe_140m_a65m, MIXTRAL_VOCAB_SIZE, 140e6, 65e6),
    "moe_1_2b_a250m": (moe_1_2b_a250m, MIXTRAL_VOCAB_SIZE, 1.2e9, 250e6),
    "moe_1_4b_a600m": (moe_1_4b_a600m, LLAMA3_VOCAB_SIZE, 1.4e9, 600e6),
    "olmoe_1b_7b": (olmoe_1b_7b, OLMOE_VOCAB_SIZE, 7e9, 1e9),
    "mixtral_8x7b": (mixtral_8x7b, MIXTRAL_VOCAB_SIZE, 46.7e9, 12.9e9),
}
