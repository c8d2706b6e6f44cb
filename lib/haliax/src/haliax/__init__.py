"""haliax: named axes for JAX arrays.

Owns named axes, the core operations models need, neural-network layers and partitioning of
arrays and jitted functions over a device mesh. It depends only on rigging.
"""
