"""A jitted step says when it is compiled and how long that took, once, and is otherwise unchanged."""

import logging
import re

import jax
import jax.numpy as jnp

from levanter.trainer.first_call_log import FirstCallLogged


def test_only_the_first_call_is_logged_and_results_and_attributes_are_the_functions_own(caplog):
    caplog.set_level(logging.INFO, logger="levanter.trainer")
    jitted = jax.jit(lambda x: x * 2 + 1)
    step = FirstCallLogged(jitted, "the test step")
    x = jnp.arange(4.0)
    assert step(x).tolist() == [1.0, 3.0, 5.0, 7.0]
    assert step(x + 1).tolist() == [3.0, 5.0, 7.0, 9.0]
    lines = [r.getMessage() for r in caplog.records if r.name == "levanter.trainer"]
    assert lines[0] == "Compiling the test step (or reading it from the compilation cache)..."
    assert re.fullmatch(r"Compiled the test step in \d+\.\ds\.", lines[1])
    assert len(lines) == 2
    # AOT use (memory analysis in the tests) still reaches the jitted function.
    assert step.lower(x).compile()(x).tolist() == [1.0, 3.0, 5.0, 7.0]
