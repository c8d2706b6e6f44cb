"""The model configs' ``attention`` field: validated on construction, and it reaches every layer's
attention call (plain and scanned layers, Llama and MoE)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from haliax.nn import AttentionImplementationError
from levanter.models import ConfigError, LlamaConfig
from levanter.models.moe import MoeConfig

VOCAB = 64
SEQ_LEN = 96  # past one query block (64), so "blocked" really runs in blocks
LLAMA = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=SEQ_LEN)
MOE = MoeConfig(
    hidden_dim=32, intermediate_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, num_experts=4, max_seq_len=SEQ_LEN
)


def tokens_and_documents():
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, SEQ_LEN), 0, VOCAB, dtype=jnp.int32)
    segment_ids = jnp.asarray(np.stack([np.repeat([0, 1, 2], [10, 50, 36]), np.repeat([0, 1], [70, 26])]), jnp.int32)
    return tokens, segment_ids


@jax.jit
def _logits(model, tokens, segment_ids):
    return model(tokens, segment_ids=segment_ids)


@pytest.mark.parametrize("config", [LLAMA, MOE], ids=["llama", "moe"])
def test_an_unknown_attention_implementation_is_refused_when_configured(config):
    with pytest.raises(ConfigError, match=r"attention must be one of .*'cudnn'.*got 'flash'"):
        dataclasses.replace(config, attention="flash")


@pytest.mark.parametrize("config", [LLAMA, MOE], ids=["llama", "moe"])
def test_xla_attention_gives_the_logits_of_blocked_attention(config):
    tokens, segment_ids = tokens_and_documents()
    blocked = dataclasses.replace(config, attention="blocked").build(VOCAB, key=jax.random.PRNGKey(0))
    xla = dataclasses.replace(config, attention="xla").build(VOCAB, key=jax.random.PRNGKey(0))
    # float32 rounding of the attention reductions (D products per score, up to T keys), carried
    # through both layers: 8 * eps * (T + D) per layer, as in haliax's attention tests.
    tol = config.num_layers * 8 * float(jnp.finfo(jnp.float32).eps) * (SEQ_LEN + config.head_dim)
    np.testing.assert_allclose(_logits(xla, tokens, segment_ids), _logits(blocked, tokens, segment_ids), atol=tol, rtol=tol)


@pytest.mark.parametrize("use_scan", [False, True], ids=["layers", "scanned"])
@pytest.mark.parametrize("config", [LLAMA, MOE], ids=["llama", "moe"])
def test_the_configured_implementation_reaches_the_attention_call(config, use_scan):
    # cuDNN cannot run this float32 model on any platform (not at all on a CPU, and only bfloat16 or
    # float16 on a GPU): the call refusing it shows that the config's choice got there.
    tokens, segment_ids = tokens_and_documents()
    model = dataclasses.replace(config, attention="cudnn", use_scan=use_scan).build(VOCAB, key=jax.random.PRNGKey(0))
    with pytest.raises(AttentionImplementationError, match="'cudnn' cannot run on platform"):
        _logits(model, tokens, segment_ids)
