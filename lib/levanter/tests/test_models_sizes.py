"""Every named model size has the parameter count its name says (pure arithmetic, no arrays)."""

import re

import pytest

from experiments.llama import LLAMA_SIZES, llama_nano
from experiments.moe import MOE_SIZES, moe_nano


def _size_in_name(name: str) -> float:
    match = re.search(r"_(\d+)(?:_(\d+))?([mb])$", name)
    assert match, name
    whole, fraction, unit = match.groups()
    value = float(f"{whole}.{fraction}" if fraction else whole)
    return value * (1e6 if unit == "m" else 1e9)


@pytest.mark.parametrize("name", sorted(LLAMA_SIZES))
def test_llama_size_matches_its_name(name):
    config, vocab_size = LLAMA_SIZES[name]
    assert config.num_parameters(vocab_size) == pytest.approx(_size_in_name(name), rel=0.13)


@pytest.mark.parametrize("name", sorted(MOE_SIZES))
def test_moe_size_matches_its_name(name):
    config, vocab_size, total, active = MOE_SIZES[name]
    assert config.num_parameters(vocab_size) == pytest.approx(total, rel=0.13)
    assert config.num_active_parameters(vocab_size) == pytest.approx(active, rel=0.3)


def test_published_shapes_are_exact():
    assert LLAMA_SIZES["llama_8b"][0].num_parameters(128_256) == 8_030_261_248
    assert MOE_SIZES["mixtral_8x7b"][0].num_parameters(32_000) == 46_702_792_704


def test_nano_models_fit_the_tutorial():
    # The tutorial trains at seq_len 2048 with the built-in 4,063-token vocabulary on a CPU.
    for config in (llama_nano, moe_nano):
        assert config.max_seq_len >= 2048
        assert config.num_parameters(4063) < 1_000_000
    assert llama_nano.num_parameters(4063) == 651_456  # the figure docs/getting-started.md quotes
