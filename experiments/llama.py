"""Llama model sizes, from a CPU-sized nano model to 70B.

Names give the total parameter count (embeddings included) with the vocabulary noted beside each;
``lib/levanter/tests/test_models_sizes.py`` checks every count against its name. The 8B, 13B and
70B shapes are the published Llama 3 8B, Llama 2 13B and Llama 3 70B architectures.
"""

from levanter.models.llama import LlamaConfig

LLAMA3_VOCAB_SIZE = 128_256
LLAMA2_VOCAB_SIZE = 32_000

# Trains on a laptop CPU at seq_len 2048 in the tutorial (100 steps in one to two minutes on two
# cores). Width 64 with an untied output head is the narrowest shape we measured to write
# English-like stories after 100 steps of the built-in corpus when the learning rate suits so short
# a run (3e-3 to 6e-3); hidden 32, or tied embeddings, stay well behind (docs/getting-started.md).
llama_nano = LlamaConfig(
    hidden_dim=64,
    intermediate_dim=256,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    max_seq_len=2048,
    tie_word_embeddings=False,
)

# The small end of the ladder is dominated by the 128k-vocabulary embeddings (untied).
llama_30m = LlamaConfig(hidden_dim=128, intermediate_dim=448, num_layers=4, num_heads=4, num_kv_heads=4, max_seq_len=4096)
llama_50m = LlamaConfig(hidden_dim=192, intermediate_dim=512, num_layers=4, num_heads=6, num_kv_heads=6, max_seq_len=4096)
llama_75m = LlamaConfig(hidden_dim=256, intermediate_dim=896, num_layers=8, num_heads=4, num_kv_heads=4, max_seq_len=4096)
llama_150m = LlamaConfig(hidden_dim=512, intermediate_dim=1792, num_layers=6, num_heads=8, num_kv_heads=8, max_seq_len=4096)
llama_300m = LlamaConfig(hidden_dim=768, intermediate_dim=2688, num_layers=12, num_heads=12, num_kv_heads=12, max_seq_len=4096)
llama_600m = LlamaConfig(hidden_dim=1024, intermediate_dim=3584, num_layers=24, num_heads=16, num_kv_heads=8, max_seq_len=4096)
llama_1_4b = LlamaConfig(hidden_dim=2048, intermediate_dim=7168, num_layers=16, num_heads=16, num_kv_heads=8, max_seq_len=4096)

# Published architectures, sized for pods: their layers are scanned, so XLA compiles one layer's
# program instead of each layer's. For a v5e-256 at 256 x 4,096 tokens (`marin plan`,
# docs/training.md#from-the-tutorial-to-a-pod), XLA took 10 minutes to refuse the unrolled 8B on a
# busy 2-core machine and 8 seconds to refuse the scanned one, both keeping every activation (remat
# "none": 15.79 GiB a chip unrolled, 39.50 scanned, which stacks every layer's); with remat
# "save_matmuls" the scanned 8B fits, 13.47 GiB a chip at XLA's peak.
llama_8b = LlamaConfig(
    hidden_dim=4096, intermediate_dim=14336, num_layers=32, num_heads=32, num_kv_heads=8,
    max_seq_len=8192, rope_theta=500_000.0, use_scan=True,
)
llama_13b = LlamaConfig(
    hidden_dim=5120, intermediate_dim=13824, num_layers=40, num_heads=40, num_kv_heads=40, max_seq_len=4096,
    use_scan=True,
)
llama_70b = LlamaConfig(
    hidden_dim=8192, intermediate_dim=28672, num_layers=80, num_heads=64, num_kv_heads=8,
    max_seq_len=8192, rope_theta=500_000.0, use_scan=True,
)

# name -> (config, vocabulary size its name is counted with)
LLAMA_SIZES = {
    "llama_30m": (llama_30m, LLAMA3_VOCAB_SIZE),
    "llama_50m": (llama_50m, LLAMA3_VOCAB_SIZE),
    "llama_75m": (llama_75m, LLAMA3_VOCAB_SIZE),
    "llama_150m": (llama_150m, LLAMA3_VOCAB_SIZE),
    "llama_300m": (llama_300m, LLAMA3_VOCAB_SIZE),
    "llama_600m": (llama_600m, LLAMA3_VOCAB_SIZE),
    "llama_1_4b": (llama_1_4b, LLAMA3_VOCAB_SIZE),
    "llama_8b": (llama_8b, LLAMA3_VOCAB_SIZE),
    "llama_13b": (llama_13b, LLAMA2_VOCAB_SIZE),
    "llama_70b": (llama_70b, LLAMA3_VOCAB_SIZE),
}
