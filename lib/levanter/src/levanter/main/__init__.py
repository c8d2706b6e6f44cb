"""Entry points that wire models, data, optimizer and trainer into one call."""
