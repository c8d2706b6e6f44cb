"""The cluster types iris users need; ``ResourceConfig`` is fray's own class, re-exported."""

from fray.cluster import ResourceConfig

__all__ = ["ResourceConfig"]
