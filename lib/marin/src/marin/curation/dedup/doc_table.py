"""A shard's considered documents on scratch, by ordinal: position in the file, id and signature.

Spilled entries name a document by ``(shard, ordinal)`` only (8 of an entry's 24 bytes), so a shard's
worker never keeps its documents; whoever needs the id or the signature of a group's members
reads just those rows back. Three files per shard, written as the documents stream past:
``.rows`` (fixed-width: position, end of the id in ``.ids``), ``.ids`` (the ids, UTF-8, back to
back) and, for near duplicates, ``.sigs`` (``num_perm`` uint32 per document).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rigging.filesystem import join, open_url

_ROW = np.dtype([("position", "<u8"), ("id_end", "<u8")])


def _table(folder: str, shard: int) -> str:
    return join(folder, f"shard-{shard:05d}")


class TableWriter:
    """Appends a shard's documents, a batch at a time; ordinals count from 0 in the order written."""

    def __init__(self, folder: str, shard: int, with_signatures: bool):
        base = _table(folder, shard)
        self.rows = open_url(base + ".rows", "wb")
        self.ids = open_url(base + ".ids", "wb")
        self.sigs = open_url(base + ".sigs", "wb") if with_signatures else None
        self.id_end = 0
        self.count = 0

    def add(self, positions: Sequence[int], ids: Sequence[str], sigs: np.ndarray | None = None) -> np.ndarray:
        """Write a batch; returns its ordinals."""
        encoded = [i.encode("utf-8") for i in ids]
        rows = np.empty(len(encoded), dtype=_ROW)
        rows["position"] = positions
        rows["id_end"] = self.id_end + np.cumsum([len(e) for e in encoded], dtype=np.uint64)
        self.id_end = int(rows["id_end"][-1]) if len(rows) else self.id_end
        self.rows.write(rows.tobytes())
        self.ids.write(b"".join(encoded))
        if self.sigs is not None:
            self.sigs.write(np.ascontiguousarray(sigs, dtype=np.uint32).tobytes())
        ordinals = np.arange(self.count, self.count + len(encoded), dtype=np.uint32)
        self.count += len(encoded)
        return ordinals

    def close(self) -> None:
        for handle in (self.rows, self.ids, self.sigs):
            if handle is not None:
                handle.close()


class TableReader:
    """Random reads of documents' rows; one open file per shard and table, opened on first use."""

    def __init__(self, folder: str, num_perm: int = 0):
        self.folder, self.num_perm = folder, num_perm
        self.handles: dict[tuple[int, str], object] = {}

    def _handle(self, shard: int, kind: str):
        handle = self.handles.get((shard, kind))
        if handle is None:
            handle = self.handles[(shard, kind)] = open_url(_table(self.folder, shard) + kind, "rb")
        return handle

    def read(self, shard: int, ordinal: int) -> tuple[int, str]:
        """(position, id) of one document."""
        rows = self._handle(shard, ".rows")
        first = max(ordinal - 1, 0)
        rows.seek(first * _ROW.itemsize)
        found = np.frombuffer(rows.read((ordinal - first + 1) * _ROW.itemsize), dtype=_ROW)
        id_start = int(found["id_end"][0]) if ordinal else 0
        id_end = int(found["id_end"][-1])
        ids = self._handle(shard, ".ids")
        ids.seek(id_start)
        return int(found["position"][-1]), ids.read(id_end - id_start).decode("utf-8")

    def signature(self, shard: int, ordinal: int) -> np.ndarray:
        width = self.num_perm * 4
        sigs = self._handle(shard, ".sigs")
        sigs.seek(ordinal * width)
        return np.frombuffer(sigs.read(width), dtype=np.uint32)

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
        self.handles.clear()
