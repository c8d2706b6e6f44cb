"""marin: reproducible experiments as graphs of cached, versioned steps.

Owns the execution engine (steps, identity, caching, the runner, lazy handles, artifacts), the
experiment helpers (``tokenized``, ``train_lm``, evaluation), the tokenize step and the ``marin``
command line. It is the top library layer and may import every other package.
"""

from marin.errors import install_explained_excepthook

# An uncaught error raised on purpose prints as one line under plain `python` too (see marin.errors).
install_explained_excepthook()
