"""rigging: the ground floor of Marin.

Owns configuration discovery, fsspec filesystems and atomic writes, leases (locks with a
heartbeat) and logging set-up. It imports no other Marin package.
"""
