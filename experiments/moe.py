"""Mixture-of-experts sizes, Mixtral-shaped (Llama attention + top-k routed SwiGLU experts).

Names give total and active (per-token) parameters, embeddings included, with the vocabulary noted
beside each; ``lib/levanter/tests/test_models_sizes.py`` checks both against the name.
``olmoe_1b_7b``, ``mixtral_8x7b``, ``qwen3_moe_30b_a3b``, ``qwen3_moe_235b_a22b`` and
``qwen2_moe_14b_a2_7b`` are the published OLMoE-1B-7B, Mixtral-8x7B, Qwen3-30B-A3B, Qwen3-235B-A22B
and Qwen1.5-MoE-A2.7B shapes (Qwen2 and Qwen3 share one 151,936-token vocabulary); like the
pod-sized Llamas (``experiments/llama.py``) they scan their layers.
"""

from levanter.models.moe import MoeConfig

from experiments.llama import LLAMA3_VOCAB_SIZE

MIXTRAL_VOCAB_SIZE = 32_000
OLMOE_VOCAB_SIZE = 50_304
QWEN_VOCAB_SIZE = 151_936

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
    num_experts=64, num_experts_per_token=8, max_seq_len=4096, use_scan=True,
)
mixtral_8x7b = MoeConfig(
    hidden_dim=4096, intermediate_dim=14336, num_layers=32, num_heads=32, num_kv_heads=8,
    num_experts=8, num_experts_per_token=2, max_seq_len=32768, rope_theta=1_000_000.0, use_scan=True,
)
# Qwen3-MoE: Qwen3's attention (per-head query/key norms, 128-wide heads) and many small experts,
# top-k probabilities renormalised (norm_topk_prob), as published (Qwen3-30B-A3B, Qwen3-235B-A22B).
qwen3_moe_nano = MoeConfig(
    hidden_dim=32, intermediate_dim=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim_override=16,
    num_experts=8, num_experts_per_token=2, max_seq_len=2048, tie_word_embeddings=True, qk_norm=True,
)
qwen3_moe_30b_a3b = MoeConfig(
    hidden_dim=2048, intermediate_dim=768, num_layers=48, num_heads=32, num_kv_heads=4, head_dim_override=128,
    num_experts=128, num_experts_per_token=8, max_seq_len=40960, rope_theta=1_000_000.0, norm_eps=1e-6,
    router_aux_loss_coef=0.001, qk_norm=True, use_scan=True,
)
# Qwen2-MoE (Qwen1.5-MoE-A2.7B): Qwen2's attention (q/k/v biases), 60 experts (4 per token, raw top-k
# probabilities) and a gated shared expert every token passes through.
qwen2_moe_14b_a2_7b = MoeConfig(
    hidden_dim=2048, intermediate_dim=1408, num_layers=24, num_heads=16, num_kv_heads=16, num_experts=60,
    num_experts_per_token=4, max_seq_len=8192, rope_theta=1_000_000.0, norm_eps=1e-6, router_aux_loss_coef=0.001,
    qkv_bias=True, renormalize_top_k=False, shared_expert_dim=5632, use_scan=True,
)
qwen3_moe_235b_a22b = MoeConfig(
    hidden_dim=4096, intermediate_dim=1536, num_layers=94, num_heads=64, num_kv_heads=4, head_dim_override=128,
    num_experts=128, num_experts_per_token=8, max_seq_len=40960, rope_theta=1_000_000.0, norm_eps=1e-6,
    router_aux_loss_coef=0.001, qk_norm=True, use_scan=True,
)

# name -> (config, vocabulary size, total parameters, active parameters) as the name states them
MOE_SIZES = {
    "moe_140m_a65m": (moe_140m_a65m, MIXTRAL_VOCAB_SIZE, 140e6, 65e6),
    "moe_1_2b_a250m": (moe_1_2b_a250m, MIXTRAL_VOCAB_SIZE, 1.2e9, 250e6),
    "moe_1_4b_a600m": (moe_1_4b_a600m, LLAMA3_VOCAB_SIZE, 1.4e9, 600e6),
    "olmoe_1b_7b": (olmoe_1b_7b, OLMOE_VOCAB_SIZE, 7e9, 1e9),
    "mixtral_8x7b": (mixtral_8x7b, MIXTRAL_VOCAB_SIZE, 46.7e9, 12.9e9),
    "qwen3_moe_30b_a3b": (qwen3_moe_30b_a3b, QWEN_VOCAB_SIZE, 30.5e9, 3.3e9),
    "qwen3_moe_235b_a22b": (qwen3_moe_235b_a22b, QWEN_VOCAB_SIZE, 235e9, 22e9),
    "qwen2_moe_14b_a2_7b": (qwen2_moe_14b_a2_7b, QWEN_VOCAB_SIZE, 14.3e9, 2.7e9),
}
