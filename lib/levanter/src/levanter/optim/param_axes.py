"""What optimizers are told about the parameters they update, shared by the configs (``base``), the
matrix layout and weight decay, which build on one another."""

from __future__ import annotations

from typing import Any

# A pytree of bools shaped like the parameters (True = apply weight decay), or a function of the
# parameters returning one, as optax's ``mask=`` arguments accept.
DecayMask = Any

# A pytree shaped like the parameters whose leaves are ``haliax.module.Axes`` (the logical axis names
# of each parameter, stacking axes such as ``layers`` first), as ``haliax.module.logical_axes``
# returns. Optimizers that treat matrices as matrices (Muon, SOAP, ...) read which dimensions stack
# copies and which are the matrix's own from it; ``None`` when ``build`` is called without a model.
ParamAxes = Any

# Logical axes that stack copies of a parameter rather than being part of its shape.
STACKING_AXES = frozenset({"layers", "experts"})

# The roles (levanter.optim.matrix_layout) weight decay leaves alone unless told otherwise: norm
# scales and biases, the embedding and the output head (see levanter.optim.weight_decay).
DEFAULT_WEIGHT_DECAY_EXCLUDE = ("vector", "embedding", "head")
