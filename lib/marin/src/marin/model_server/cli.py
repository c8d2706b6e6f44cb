"""``marin serve-model CHECKPOINT-OR-STEP``: the model behind an OpenAI-compatible HTTP API.

CHECKPOINT-OR-STEP is what ``marin generate`` takes: a training step's output folder, its ``hf/``
folder, or a step name looked up under the prefix. The server listens on 127.0.0.1:8000 unless
told otherwise and answers ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (so the
``openai`` client and lm-eval's ``local-completions`` work against it), ``/metrics`` for Prometheus,
and a chat page at ``/``.
"""

from __future__ import annotations

import argparse
import sys

from rigging import filesystem as fsx

EXIT_USAGE = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve-model",
        help="serve a trained model over the OpenAI API (completions, chat, streaming) with a chat page at /",
        description=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("model", metavar="CHECKPOINT-OR-STEP", help="a train step's output folder, its hf/ folder, or a step name")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 serves the network)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--name", help="the model's id in the API (default: CHECKPOINT-OR-STEP as given)")
    parser.add_argument("--tokenizer", help="a tokenizer.json, folder or hub id (default: the one saved beside the model)")
    parser.add_argument("--chat-template", metavar="NAME",
                        help="the chat template the model was fine-tuned with when its tokenizer has none (chatml, ...); "
                             "without either, /v1/chat/completions answers 400")
    parser.add_argument("--max-batch", type=int, default=32, metavar="N", help="requests decoded together (default 32)")
    parser.add_argument("--block-size", type=int, default=16, metavar="N", help="positions per cache block (default 16)")
    parser.add_argument("--kv-blocks", type=int, metavar="N",
                        help="cache blocks in all, the memory bound (default: room for --max-batch full-length requests)")
    parser.add_argument("--prefix", help="where to look up step names (default: the discovered prefix)")
    parser.set_defaults(handler=serve_model_command)


def build_server(model: object, tokenizer: object, name: str, *, chat_template: str | None = None, max_batch: int = 32,
                 block_size: int = 16, kv_blocks: int | None = None):
    """A started engine and the :class:`~marin.model_server.app.ModelServer` over it."""
    from levanter.inference.engine import EngineConfig, GenerationEngine
    from levanter.tokenization.chat import resolve_chat_template

    from marin.model_server.app import ModelServer

    template = None
    if chat_template is not None or tokenizer.chat_template is not None:
        template = resolve_chat_template(tokenizer, chat_template)
    engine = GenerationEngine(model, EngineConfig(max_batch=max_batch, block_size=block_size, num_blocks=kv_blocks)).start()
    return ModelServer(engine, tokenizer, name, template)


def serve_model_command(args: argparse.Namespace) -> int:
    import uvicorn

    from levanter.compat.hf_checkpoints import HfFormatError
    from levanter.tokenization.chat import ChatTemplateError
    from levanter.tokenization.loading import TokenizerFormatError, TokenizerNotFoundError

    from marin.generate import ModelNotFoundError, TokenizerMismatchError, load_model_and_tokenizer
    from marin.model_server.app import create_app
    from marin.serve.cli import _why, listen

    def usage(message: str) -> int:
        print(f"marin serve-model: {message}", file=sys.stderr)
        return EXIT_USAGE

    for option, value in (("--max-batch", args.max_batch), ("--block-size", args.block_size), ("--kv-blocks", args.kv_blocks)):
        if value is not None and value < (2 if option == "--kv-blocks" else 1):
            return usage(f"{option} must be a positive number, got {value}")
    try:
        listening = listen(args.host, args.port)
    except OSError as exc:
        return usage(f"cannot listen on {args.host}:{args.port}: {_why(exc)}")
    try:
        model, tokenizer, _ = load_model_and_tokenizer(args.model, prefix=args.prefix, tokenizer=args.tokenizer)
        server = build_server(model, tokenizer, args.name or args.model.rstrip("/"), chat_template=args.chat_template,
                              max_batch=args.max_batch, block_size=args.block_size, kv_blocks=args.kv_blocks)
    except (ModelNotFoundError, TokenizerMismatchError, HfFormatError, TokenizerNotFoundError, TokenizerFormatError,
            ChatTemplateError, ValueError, fsx.FilesystemUnavailableError) as exc:
        listening.close()
        return usage(str(exc))
    print(f"marin serve-model: {server.model_name} on http://{args.host}:{args.port}/v1 "
          f"(chat page at http://{args.host}:{args.port}/; Ctrl-C stops it)", flush=True)
    try:
        config = uvicorn.Config(create_app(server), host=args.host, port=args.port, log_level="warning")
        uvicorn.Server(config).run(sockets=[listening])
    finally:
        server.engine.close()
    return 0


__all__ = ["build_server", "register", "serve_model_command"]
