"""Data curation: extraction, language identification, quality filtering, deduplication and
decontamination, each a cached step on zephyr."""
