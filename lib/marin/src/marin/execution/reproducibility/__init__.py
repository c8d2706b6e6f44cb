"""Is it the same again: why a step has its hash, and whether a rerun of it gives the same output.

Promise: ``marin explain`` reads exactly what was hashed, and ``marin reproduce`` reruns a finished
step in a scratch prefix, leaving the original untouched, and names the first difference (file,
record, tensor) between the two outputs.
"""
