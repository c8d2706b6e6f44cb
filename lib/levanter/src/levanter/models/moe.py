"""A Mixtral-shaped mixture-of-experts decoder: Llama attention, and in place of the MLP a router
that sends each token to its top-k of ``num_experts`` SwiGLU experts.

Tokens are sorted by expert and each expert multiplies only its own rows (``jax.lax.ragged_dot``),
so compute grows with ``num_experts_per_token``, not ``num_experts``, and nothing is dropped (no
capacity factor). A Switch-style load-balancing loss keeps the router from collapsing onto a few
experts.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import NamedModule, Stacked
from haliax.axes import BATCH, EMBED, EXPERTS, MLP, SEQ, VOCAB
from haliax.nn import Embedding, Linear, RMSNorm
from haliax.partitioning import constrain
from levanter.models.llama import _trunk
from levanter.models.lm import LmOutput
from levanter.models.transformer import Attention, ConfigError, DecoderShape, build_layers


@dataclass(frozen=True)
class MoeConfig(DecoderShape):
    hidden_dim: int
    intermediate_dim: int  # of each expert
    num_layers: int
    num_heads: int
    num_kv_heads: int
    num_experts: int = 8
    num_experts_per_token: int = 2
    router_aux_loss_coef: float = 0.01
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
        self.check_shape(("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "num_experts", "max_seq_len"))
        self.check_remat(gradient_checkpointing)
        self.check_attention()
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ConfigError(
                f"num_experts_per_token ({self.num_experts_per_token}) must be between 1 and num_experts ({self.num_experts})."
            )

    def build(self, vocab_size: int, *, key: jax.Array) -> "MoeLMHeadModel":
        return MoeLMHeadModel(self, vocab_size, key=key)

    def expert_parameters(self) -> int:
        return 3 * self.hidden_dim * self.intermediate_dim

    def num_parameters(self, vocab_size: int) -> int:
        """Every parameter (all experts), counting a tied embedding once."""
        per_layer = (
            self.attention_parameters()
            + self.hidden_dim * self.num_experts  # router
            + self.num_experts * self.expert_parameters()
            + 2 * self.hidden_dim
        )
        return self.num_layers * per_layer + self.embedding_parameters(vocab_size) + self.hidden_dim

    def num_active_parameters(self, vocab_size: int) -> int:
        """Parameters one token uses: only its ``num_experts_per_token`` experts count."""
        inactive = (self.num_experts - self.num_experts_per_token) * self.expert_parameters()
        return self.num_parameters(vocab_size) - self.num_layers * inactive

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """As ``LlamaConfig.flops_per_token``, with only the active experts' weights (and the router)."""
        per_layer = self.attention_parameters() + self.hidden_dim * self.num_experts + self.num_experts_per_token * self.expert_parameters()
        matmul_params = self.num_layers * per_layer + vocab_size * self.hidden_dim
        return float(6 * matmul_params + self.attention_flops_per_token(seq_len))


class MoeMlp(NamedModule):
    """Top-k routed SwiGLU experts. Returns the output and the layer's load-balancing loss."""

    router: Linear  # embed -> experts
    gate_proj: jax.Array  # [experts, embed, mlp]
    up_proj: jax.Array  # [experts, embed, mlp]
    down_proj: jax.Array  # [experts, mlp, embed]
    num_experts_per_token: int = eqx.field(static=True)

    def __init__(self, config: MoeConfig, *, key: jax.Array):
        kr, kg, ku, kd = jax.random.split(key, 4)
        std = config.initializer_range
        e, h, i = config.num_experts, config.hidden_dim, config.intermediate_dim
        self.router = Linear((h,), (e,), in_axes=(EMBED,), out_axes=(EXPERTS,), key=kr, init_std=std)
        self.gate_proj = std * jax.random.normal(kg, (e, h, i))
        self.up_proj = std * jax.random.normal(ku, (e, h, i))
        self.down_proj = std * jax.random.normal(kd, (e, i, h))
        self.num_experts_per_token = config.num_experts_per_token

    def param_axes(self):
        return {"gate_proj": (EXPERTS, EMBED, MLP), "up_proj": (EXPERTS, EMBED, MLP), "down_proj": (EXPERTS, MLP, EMBED)}

    @property
    def num_experts(self) -> int:
        return int(self.gate_proj.shape[-3])

    def route(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Router probabilities [N, E] (float32), and each token's top-k expert weights and ids [N, k].

        The top-k weights are renormalised to sum to 1, as in Mixtral.
        """
        probs = jax.nn.softmax(self.router(x).astype(jnp.float32), axis=-1)
        top_weights, top_experts = jax.lax.top_k(probs, self.num_experts_per_token)
        return probs, top_weights / jnp.sum(top_weights, axis=-1, keepdims=True), top_experts

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        shape, k, num_experts = x.shape, self.num_experts_per_token, self.num_experts
        tokens = x.reshape(-1, shape[-1])
        probs, top_weights, top_experts = self.route(tokens)

        # One row per (token, choice), grouped by expert so each expert's rows are contiguous.
        expert_of_row = top_experts.reshape(-1)
        order = jnp.argsort(expert_of_row, stable=True)
        rows = tokens[order // k]
        group_sizes = jnp.bincount(expert_of_row, length=num_experts).astype(jnp.int32)
        dtype = x.dtype
        gate = jax.lax.ragged_dot(rows, self.gate_proj.astype(dtype), group_sizes)
        up = jax.lax.ragged_dot(rows, self.up_proj.astype(dtype), group_sizes)
        out = jax.lax.ragged_dot(jax.nn.silu(gate) * up, self.down_proj.astype(dtype), group_sizes)

        per_choice = out[jnp.argsort(order)].reshape(tokens.shape[0], k, shape[-1])
        y = jnp.einsum("nkh,nk->nh", per_choice, top_weights.astype(dtype)).reshape(shape)

        # Switch Transformer balance loss: E * sum_e (share of routed rows to e) * (mean prob of e);
        # 1.0 when perfectly balanced, num_experts when all tokens go to one expert.
        routed_share = group_sizes.astype(jnp.float32) / expert_of_row.shape[0]
        balance = num_experts * jnp.sum(routed_share * jnp.mean(probs, axis=0))
        return y, balance


class MoeDecoderLayer(eqx.Module):
    input_norm: RMSNorm
    attention: Attention
    post_attention_norm: RMSNorm
    moe: MoeMlp

    def __init__(self, config: MoeConfig, *, key: jax.Array):
        ka, km = jax.random.split(key)
        self.input_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.attention = Attention(
            config.hidden_dim, config.num_heads, config.num_kv_heads, init_std=config.initializer_range, key=ka,
            implementation=config.attention,
        )
        self.post_attention_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.moe = MoeMlp(config, key=km)

    def __call__(self, x, cos, sin, segment_ids):
        x = x + self.attention(self.input_norm(x), cos, sin, segment_ids)
        y, balance = self.moe(self.post_attention_norm(x))
        x = constrain(x + y, (BATCH, SEQ, EMBED))
        return x, balance

    def decode(self, x, cos, sin, k_cache, v_cache, start):
        """As ``__call__`` for new positions over a KV cache (see ``Attention.decode``)."""
        attn, k_cache, v_cache = self.attention.decode(self.input_norm(x), cos, sin, k_cache, v_cache, start)
        x = x + attn
        y, _ = self.moe(self.post_attention_norm(x))
        return x + y, k_cache, v_cache


class MoeLMHeadModel(eqx.Module):
    """Tokens -> logits; ``forward`` also returns the weighted mean balance loss over layers."""

    config: MoeConfig = eqx.field(static=True)
    embed: Embedding
    layers: tuple[MoeDecoderLayer, ...] | Stacked
    final_norm: RMSNorm
    lm_head: Linear | None

    def __init__(self, config: MoeConfig, vocab_size: int, *, key: jax.Array):
        if vocab_size <= 0:
            raise ConfigError(f"vocab_size must be positive, got {vocab_size}.")
        k_embed, k_layers, k_head = jax.random.split(key, 3)
        self.config = config
        self.embed = Embedding(vocab_size, config.hidden_dim, key=k_embed, init_std=config.initializer_range)
        self.layers = build_layers(lambda k: MoeDecoderLayer(config, key=k), config.num_layers, use_scan=config.use_scan, key=k_layers)
        self.final_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            (config.hidden_dim,), (vocab_size,), in_axes=(EMBED,), out_axes=(VOCAB,), key=k_head, init_std=config.initializer_range
        )

    @property
    def vocab_size(self) -> int:
        return self.embed.vocab_size

    def hidden_states(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        x, balance_total = _trunk(self, tokens, segment_ids)
        return x, self.config.router_aux_loss_coef * balance_total / self.config.num_layers

    def unembedding(self) -> jax.Array:
        return self.embed.weight.T if self.lm_head is None else self.lm_head.weight

    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput:
        x, aux = self.hidden_states(tokens, segment_ids=segment_ids)
        logits = self.embed.unembed(x) if self.lm_head is None else self.lm_head(x)
        return LmOutput(constrain(logits, (BATCH, SEQ, VOCAB)), aux)

    def __call__(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> jax.Array:
        return self.forward(tokens, segment_ids=segment_ids).logits
