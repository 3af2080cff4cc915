"""``peerwire eventer serve --config FILE`` (also ``python -m rpc.eventer serve ...``).

The config file is JSON or TOML (``.toml``); see :mod:`rpc.eventer.config` for the keys.
Prints ``listening on URL`` per bound URL, runs until SIGINT/SIGTERM, then stops cleanly
(clients get STOPPING, queued registrations are committed). Exit codes: 0 stopped,
2 bad config (TLS files that cannot be loaded included), 3 cannot listen or open the
database (or it is in use by another process).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any, Protocol

from rpc import loops
from rpc.eventer.config import ConfigError, ServerConfig, load_config
from rpc.eventer.server import serve_forever
from rpc.eventer.store import StoreError

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FAILED = 3


class Subcommands(Protocol):
    """What :func:`add_parser` needs of a parent parser's subcommands (what
    ``ArgumentParser.add_subparsers()`` returns)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_parser(subparsers: Subcommands) -> argparse.ArgumentParser:
    """Add ``eventer`` (with ``serve``) to a parent CLI; ``args.func(args)`` runs it."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "eventer",
        help="Hat Eventer server",
        description="Hat Eventer server with SQLite persistence.",
    )
    _add_commands(parser)
    return parser


def _add_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eventer_command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run an event server until SIGINT/SIGTERM",
        description="Run an Eventer server configured by FILE (JSON, or TOML if it ends "
        f"in .toml): keys {', '.join(ServerConfig.__struct_fields__)}.",
    )
    serve.add_argument("--config", metavar="FILE", required=True, help="JSON or TOML file")
    serve.add_argument(
        "--loop",
        choices=loops.CHOICES,
        help="event loop; auto: uvloop when installed (default: $PEERWIRE_LOOP or auto)",
    )
    serve.add_argument(
        "--workers",
        metavar="N",
        type=int,
        default=1,
        help="always 1: the server owns its SQLite database and runs in one process",
    )
    # SUPPRESS: a parent CLI's own -v (given before "eventer") is not overwritten
    serve.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
    )
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.workers != 1:
        print(
            "peerwire eventer: the Eventer server runs in one process (it owns its SQLite "
            "database and the event order): --workers must be 1",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"peerwire eventer: bad config: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_forever(config, stop)

    try:
        loops.run(run(), args.loop)
    except loops.LoopUnavailable as exc:
        print(f"peerwire eventer: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:  # TLS files that cannot be loaded
        print(f"peerwire eventer: bad config: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, StoreError) as exc:
        print(f"peerwire eventer: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rpc.eventer", description="Hat Eventer server with SQLite persistence."
    )
    _add_commands(parser)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
