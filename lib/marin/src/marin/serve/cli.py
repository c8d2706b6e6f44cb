"""``marin serve``: start the read-only web view of a prefix (on 127.0.0.1 unless told otherwise)."""

from __future__ import annotations

import argparse
import errno
import importlib
import socket
import sys
import threading

from rigging import filesystem as fsx
from rigging.config.discovery import discover_config

EXIT_USAGE = 2


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
    if fsx.is_local(prefix) and not fsx.exists(prefix):
        # A mistyped --prefix would otherwise show an empty project, as if nothing had run.
        print(f"marin serve: there is no folder {prefix}; check --prefix (or MARIN_PREFIX), "
              "or run a script first to create it.", file=sys.stderr)
        return EXIT_USAGE
    try:
        listening = listen(args.host, args.port)
    except OSError as exc:
        print(f"marin serve: cannot listen on {args.host}:{args.port}: {_why(exc)}", file=sys.stderr)
        return EXIT_USAGE
    threading.Thread(target=_warm_imports, name="serve-warm-imports", daemon=True).start()
    print(f"marin serve: {prefix} on http://{args.host}:{args.port}/ (read-only; Ctrl-C stops it)")
    config = uvicorn.Config(create_app(prefix), host=args.host, port=args.port, log_level="warning")
    uvicorn.Server(config).run(sockets=[listening])
    return 0


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for the server, so a port in use is found before saying
    "serving", and the port the server answers on is the one checked (no window between)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As uvicorn binds: lets a restarted server reuse a port left in TIME_WAIT, while a port
        # another program listens on is still refused.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _why(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (another marin serve?); choose another with --port N."
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges); choose another with --port N."
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return "this machine has no such address; --host takes an address of this machine (127.0.0.1, 0.0.0.0)."
    return exc.strerror or str(exc)
