"""Tutorial programs; each runs unmodified from the repository root."""
