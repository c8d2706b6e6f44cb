"""NaN logits never pass for an end-of-text: argmax/categorical over NaNs pick token 0, which is
often the EOS id, and would turn a broken model into a silent empty continuation."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from levanter.inference import sample
from levanter.inference.sampling import NonFiniteLogitsError
from levanter.models.llama import LlamaConfig

VOCAB = 32
CONFIG = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=32)
PROMPT = np.array([[3, 4, 5], [6, 7, 8]], np.int32)


@pytest.fixture(scope="module")
def model():
    return CONFIG.build(VOCAB, key=jax.random.PRNGKey(0))


def _with_nan_in_final_norm(model):
    return eqx.tree_at(lambda m: m.final_norm.weight, model, model.final_norm.weight.at[0].set(jnp.nan))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_logits_raise_instead_of_ending_the_text(model, temperature):
    broken = _with_nan_in_final_norm(model)
    with pytest.raises(NonFiniteLogitsError, match="NaN or infinite logits"):
        sample(broken, PROMPT, max_new_tokens=4, temperature=temperature, eos_id=0, key=jax.random.PRNGKey(1))


def test_a_model_that_really_emits_eos_still_ends_early(model):
    # A zero head gives equal, finite logits, so greedy picks token 0 (the EOS here) for real: a
    # legitimate early end stays an empty continuation.
    eos_model = eqx.tree_at(lambda m: m.lm_head.weight, model, jnp.zeros_like(model.lm_head.weight))
    out = np.asarray(sample(eos_model, PROMPT, max_new_tokens=4, temperature=0.0, eos_id=0))
    assert out.shape == (2, 7)
    assert (out[:, 3:] == 0).all()
