"""rigging: the ground floor of Marin.

Owns configuration discovery, fsspec filesystems and atomic writes, leases (locks with a
heartbeat), logging set-up, and secrets (which variables hold credentials, and redacting their
values from what is kept). It imports no other Marin package.
"""
