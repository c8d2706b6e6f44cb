"""GPT-2 sizes: the four published shapes (OpenAI's small, medium, large and XL).

Names give the published name; ``lib/levanter/tests/test_hf_gpt2.py`` checks each count against
the published figure (tied head, learned position table of 1,024 rows).
"""

from levanter.models.gpt2 import Gpt2Config

GPT2_VOCAB_SIZE = 50_257

gpt2_small = Gpt2Config(hidden_dim=768, intermediate_dim=3072, num_layers=12, num_heads=12, max_seq_len=1024)
gpt2_medium = Gpt2Config(hidden_dim=1024, intermediate_dim=4096, num_layers=24, num_heads=16, max_seq_len=1024)
gpt2_large = Gpt2Config(hidden_dim=1280, intermediate_dim=5120, num_layers=36, num_heads=20, max_seq_len=1024)
gpt2_xl = Gpt2Config(hidden_dim=1600, intermediate_dim=6400, num_layers=48, num_heads=25, max_seq_len=1024)

# name -> config, each counted with GPT2_VOCAB_SIZE
GPT2_SIZES = {"gpt2_small": gpt2_small, "gpt2_medium": gpt2_medium, "gpt2_large": gpt2_large, "gpt2_xl": gpt2_xl}
