"""OLMo 2 and OLMo 3 sizes: Llama's decoder with OLMo's block (norms on each sublayer's output, a
query/key norm over the whole projection), and for OLMo 3 three sliding-window layers to one
full-attention layer.

The 7B and 13B shapes are the published OLMo 2 7B / 13B and OLMo 3 7B architectures, counted
with their (padded) vocabulary of 100,352; ``lib/levanter/tests/test_hf_olmo.py`` checks each
count against its name. OLMo 3 is declared at its pre-extension context of 8,192 positions: the
published checkpoints extend it with yarn-scaled RoPE, which we do not implement.
"""

from levanter.models.llama import LlamaConfig

OLMO_VOCAB_SIZE = 100_352

# What every OLMo 2 and 3 layer has (see levanter.compat.hf_olmo).
OLMO_BLOCK = dict(norm_placement="post", qk_norm=True, qk_norm_scope="projection")


def olmo3_layer_types(num_layers: int) -> tuple[str, ...]:
    """OLMo 3's pattern: every fourth layer full attention, the others a sliding window."""
    return tuple("full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(num_layers))


# llama_nano's shape with OLMo's block: trains on a laptop CPU.
olmo2_nano = LlamaConfig(hidden_dim=64, intermediate_dim=256, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=2048,
                         **OLMO_BLOCK)
olmo3_nano = LlamaConfig(hidden_dim=64, intermediate_dim=256, num_layers=4, num_heads=2, num_kv_heads=2, max_seq_len=2048,
                         sliding_window=512, layer_types=olmo3_layer_types(4), **OLMO_BLOCK)

olmo2_7b = LlamaConfig(hidden_dim=4096, intermediate_dim=11008, num_layers=32, num_heads=32, num_kv_heads=32, max_seq_len=4096,
                       rope_theta=500_000.0, norm_eps=1e-6, **OLMO_BLOCK)
olmo2_13b = LlamaConfig(hidden_dim=5120, intermediate_dim=13824, num_layers=40, num_heads=40, num_kv_heads=40, max_seq_len=4096,
                        rope_theta=500_000.0, norm_eps=1e-6, **OLMO_BLOCK)
olmo3_7b = LlamaConfig(hidden_dim=4096, intermediate_dim=11008, num_layers=32, num_heads=32, num_kv_heads=32, max_seq_len=8192,
                       rope_theta=500_000.0, norm_eps=1e-6, sliding_window=4096, layer_types=olmo3_layer_types(32), **OLMO_BLOCK)

# name -> config, each counted with OLMO_VOCAB_SIZE
OLMO_SIZES = {"olmo2_7b": olmo2_7b, "olmo2_13b": olmo2_13b, "olmo3_7b": olmo3_7b}
