import io
import logging

from rigging.log import get_logger, setup_logging


def test_setup_logging_is_idempotent_and_sets_level():
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    try:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        stream = io.StringIO()
        setup_logging("warning", stream=stream)
        setup_logging("INFO", stream=stream)
        assert len(root.handlers) == 1 and root.level == logging.INFO
        get_logger("marin.test").info("hello %s", "there")
        assert "INFO marin.test: hello there" in stream.getvalue()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)
