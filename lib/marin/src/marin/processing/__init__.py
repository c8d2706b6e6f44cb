"""Data processing steps (tokenization) built on zephyr and levanter."""
