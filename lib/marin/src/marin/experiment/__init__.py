"""Experiment-level helpers that return lazy handles: ``tokenized`` (data); training and evaluation
helpers live beside it."""
