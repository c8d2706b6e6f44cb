"""User-level experiment scripts: model sizes, tokenizers, tutorials."""
