"""The Llama decoder: RMSNorm, grouped-query attention with RoPE, SwiGLU MLP, tied or untied
embeddings. Weight layout matches Hugging Face ``LlamaForCausalLM`` up to transposition."""

from __future__ import annotations

from dataclasses import InitVar, dataclass

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import Stacked
from haliax.axes import BATCH, EMBED, SEQ, VOCAB
from haliax.nn import Embedding, Linear, RMSNorm, rotary_cos_sin
from haliax.partitioning import constrain
from levanter.models.lm import LmOutput
from levanter.models.transformer import Attention, ConfigError, DecoderShape, SwiGluMlp, build_layers, run_layers


@dataclass(frozen=True)
class LlamaConfig(DecoderShape):
    hidden_dim: int
    intermediate_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    use_scan: bool = False
    remat: str = "none"  # what each layer keeps for the backward pass: see transformer.REMAT_POLICIES
    gradient_checkpointing: InitVar[bool | None] = None  # deprecated: True means remat="full"
    attention: str = "auto"  # "auto" (by platform) or an implementation of haliax.nn.dot_product_attention

    def __post_init__(self, gradient_checkpointing: bool | None = None):
        self.check_shape(("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "max_seq_len"))
        self.check_remat(gradient_checkpointing)
        self.check_attention()

    def build(self, vocab_size: int, *, key: jax.Array) -> "LlamaLMHeadModel":
        return LlamaLMHeadModel(self, vocab_size, key=key)

    # -- sizes ---------------------------------------------------------------------------------

    def mlp_parameters(self) -> int:
        return 3 * self.hidden_dim * self.intermediate_dim

    def num_parameters(self, vocab_size: int) -> int:
        """Every parameter, counting a tied embedding once."""
        per_layer = self.attention_parameters() + self.mlp_parameters() + 2 * self.hidden_dim
        return self.num_layers * per_layer + self.embedding_parameters(vocab_size) + self.hidden_dim

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """Training (forward + backward) FLOPs per token, as in the PaLM paper's MFU appendix:

        ``6 * N_matmul + 12 * num_layers * num_heads * head_dim * seq_len``

        ``N_matmul`` counts the weights used in matrix multiplies: every layer's projections plus
        the output projection (``vocab * hidden``, also when tied); the input embedding is a lookup
        and norms are negligible. The second term is attention's two ``T x T`` products (scores and
        weighted values), counted for the full square although causal masking could skip half.
        """
        matmul_params = self.num_layers * (self.attention_parameters() + self.mlp_parameters()) + vocab_size * self.hidden_dim
        return float(6 * matmul_params + self.attention_flops_per_token(seq_len))


class LlamaDecoderLayer(eqx.Module):
    input_norm: RMSNorm
    attention: Attention
    post_attention_norm: RMSNorm
    mlp: SwiGluMlp

    def __init__(self, config: LlamaConfig, *, key: jax.Array):
        ka, km = jax.random.split(key)
        std = config.initializer_range
        self.input_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.attention = Attention(
            config.hidden_dim, config.num_heads, config.num_kv_heads, init_std=std, key=ka, implementation=config.attention
        )
        self.post_attention_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.mlp = SwiGluMlp(config.hidden_dim, config.intermediate_dim, init_std=std, key=km)

    def __call__(self, x, cos, sin, segment_ids):
        x = x + self.attention(self.input_norm(x), cos, sin, segment_ids)
        x = x + self.mlp(self.post_attention_norm(x))
        x = constrain(x, (BATCH, SEQ, EMBED))
        return x, jnp.zeros((), jnp.float32)

    def decode(self, x, cos, sin, k_cache, v_cache, start):
        """As ``__call__`` for new positions over a KV cache (see ``Attention.decode``)."""
        attn, k_cache, v_cache = self.attention.decode(self.input_norm(x), cos, sin, k_cache, v_cache, start)
        x = x + attn
        return x + self.mlp(self.post_attention_norm(x)), k_cache, v_cache


class LlamaLMHeadModel(eqx.Module):
    """Tokens -> next-token logits. Parameters are plain arrays; dtype of the embedding table is
    the compute dtype (cast the tree to bfloat16 for mixed precision)."""

    config: LlamaConfig = eqx.field(static=True)
    embed: Embedding
    layers: tuple[LlamaDecoderLayer, ...] | Stacked
    final_norm: RMSNorm
    lm_head: Linear | None

    def __init__(self, config: LlamaConfig, vocab_size: int, *, key: jax.Array):
        if vocab_size <= 0:
            raise ConfigError(f"vocab_size must be positive, got {vocab_size}.")
        k_embed, k_layers, k_head = jax.random.split(key, 3)
        std = config.initializer_range
        self.config = config
        self.embed = Embedding(vocab_size, config.hidden_dim, key=k_embed, init_std=std)
        self.layers = build_layers(lambda k: LlamaDecoderLayer(config, key=k), config.num_layers, use_scan=config.use_scan, key=k_layers)
        self.final_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            (config.hidden_dim,), (vocab_size,), in_axes=(EMBED,), out_axes=(VOCAB,), key=k_head, init_std=std
        )

    @property
    def vocab_size(self) -> int:
        return self.embed.vocab_size

    def hidden_states(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """The final-normed hidden states [B, T, embed] and the aux loss, before the output projection."""
        return _trunk(self, tokens, segment_ids)

    def unembedding(self) -> jax.Array:
        """The output projection as an [embed, vocab] matrix (the embedding table transposed if tied)."""
        return self.embed.weight.T if self.lm_head is None else self.lm_head.weight

    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput:
        x, aux = self.hidden_states(tokens, segment_ids=segment_ids)
        logits = self.embed.unembed(x) if self.lm_head is None else self.lm_head(x)
        logits = constrain(logits, (BATCH, SEQ, VOCAB))
        return LmOutput(logits, aux)

    def __call__(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> jax.Array:
        return self.forward(tokens, segment_ids=segment_ids).logits


def _trunk(model, tokens: jax.Array, segment_ids: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Embedding, decoder layers and final norm, shared by every decoder-only model here."""
    config = model.config
    seq_len = tokens.shape[-1]
    if seq_len > config.max_seq_len:
        raise ConfigError(f"Sequence length {seq_len} exceeds the model's max_seq_len {config.max_seq_len}.")
    x = constrain(model.embed(tokens), (BATCH, SEQ, EMBED))
    cos, sin = rotary_cos_sin(jnp.arange(seq_len), config.head_dim, config.rope_theta)
    x, aux = run_layers(model.layers, x, cos=cos, sin=sin, segment_ids=segment_ids, remat=config.remat)
    return model.final_norm(x), aux
