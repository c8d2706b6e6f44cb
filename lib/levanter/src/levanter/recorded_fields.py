"""Which fields of a config its record and its identity include.

Configs (models, optimizers, the trainer's hashed settings) are written to records and hashed into
step identities. An option added after configs of its class were already in use must change
neither, or every existing run would look new. Such a field is marked :data:`OMIT_WHEN_DEFAULT` and
left out while it holds its default. ``marin.execution.hashing.identity`` reads the same metadata
key, so a config's record and its step's identity leave out the same fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any

OMIT_WHEN_DEFAULT = {"omit_when_default": True}


def fields_to_record(config: Any) -> list[dataclasses.Field]:
    """The dataclass fields of ``config`` that its record and identity include (see OMIT_WHEN_DEFAULT)."""
    return [
        f for f in dataclasses.fields(config)
        if not (f.metadata.get("omit_when_default") and getattr(config, f.name) == f.default)
    ]
