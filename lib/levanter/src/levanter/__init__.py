"""levanter: training foundation models in JAX.

Owns models (Llama, MoE), optimizers, the trainer, checkpoints, the training data loader,
metric trackers, evaluation and Hugging Face import/export. It builds on haliax, zephyr, fray and
rigging.
"""
