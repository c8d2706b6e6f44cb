"""GPT-2: learned absolute positions, LayerNorm with a bias, multi-head attention and a two-layer
GELU MLP, every projection with a bias, the output projection tied to the embedding by default.
Weight layout matches Hugging Face ``GPT2LMHeadModel`` up to the split of its fused q/k/v matrix.

A model of its own rather than options of ``LlamaConfig``: it differs from Llama in the norm
(LayerNorm, which centres and has a bias, instead of RMSNorm), the positions (a learned table
added to the input instead of rotations inside attention) and the MLP (one activation between
two projections, not a gate), so as options it would put a branch in every part of Llama's
layer. The attention itself is the shared one (``transformer.Attention`` with biases and without
rotary tables), and so are the layer loop, remat, scan and cached decoding.
"""

from __future__ import annotations

import functools
from dataclasses import InitVar, dataclass

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import Stacked
from haliax.axes import BATCH, EMBED, MLP, SEQ, VOCAB
from haliax.module import NamedModule
from haliax.nn import Embedding, Linear
from haliax.partitioning import constrain
from levanter.models.lm import LmOutput
from levanter.models.transformer import ACTIVATIONS, Attention, Bias, ConfigError, DecoderLM, DecoderShape, build_layers, run_layers


@dataclass(frozen=True)
class Gpt2Config(DecoderShape):
    hidden_dim: int
    intermediate_dim: int  # GPT-2's n_inner: 4 * hidden_dim in every published size
    num_layers: int
    num_heads: int
    max_seq_len: int = 1024  # n_positions: rows of the learned position table
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    use_scan: bool = False
    remat: str = "none"  # see transformer.REMAT_POLICIES
    gradient_checkpointing: InitVar[bool | None] = None  # deprecated: True means remat="full"
    attention: str = "auto"
    activation: str = "gelu_tanh"  # a key of ACTIVATIONS; GPT-2's gelu_new is the tanh approximation

    def __post_init__(self, gradient_checkpointing: bool | None = None):
        self.check_shape(("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "max_seq_len"))
        self.check_remat(gradient_checkpointing)
        self.check_attention()
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"Gpt2Config.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}.")

    @property
    def num_kv_heads(self) -> int:  # multi-head attention: a key and value head per query head
        return self.num_heads

    def rope_tables(self, positions: jax.Array) -> tuple[None, None]:
        """No rotary tables: positions enter as a learned embedding of the input."""
        return None, None

    def build(self, vocab_size: int, *, key: jax.Array) -> "Gpt2LMHeadModel":
        return Gpt2LMHeadModel(self, vocab_size, key=key)

    # -- sizes ---------------------------------------------------------------------------------

    def mlp_parameters(self) -> int:
        return 2 * self.hidden_dim * self.intermediate_dim

    def num_parameters(self, vocab_size: int) -> int:
        """Every parameter, a tied embedding counted once: per layer the four projections and the
        two MLP matrices with their biases and two LayerNorms (scale and bias); the token and
        position tables; the final LayerNorm."""
        h = self.hidden_dim
        per_layer = self.attention_parameters() + 4 * h + self.mlp_parameters() + self.intermediate_dim + h + 4 * h
        return self.num_layers * per_layer + self.embedding_parameters(vocab_size) + self.max_seq_len * h + 2 * h

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """Training FLOPs per token, as ``LlamaConfig.flops_per_token`` counts them (PaLM's formula)."""
        matmul_params = self.num_layers * (self.attention_parameters() + self.mlp_parameters()) + vocab_size * self.hidden_dim
        return float(6 * matmul_params + self.attention_flops_per_token(seq_len))


class LayerNorm(NamedModule):
    """``(x - mean(x)) / std(x) * weight + bias`` over the last dimension, statistics in float32."""

    weight: jax.Array
    bias: jax.Array
    eps: float = eqx.field(static=True)

    def __init__(self, dim: int, *, eps: float = 1e-5, dtype=jnp.float32):
        self.weight = jnp.ones((dim,), dtype=dtype)
        self.bias = jnp.zeros((dim,), dtype=dtype)
        self.eps = eps

    def param_axes(self):
        return {"weight": (EMBED,), "bias": (EMBED,)}

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(centred), axis=-1, keepdims=True)
        normed = (centred * jax.lax.rsqrt(variance + self.eps)).astype(x.dtype)
        return normed * self.weight.astype(x.dtype) + self.bias.astype(x.dtype)


class PositionEmbedding(Embedding):
    """The learned table of absolute positions, ``[max_seq_len, embed]``."""

    def param_axes(self):
        return {"weight": (SEQ, EMBED)}


class Mlp(eqx.Module):
    """``down(act(up(x)))``, each projection with a bias."""

    up_proj: Linear
    up_bias: Bias
    down_proj: Linear
    down_bias: Bias
    activation: str = eqx.field(static=True, default="gelu_tanh")

    def __init__(self, hidden_dim: int, intermediate_dim: int, *, init_std: float, key: jax.Array, activation: str):
        ku, kd = jax.random.split(key)
        self.up_proj = Linear((hidden_dim,), (intermediate_dim,), in_axes=(EMBED,), out_axes=(MLP,), key=ku, init_std=init_std)
        self.up_bias = Bias((intermediate_dim,), (MLP,))
        self.down_proj = Linear((intermediate_dim,), (hidden_dim,), in_axes=(MLP,), out_axes=(EMBED,), key=kd, init_std=init_std)
        self.down_bias = Bias((hidden_dim,), (EMBED,))
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        h = ACTIVATIONS[self.activation](self.up_bias(self.up_proj(x)))
        h = constrain(h, (BATCH, SEQ, MLP))
        return self.down_bias(self.down_proj(h))


class Gpt2Block(eqx.Module):
    """``x + attention(ln(x))``, then ``x + mlp(ln(x))``."""

    input_norm: LayerNorm
    attention: Attention
    post_attention_norm: LayerNorm  # the MLP's input norm, named as in LlamaDecoderLayer
    mlp: Mlp

    def __init__(self, config: Gpt2Config, *, key: jax.Array):
        ka, km = jax.random.split(key)
        std = config.initializer_range
        self.input_norm = LayerNorm(config.hidden_dim, eps=config.norm_eps)
        self.attention = Attention(
            config.hidden_dim, config.num_heads, config.num_heads, init_std=std, key=ka, implementation=config.attention,
            qkv_bias=True, o_bias=True,
        )
        self.post_attention_norm = LayerNorm(config.hidden_dim, eps=config.norm_eps)
        self.mlp = Mlp(config.hidden_dim, config.intermediate_dim, init_std=std, key=km, activation=config.activation)

    def __call__(self, x, cos, sin, segment_ids):
        x = x + self.attention(self.input_norm(x), cos, sin, segment_ids)
        x = x + self.mlp(self.post_attention_norm(x))
        return constrain(x, (BATCH, SEQ, EMBED)), jnp.zeros((), jnp.float32)

    def decode(self, x, cos, sin, k_cache, v_cache, start):
        """As ``__call__`` for new positions over a KV cache (see ``Attention.decode``)."""
        attn, k_cache, v_cache = self.attention.decode(self.input_norm(x), cos, sin, k_cache, v_cache, start)
        x = x + attn
        return x + self.mlp(self.post_attention_norm(x)), k_cache, v_cache


class Gpt2LMHeadModel(DecoderLM):
    """Tokens -> next-token logits, with the same contract as ``LlamaLMHeadModel``."""

    config: Gpt2Config = eqx.field(static=True)
    embed: Embedding
    position_embed: PositionEmbedding
    layers: tuple[Gpt2Block, ...] | Stacked
    final_norm: LayerNorm
    lm_head: Linear | None

    def __init__(self, config: Gpt2Config, vocab_size: int, *, key: jax.Array):
        k_embed, k_pos, k_layers, k_head = jax.random.split(key, 4)
        make_layers = functools.partial(build_layers, lambda k: Gpt2Block(config, key=k), config.num_layers, use_scan=config.use_scan)
        self._build(config, vocab_size, keys=(k_embed, k_layers, k_head), make_layers=make_layers,
                    final_norm=LayerNorm(config.hidden_dim, eps=config.norm_eps))
        self.position_embed = PositionEmbedding(config.max_seq_len, config.hidden_dim, key=k_pos, init_std=config.initializer_range)

    def hidden_states(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """The final-normed hidden states [B, T, embed] and the aux loss (zero)."""
        seq_len = tokens.shape[-1]
        if seq_len > self.config.max_seq_len:
            raise ConfigError(f"Sequence length {seq_len} exceeds the model's max_seq_len {self.config.max_seq_len}.")
        # Positions count from each window's start, also across packed documents, as GPT-2 was trained.
        x = self.embed(tokens) + self.position_embed(jnp.arange(seq_len))
        x = constrain(x, (BATCH, SEQ, EMBED))
        x, aux = run_layers(self.layers, x, cos=None, sin=None, segment_ids=segment_ids, remat=self.config.remat)
        return self.final_norm(x), aux

    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput:
        x, aux = self.hidden_states(tokens, segment_ids=segment_ids)
        return LmOutput(constrain(self._logits(x), (BATCH, SEQ, VOCAB)), aux)
