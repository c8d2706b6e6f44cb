"""A mixture-of-experts decoder (Mixtral, Qwen3-MoE, Qwen2-MoE): Llama attention, and in place of
the MLP a router that sends each token to its top-k of ``num_experts`` SwiGLU experts.

On one device, or with the experts replicated, tokens are sorted by expert and each expert
multiplies only its own rows (``jax.lax.ragged_dot``), so compute grows with
``num_experts_per_token``, not ``num_experts``, and nothing is dropped. When the active mesh splits
the experts over devices (``MeshConfig(experts=N)``), tokens travel to their experts' devices and
back in fixed-size buffers (:mod:`levanter.models.expert_parallel`); a row beyond an expert's
capacity is dropped and counted. A Switch-style load-balancing loss keeps the router from
collapsing onto a few experts.

Qwen3-MoE's and Qwen2-MoE's differences from Mixtral are options of the one config, off by
default: a per-head query/key norm and head size of its own (as Qwen3's attention), attention
biases, top-k router weights used as they are instead of renormalised, and a gated shared expert
every token passes through (Qwen2-MoE).
"""

from __future__ import annotations

import functools
import math
from dataclasses import InitVar, dataclass, field
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import NamedModule, Stacked
from haliax.axes import BATCH, EMBED, EXPERTS, MLP, SEQ, VOCAB
from haliax.nn import Embedding, Linear, RMSNorm
from haliax.partitioning import constrain
from levanter.models.expert_parallel import expert_placement, grouped_experts
from levanter.models.llama import _trunk
from levanter.models.lm import LmOutput
from levanter.models.transformer import Attention, ConfigError, DecoderLM, DecoderShape, GatedMlp, build_layers
from levanter.recorded_fields import OMIT_WHEN_DEFAULT


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
    # Options added after MoE configs were hashed into step identities: OMIT_WHEN_DEFAULT keeps them
    # out of to_dict() and of every step's hash while they hold their defaults (see transformer.py).
    head_dim_override: int | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)  # None: hidden_dim // num_heads
    qkv_bias: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)  # biases on the q, k, v projections
    o_bias: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)  # a bias on the attention output projection
    qk_norm: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)  # RMSNorm of each query/key head before RoPE
    # Rescale each token's top-k router probabilities to sum to 1 (Mixtral); False uses them as they
    # are (Qwen3-MoE's norm_topk_prob=False).
    renormalize_top_k: bool = field(default=True, metadata=OMIT_WHEN_DEFAULT)
    # Only with the experts split over devices: each expert takes at most
    # ceil(factor * tokens_per_device * k / num_experts) rows from each device per layer, and drops
    # the rest (reported as moe/dropped_fraction). None: as many rows as the device has tokens, so
    # nothing is ever dropped, for num_experts / k times the buffer memory of factor 1.
    expert_capacity_factor: float | None = field(default=2.0, metadata=OMIT_WHEN_DEFAULT)
    # Width of a SwiGLU "shared expert" every token passes through beside its routed ones, its output
    # scaled by sigmoid(w . x) (Qwen2-MoE); 0: none.
    shared_expert_dim: int = field(default=0, metadata=OMIT_WHEN_DEFAULT)

    def __post_init__(self, gradient_checkpointing: bool | None = None):
        self.check_shape(("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "num_experts", "max_seq_len"))
        self.check_remat(gradient_checkpointing)
        self.check_attention()
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ConfigError(
                f"num_experts_per_token ({self.num_experts_per_token}) must be between 1 and num_experts ({self.num_experts})."
            )
        if isinstance(self.shared_expert_dim, bool) or not isinstance(self.shared_expert_dim, int) or self.shared_expert_dim < 0:
            raise ConfigError(f"MoeConfig.shared_expert_dim must be a non-negative integer, got {self.shared_expert_dim!r}.")
        factor = self.expert_capacity_factor
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor < math.inf):
            raise ConfigError(f"MoeConfig.expert_capacity_factor must be a positive number or None, got {factor!r}.")

    def build(self, vocab_size: int, *, key: jax.Array) -> "MoeLMHeadModel":
        return MoeLMHeadModel(self, vocab_size, key=key)

    def expert_parameters(self) -> int:
        return 3 * self.hidden_dim * self.intermediate_dim

    def shared_expert_parameters(self) -> int:
        """Per layer: the shared expert's three projections and its gate (none without one)."""
        return 3 * self.hidden_dim * self.shared_expert_dim + self.hidden_dim if self.shared_expert_dim else 0

    def bias_and_head_norm_parameters(self) -> int:
        """Per layer: the optional attention biases and query/key norms (none for Mixtral)."""
        count = self.head_dim * (self.num_heads + 2 * self.num_kv_heads) if self.qkv_bias else 0
        return count + (self.hidden_dim if self.o_bias else 0) + (2 * self.head_dim if self.qk_norm else 0)

    def num_parameters(self, vocab_size: int) -> int:
        """Every parameter (all experts), counting a tied embedding once."""
        per_layer = (
            self.attention_parameters()
            + self.hidden_dim * self.num_experts  # router
            + self.num_experts * self.expert_parameters()
            + 2 * self.hidden_dim
            + self.bias_and_head_norm_parameters()
            + self.shared_expert_parameters()
        )
        return self.num_layers * per_layer + self.embedding_parameters(vocab_size) + self.hidden_dim

    def num_active_parameters(self, vocab_size: int) -> int:
        """Parameters one token uses: only its ``num_experts_per_token`` experts count."""
        inactive = (self.num_experts - self.num_experts_per_token) * self.expert_parameters()
        return self.num_parameters(vocab_size) - self.num_layers * inactive

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """As ``LlamaConfig.flops_per_token``, with only the active experts' weights (and the router)."""
        per_layer = (
            self.attention_parameters() + self.hidden_dim * self.num_experts + self.num_experts_per_token * self.expert_parameters()
            + self.shared_expert_parameters()
        )
        matmul_params = self.num_layers * per_layer + vocab_size * self.hidden_dim
        return float(6 * matmul_params + self.attention_flops_per_token(seq_len))


class RoutingStats(NamedTuple):
    """What one MoE layer reports beside its output (the decoder sums these over layers)."""

    balance: jax.Array  # the Switch load-balancing loss: 1.0 when balanced, num_experts when collapsed
    dropped_fraction: jax.Array  # the share of (token, choice) rows an expert had no room for


class MoeMlp(NamedModule):
    """Top-k routed SwiGLU experts. Returns the output and the layer's :class:`RoutingStats`."""

    router: Linear  # embed -> experts
    gate_proj: jax.Array  # [experts, embed, mlp]
    up_proj: jax.Array  # [experts, embed, mlp]
    down_proj: jax.Array  # [experts, mlp, embed]
    num_experts_per_token: int = eqx.field(static=True)
    renormalize_top_k: bool = eqx.field(static=True, default=True)
    capacity_factor: float | None = eqx.field(static=True, default=2.0)
    shared_expert: GatedMlp | None = None
    shared_expert_gate: Linear | None = None  # embed -> 1: how much of the shared expert each token takes

    def __init__(self, config: MoeConfig, *, key: jax.Array):
        kr, kg, ku, kd = jax.random.split(key, 4)
        std = config.initializer_range
        e, h, i = config.num_experts, config.hidden_dim, config.intermediate_dim
        self.router = Linear((h,), (e,), in_axes=(EMBED,), out_axes=(EXPERTS,), key=kr, init_std=std)
        self.gate_proj = std * jax.random.normal(kg, (e, h, i))
        self.up_proj = std * jax.random.normal(ku, (e, h, i))
        self.down_proj = std * jax.random.normal(kd, (e, i, h))
        self.num_experts_per_token = config.num_experts_per_token
        self.renormalize_top_k = config.renormalize_top_k
        self.capacity_factor = config.expert_capacity_factor
        # Every field is set, absent ones to None, so the tree structure never depends on defaults.
        self.shared_expert, self.shared_expert_gate = None, None
        if config.shared_expert_dim:
            ks, kg = jax.random.split(jax.random.fold_in(key, 1))
            self.shared_expert = GatedMlp(h, config.shared_expert_dim, init_std=std, key=ks)
            self.shared_expert_gate = Linear((h,), (1,), in_axes=(EMBED,), out_axes=(None,), key=kg, init_std=std)

    def param_axes(self):
        return {"gate_proj": (EXPERTS, EMBED, MLP), "up_proj": (EXPERTS, EMBED, MLP), "down_proj": (EXPERTS, MLP, EMBED)}

    @property
    def num_experts(self) -> int:
        return int(self.gate_proj.shape[-3])

    def route(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Router probabilities [N, E] (float32), and each token's top-k expert weights and ids [N, k].

        The top-k weights are renormalised to sum to 1 (Mixtral) unless ``renormalize_top_k`` is off.
        """
        probs = jax.nn.softmax(self.router(x).astype(jnp.float32), axis=-1)
        top_weights, top_experts = jax.lax.top_k(probs, self.num_experts_per_token)
        if self.renormalize_top_k:
            top_weights = top_weights / jnp.sum(top_weights, axis=-1, keepdims=True)
        return probs, top_weights, top_experts

    def __call__(self, x: jax.Array) -> tuple[jax.Array, RoutingStats]:
        shape, k, num_experts = x.shape, self.num_experts_per_token, self.num_experts
        tokens = x.reshape(-1, shape[-1])
        probs, top_weights, top_experts = self.route(tokens)
        expert_of_row = top_experts.reshape(-1)
        dtype = x.dtype
        experts = (self.gate_proj.astype(dtype), self.up_proj.astype(dtype), self.down_proj.astype(dtype))

        placement = expert_placement(num_experts)
        if placement is None:  # no mesh: every expert here, every token here
            y = grouped_experts(tokens, top_weights.astype(dtype), top_experts, experts).reshape(shape)
            dropped = jnp.zeros((), jnp.float32)
        else:
            by_row = (shape[0], -1)  # [batch, positions, ...]: the layout the mesh splits
            y, dropped_rows = placement.apply(
                x.reshape(*by_row, shape[-1]), top_weights.astype(dtype).reshape(*by_row, k), top_experts.reshape(*by_row, k),
                experts, capacity_factor=self.capacity_factor,
            )
            y = y.reshape(shape)
            dropped = dropped_rows / expert_of_row.shape[0]

        if self.shared_expert is not None:
            y = y + jax.nn.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

        # Switch Transformer balance loss: E * sum_e (share of routed rows to e) * (mean prob of e);
        # 1.0 when perfectly balanced, num_experts when all tokens go to one expert.
        routed_share = jnp.bincount(expert_of_row, length=num_experts).astype(jnp.float32) / expert_of_row.shape[0]
        balance = num_experts * jnp.sum(routed_share * jnp.mean(probs, axis=0))
        return y, RoutingStats(balance, dropped)


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
            implementation=config.attention, head_dim=config.head_dim_override, qkv_bias=config.qkv_bias,
            o_bias=config.o_bias, qk_norm=config.qk_norm, norm_eps=config.norm_eps,
        )
        self.post_attention_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.moe = MoeMlp(config, key=km)

    def __call__(self, x, cos, sin, segment_ids):
        x = x + self.attention(self.input_norm(x), cos, sin, segment_ids)
        y, stats = self.moe(self.post_attention_norm(x))
        x = constrain(x + y, (BATCH, SEQ, EMBED))
        return x, stats

    def decode(self, x, cos, sin, k_cache, v_cache, start):
        """As ``__call__`` for new positions over a KV cache (see ``Attention.decode``)."""
        attn, k_cache, v_cache = self.attention.decode(self.input_norm(x), cos, sin, k_cache, v_cache, start)
        x = x + attn
        y, _ = self.moe(self.post_attention_norm(x))
        return x + y, k_cache, v_cache


class MoeLMHeadModel(DecoderLM):
    """Tokens -> logits; ``forward`` also returns the weighted mean balance loss over layers and the
    routing metrics (``moe/dropped_fraction``; ``moe/expert_capacity`` when experts are split)."""

    config: MoeConfig = eqx.field(static=True)
    embed: Embedding
    layers: tuple[MoeDecoderLayer, ...] | Stacked
    final_norm: RMSNorm
    lm_head: Linear | None

    def __init__(self, config: MoeConfig, vocab_size: int, *, key: jax.Array):
        make_layers = functools.partial(build_layers, lambda k: MoeDecoderLayer(config, key=k), config.num_layers, use_scan=config.use_scan)
        self._build(config, vocab_size, keys=jax.random.split(key, 3), make_layers=make_layers,
                    final_norm=RMSNorm(config.hidden_dim, eps=config.norm_eps))

    def hidden_states_and_metrics(
        self, tokens: jax.Array, *, segment_ids: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """The final-normed hidden states, the weighted aux loss, and the routing metrics (means over layers)."""
        config = self.config
        x, stats = _trunk(self, tokens, segment_ids)
        metrics = {"moe/dropped_fraction": stats.dropped_fraction / config.num_layers}
        placement = expert_placement(config.num_experts)
        if placement is not None and placement.axis is not None:
            capacity = placement.capacity(
                tokens.shape, config.num_experts, config.num_experts_per_token, config.expert_capacity_factor
            )
            metrics["moe/expert_capacity"] = jnp.asarray(capacity, jnp.float32)
        return x, config.router_aux_loss_coef * stats.balance / config.num_layers, metrics

    def hidden_states(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        x, aux, _ = self.hidden_states_and_metrics(tokens, segment_ids=segment_ids)
        return x, aux

    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput:
        x, aux, metrics = self.hidden_states_and_metrics(tokens, segment_ids=segment_ids)
        return LmOutput(constrain(self._logits(x), (BATCH, SEQ, VOCAB)), aux, metrics)
