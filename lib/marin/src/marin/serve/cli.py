"""``marin serve``: start the read-only web view of a prefix (on 127.0.0.1 unless told otherwise)."""

from __future__ import annotations

import argparse
import importlib
import threading

from rigging.config.discovery import discover_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="a read-only web view of a prefix: steps, lineage, curves, data, evals")
    parser.add_argument("--prefix", help="folder or fsspec URL (default: the discovered prefix)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 shows the prefix to the network)")
    parser.add_argument("--port", type=int, default=8265, help="port (default 8265)")
    parser.set_defaults(handler=serve_command)


# What a token cache's page needs (about 1 s to import), loaded while the server starts rather
# than by the first person who opens one.
_WARM_MODULES = ("zephyr.token_cache", "levanter.tokenization")


def _warm_imports() -> None:
    for name in _WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the page that needs it says why


def serve_command(args: argparse.Namespace) -> int:
    import uvicorn

    from marin.serve.app import create_app

    prefix = discover_config(prefix=args.prefix).prefix
    threading.Thread(target=_warm_imports, name="serve-warm-imports", daemon=True).start()
    print(f"marin serve: {prefix} on http://{args.host}:{args.port}/ (read-only; Ctrl-C stops it)")
    uvicorn.run(create_app(prefix), host=args.host, port=args.port, log_level="warning")
    return 0
