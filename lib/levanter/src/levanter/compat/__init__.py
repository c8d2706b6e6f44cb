"""Interoperability with other ecosystems (Hugging Face checkpoints)."""
