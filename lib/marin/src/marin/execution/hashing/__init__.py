"""What makes a step the same step: the hash of what it computes, and the fingerprint of its code.

Promise: the same declaration hashes the same on any machine, under any prefix, whatever its
resources; two different declarations never share a hash silently. Depends on nothing else in the
engine, so every other part can trust it.
"""
