"""iris: job orchestration on a cluster.

Owns submitting, watching, retrying (on failure and on preemption) and stopping jobs, and their
logs. It builds on fray and rigging.
"""
