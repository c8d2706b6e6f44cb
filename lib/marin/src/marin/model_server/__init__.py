"""``marin serve-model``: a trained model behind the OpenAI HTTP API.

:mod:`~marin.model_server.protocol` reads and checks requests, :mod:`~marin.model_server.text`
turns generated tokens into text with stop strings, :mod:`~marin.model_server.app` holds the routes
and :mod:`~marin.model_server.cli` the command. Generation itself is levanter's continuous-batching
engine (:mod:`levanter.inference.engine`).
"""
