"""Gemma 2 and Gemma 3 sizes: Llama's decoder with Gemma's block (embeddings scaled by
sqrt(hidden), GELU-gated MLP, a norm on each sublayer's input and output, tied embeddings, a head
size of 256) and its attention pattern: Gemma 2 alternates sliding-window and full layers and
soft-caps attention scores and logits; Gemma 3 has five sliding layers to one full, per-head
query/key norms and a RoPE base of its own in the sliding layers.

The 2B, 9B and 1B shapes are the published Gemma 2 2B / 9B and Gemma 3 1B architectures, counted
with their vocabularies; ``lib/levanter/tests/test_hf_gemma.py`` checks each count. Mixed layer
patterns run unstacked (``use_scan=False``).
"""

from levanter.models.llama import LlamaConfig

GEMMA2_VOCAB_SIZE = 256_000
GEMMA3_VOCAB_SIZE = 262_144

# What every Gemma 2 and 3 layer has (see levanter.compat.hf_gemma).
GEMMA_BLOCK = dict(scale_embeddings=True, activation="gelu_tanh", norm_placement="both", tie_word_embeddings=True, norm_eps=1e-6)
GEMMA2_BLOCK = dict(GEMMA_BLOCK, attention_logit_softcap=50.0, final_logit_softcap=30.0)
GEMMA3_BLOCK = dict(GEMMA_BLOCK, qk_norm=True, rope_theta=1_000_000.0, sliding_rope_theta=10_000.0)


def gemma_layer_types(num_layers: int, period: int) -> tuple[str, ...]:
    """Every ``period``-th layer full attention, the others a sliding window (Gemma 2: 2, Gemma 3: 6)."""
    return tuple("full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(num_layers))


# llama_nano's width with Gemma's block: trains on a laptop CPU.
gemma2_nano = LlamaConfig(hidden_dim=64, intermediate_dim=256, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=2048,
                          sliding_window=512, layer_types=gemma_layer_types(2, 2), **GEMMA2_BLOCK)
gemma3_nano = LlamaConfig(hidden_dim=64, intermediate_dim=256, num_layers=6, num_heads=2, num_kv_heads=2, max_seq_len=2048,
                          sliding_window=512, layer_types=gemma_layer_types(6, 6), **GEMMA3_BLOCK)

gemma2_2b = LlamaConfig(hidden_dim=2304, intermediate_dim=9216, num_layers=26, num_heads=8, num_kv_heads=4, head_dim_override=256,
                        max_seq_len=8192, sliding_window=4096, layer_types=gemma_layer_types(26, 2), **GEMMA2_BLOCK)
gemma2_9b = LlamaConfig(hidden_dim=3584, intermediate_dim=14336, num_layers=42, num_heads=16, num_kv_heads=8, head_dim_override=256,
                        max_seq_len=8192, sliding_window=4096, layer_types=gemma_layer_types(42, 2), **GEMMA2_BLOCK)
gemma3_1b = LlamaConfig(hidden_dim=1152, intermediate_dim=6912, num_layers=26, num_heads=4, num_kv_heads=1, head_dim_override=256,
                        max_seq_len=32768, sliding_window=512, layer_types=gemma_layer_types(26, 6), **GEMMA3_BLOCK)

# name -> (config, vocabulary it is counted with)
GEMMA_SIZES = {
    "gemma2_2b": (gemma2_2b, GEMMA2_VOCAB_SIZE),
    "gemma2_9b": (gemma2_9b, GEMMA2_VOCAB_SIZE),
    "gemma3_1b": (gemma3_1b, GEMMA3_VOCAB_SIZE),
}
