"""JAX's persistent compilation cache, on by default for training runs.

Compiling a training step takes from seconds on a CPU to minutes on an accelerator (74 s for the
tutorial's step on an H200). With the cache, a rerun of the same program loads it instead:
``train_lm`` calls :func:`enable_compilation_cache` before anything is compiled. The train step
takes its learning rate as an input (see ``levanter.trainer.step.build_step_functions``), so a
rerun with another ``num_train_steps`` or schedule is the same program.

Where: ``$XDG_CACHE_HOME/marin/jax-compilation-cache`` (``~/.cache/marin/...`` by default).
``MARIN_COMPILATION_CACHE_DIR`` moves it, or turns it off when empty or ``off``. A cache the user
configured for JAX itself (``JAX_COMPILATION_CACHE_DIR``, ``jax.config``) is left as it is. JAX
decides what is worth keeping (programs that took at least
``jax_persistent_cache_min_compile_time_secs``, 1 s by default, to compile) and keys each entry
by the program, the JAX and XLA versions, the compile options and the device kind, so one folder
serves every machine and version without mix-ups.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import jax

logger = logging.getLogger(__name__)

CACHE_ENV = "MARIN_COMPILATION_CACHE_DIR"
_OFF = ("", "off")


def compilation_cache_dir(environ: Mapping[str, str] = os.environ) -> str | None:
    """The folder training should use, or None: turned off, or JAX's own cache is configured."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    if CACHE_ENV in environ:
        chosen = environ[CACHE_ENV].strip()
        return None if chosen.lower() in _OFF else os.path.expanduser(chosen)
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "marin", "jax-compilation-cache")


def enable_compilation_cache() -> str | None:
    """Point JAX's persistent compilation cache at :func:`compilation_cache_dir` unless JAX already
    has one (or it is off); returns the folder JAX now uses, if any."""
    configured = jax.config.jax_compilation_cache_dir
    if configured or not jax.config.jax_enable_compilation_cache:
        return configured or None
    folder = compilation_cache_dir()
    if folder is None:
        return None
    jax.config.update("jax_compilation_cache_dir", folder)
    logger.info("Compiled programs are cached in %s (%s=off turns this off).", folder, CACHE_ENV)
    return folder
