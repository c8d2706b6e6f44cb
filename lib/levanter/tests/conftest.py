"""Fixtures shared by the levanter tests."""

import jax
import numpy as np
import pytest


@jax.jit
def _our_logits(model, tokens):
    return model(tokens)


@pytest.fixture(scope="session")
def assert_same_logits_as_transformers():
    """``check(our_model, hf_model)``: both give the same logits (within 1e-4) on fixed tokens.

    The tokens are 2 x 11 ids drawn from our model's vocabulary: 22 positions, enough for every
    expert of a small MoE to receive rows and for several tokens to share one.
    """
    torch = pytest.importorskip("torch")

    def check(our_model, hf_model, atol=1e-4):
        tokens = np.random.RandomState(0).randint(0, our_model.vocab_size, size=(2, 11)).astype(np.int32)
        with torch.no_grad():
            theirs = hf_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
        np.testing.assert_allclose(_our_logits(our_model, tokens), theirs, atol=atol)

    return check
