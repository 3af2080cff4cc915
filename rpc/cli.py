"""``peerwire``: serve a module's handlers, or call, stream and notify a peer from a shell.

    peerwire serve examples/greet.py --listen tcp+gotalk://127.0.0.1:0
    peerwire call tcp+gotalk://127.0.0.1:4000 greet '{"name": "Ada"}'
    peerwire serve examples/greet.py --listen tcp+gotalk://127.0.0.1:4000 --metrics :9100
    peerwire top 127.0.0.1:9100

Payloads and results are JSON, one result per line, so the output pipes into ``jq``.
Exit codes tell failures apart for scripts; see ``EPILOG``. This module is the entry
point (arguments, dispatch, exit codes, ``top`` and the client commands); ``serve`` is in
rpc.cli_serve.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import logging
import ssl
import sys
from typing import Any

import msgspec

import rpc
from rpc import loops
from rpc import top as live_view
from rpc.cli_serve import (
    EXIT_CONNECTION,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REMOTE_ERROR,
    EXIT_RETRY,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    CliError,
    serve,
    std_fds_open,
    stdout_to_devnull,
    url_arg,
)
from rpc.eventer import cli as eventer_cli
from transports.stream import client_ssl_context
from wire.chatter import Dialect

log = logging.getLogger("peerwire.cli")

STREAM_QUEUE = 65_536
"""``max_stream_queue`` of ``peerwire stream``: results that may wait unread before the
connection stops reading (:mod:`rpc.stream_hold`). The default 256 is less than one read of
small results: the connection would pause for each read."""
FLUSH_DELAY = 0.1
"""Seconds a streamed result written to a file or pipe may wait in the output buffer."""

EPILOG = """\
exit codes:
  0  success
  1  any other failure (e.g. a result that is not JSON, a stream whose results
     outran the output, a `top` URL that answers but is not a metrics endpoint)
  2  usage: bad arguments, URL, JSON or module
  3  connection refused, failed or closed (also a failed listen)
  4  no result within --timeout
  5  the peer answered with an error result (its message goes to stderr)
  6  the peer kept answering "retry later" until retries or time ran out
"""


# --- arguments -----------------------------------------------------------------------------


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not JSON ({exc}): {text!r}", EXIT_USAGE) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    # -v is accepted before and after the subcommand; SUPPRESS keeps a subparser from
    # overwriting the top-level value with its own default.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
    )
    parser = argparse.ArgumentParser(
        prog="peerwire",
        description="Serve peerwire handlers or talk to a peer (Chatter or Gotalk).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    eventer_cli.add_parser(sub)  # peerwire eventer serve --config FILE

    serve = sub.add_parser(
        "serve",
        parents=[verbose],
        help="serve a module's registry until SIGINT/SIGTERM",
        description="Import MODULE_OR_PATH and serve its `registry` (or rpc.default_registry) "
        "on every --listen URL; prints `listening on URL` for each bound URL.",
    )
    serve.add_argument("module", metavar="MODULE_OR_PATH", help="examples/greet.py or a.b.c")
    serve.add_argument(
        "--listen",
        metavar="URL",
        action="append",
        required=True,
        help="e.g. tcp+gotalk://127.0.0.1:0 (port 0 picks one); repeatable",
    )
    serve.add_argument("--cert", metavar="F", help="PEM certificate chain (ssl+, wss+ URLs)")
    serve.add_argument("--key", metavar="F", help="PEM private key, if not in --cert")
    serve.add_argument(
        "--client-ca", metavar="F", help="require client certificates signed by these CAs"
    )
    serve.add_argument(
        "--workers",
        metavar="N",
        type=_positive_int,
        default=1,
        help="serve in N processes sharing the listening sockets (default 1: this process)",
    )
    serve.add_argument(
        "--drain-timeout",
        metavar="S",
        type=_seconds,
        default=5.0,
        help="on SIGTERM/SIGINT, seconds requests in flight may take to finish (default: 5)",
    )
    serve.add_argument(
        "--loop",
        choices=loops.CHOICES,
        help="event loop; auto: uvloop when installed (default: $PEERWIRE_LOOP or auto)",
    )
    serve.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (the metrics extra; "
        "with --workers, every worker in one scrape)",
    )

    top = sub.add_parser(
        "top",
        parents=[verbose],
        help="live view of a server's metrics: calls/s, errors, latency, connections",
        description="Scrape URL (a `serve --metrics` endpoint; HOST:PORT will do) every "
        "--interval seconds and show per op calls/s, error rate and latency percentiles.",
    )
    live_view.add_arguments(top)

    client = argparse.ArgumentParser(add_help=False, parents=[verbose])
    client.add_argument("url", metavar="URL", help="e.g. tcp+sbs://127.0.0.1:4000?dialect=Hat")
    client.add_argument(
        "--timeout",
        metavar="S",
        type=live_view.seconds_above_0,
        help="seconds to wait for the (next) result (default: Chatter 5, Gotalk 30)",
    )
    client.add_argument(
        "--connect-timeout",
        metavar="S",
        type=live_view.seconds_above_0,
        default=10.0,
        help="seconds to wait for the connection and its handshakes (default: 10)",
    )
    client.add_argument("--cafile", metavar="F", help="PEM CAs that sign the server (TLS)")
    client.add_argument("--insecure", action="store_true", help="do not verify the server (TLS)")
    client.add_argument("--cert", metavar="F", help="client certificate (mutual TLS)")
    client.add_argument("--key", metavar="F", help="client key, if not in --cert")

    call = sub.add_parser("call", parents=[client], help="send a request, print its result")
    notify = sub.add_parser("notify", parents=[client], help="send a notification")
    stream = sub.add_parser(
        "stream",
        parents=[client],
        help="print every result of a streamed result or a stream request",
        description="Send OP with PAYLOAD, or a stream request of the --part values, and "
        "print each result as one JSON line.",
    )
    for command, op in ((call, "OP"), (notify, "NAME"), (stream, "OP")):
        command.add_argument("op", metavar=op)
        command.add_argument("payload", metavar="PAYLOAD", nargs="?", help="JSON (default null)")
    stream.add_argument(
        "--part",
        metavar="JSON",
        action="append",
        help="a part of a stream request; repeat for each part (instead of PAYLOAD)",
    )
    return parser


# --- top -----------------------------------------------------------------------------------


def top(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("prometheus_client") is None:
        raise CliError("top needs: pip install 'peerwire[top]'", EXIT_USAGE)
    try:
        live_view.run(
            args.url, interval=args.interval, count=args.count, side=args.side, plain=args.plain
        )
    except BrokenPipeError:  # our stdout closed (`| head -1`): _run's to handle, not a scrape's
        raise
    except live_view.OutputFailed as exc:  # a full disk, say: not a scrape's either
        raise _output_failed(exc.error) from None
    except OSError as exc:  # urllib's URLError and an answer that is not HTTP included
        raise CliError(f"cannot read {args.url}: {exc}", EXIT_CONNECTION) from None
    except live_view.NotMetrics as exc:  # HTTP, but not a Prometheus exposition
        raise CliError(f"{args.url} is not a metrics endpoint: {exc}", EXIT_FAILED) from None
    return EXIT_OK


# --- client commands -----------------------------------------------------------------------


def _client_ssl(args: argparse.Namespace, url: rpc.PeerUrl) -> ssl.SSLContext | None:
    if not url.tls:
        if args.cafile or args.insecure or args.cert:
            log.warning("--cafile, --insecure and --cert apply to TLS URLs only: ignored")
        return None
    try:
        return client_ssl_context(
            cafile=args.cafile, certfile=args.cert, keyfile=args.key, verify=not args.insecure
        )
    except (OSError, ssl.SSLError) as exc:
        raise CliError(f"cannot load TLS files: {exc}", EXIT_USAGE) from None


def _json_line(value: Any) -> str:
    # msgspec, not json: SBS results may hold bytes (base64) and tuples (arrays)
    return msgspec.json.encode(value).decode()


def _output_failed(exc: OSError) -> CliError:
    """stdout cannot take our output (a full disk: ENOSPC): exit 1 saying so, not as a
    failed connection (exit 3). stdout becomes /dev/null, so that the interpreter's exit
    does not fail on what is left in its buffer (exit 120). A BrokenPipeError (`| head -1`)
    is not one: :func:`_run` ends it quietly."""
    stdout_to_devnull()
    return CliError(f"cannot write the output: {exc}", EXIT_FAILED)


def _print(line: str, *, flush: bool = False) -> None:
    """``line`` on stdout; an OSError of stdout other than a broken pipe: CliError.
    ``flush``: now (the last line: into a file stdout is buffered, and a write failing in
    the interpreter's exit flush is an ignored exception, exit 120)."""
    try:
        print(line, flush=flush)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _output_failed(exc) from None


class _Lines:
    """Streamed results on stdout, one JSON line each. On a terminal stdout is line
    buffered; into a file or pipe a write per line kept a fast stream from keeping up
    (StreamOverflow), so lines are buffered and flushed ``FLUSH_DELAY`` s after the first
    unflushed one, and at the end."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None
        self._failed: OSError | None = None  # of a timed flush: stdout closed (`| head -1`)
        self.written = False  # a result came

    def write(self, value: Any) -> None:
        if isinstance(self._failed, BrokenPipeError):
            raise self._failed
        if self._failed is not None:
            raise _output_failed(self._failed)
        _print(_json_line(value))
        self.written = True
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_DELAY, self._flush)

    def _flush(self) -> None:
        self._timer = None
        if sys.stdout is None:  # closed at the start (``>&-``): print wrote nothing
            return
        try:
            sys.stdout.flush()
        except OSError as exc:
            self._failed = exc

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if sys.stdout is None:
            return
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _output_failed(exc) from None


async def client(args: argparse.Namespace) -> int:
    url = url_arg(args.url)
    if args.command == "stream" and args.part is not None:
        if args.payload is not None:
            raise CliError("give PAYLOAD or --part values, not both", EXIT_USAGE)
        parts: list[Any] | None = [_json_arg(p, "--part") for p in args.part]
        value = None
    else:
        parts = None
        value = _json_arg("null" if args.payload is None else args.payload, "PAYLOAD")
    ctx = _client_ssl(args, url)
    streaming = args.command == "stream"
    log.debug("connecting to %s", url)
    try:
        peer = await rpc.connect(
            args.url,
            ssl=ctx,
            connect_timeout=args.connect_timeout,
            reconnect=False,
            options=rpc.Options(max_stream_queue=STREAM_QUEUE) if streaming else None,
        )
    except rpc.ConnectionClosed as exc:  # its text already names the URL and the cause
        raise CliError(str(exc), EXIT_CONNECTION) from None
    except OSError as exc:
        raise CliError(f"cannot connect to {args.url}: {exc}", EXIT_CONNECTION) from None
    try:
        if args.command == "call":
            result = await peer.request(args.op, value, timeout=args.timeout)
            _print(_json_line(result), flush=True)
        elif args.command == "notify":
            peer.notify(args.op, value)
        else:
            lines = _Lines()
            try:
                results = peer.stream(args.op, parts=parts, value=value, item_timeout=args.timeout)
                async for item in results:
                    lines.write(item)
            except rpc.ConnectionClosed as exc:
                if lines.written:  # the peer spoke our dialect: no hint of the other one
                    raise CliError(f"connection failed: {exc}", EXIT_CONNECTION) from None
                raise
            finally:
                lines.close()
    finally:
        await peer.close()
    return EXIT_OK


# --- entry point ---------------------------------------------------------------------------


def _say(line: str) -> None:
    """A failure's one line on stderr. Characters that are not printable (a newline, a
    carriage return, an ESC starting a terminal escape) are written as escapes (``\\n``,
    ``\\x1b``): a peer's error text, a URL or an exception's message must neither break the
    line in two nor drive the operator's terminal."""
    escaped = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in line
    )
    print(escaped, file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    if args.command == "eventer":  # runs its own loop, signals and exit codes
        status: int = args.func(args)
        return status
    try:
        if args.command == "top":
            return top(args)
        return serve(args) if args.command == "serve" else loops.run(client(args))
    except CliError as exc:
        _say(f"peerwire: {exc}")
        return exc.code
    except loops.LoopUnavailable as exc:  # a bad $PEERWIRE_LOOP
        _say(f"peerwire: {exc}")
        return EXIT_USAGE
    except rpc.RemoteError as exc:
        _say(f"peerwire: error result from peer: {exc}")
        return EXIT_REMOTE_ERROR
    except rpc.RetryLater as exc:
        _say(f"peerwire: peer asked to retry, gave up: {exc}")
        return EXIT_RETRY
    except rpc.RequestTimeout as exc:
        _say(f"peerwire: timeout: {exc}")
        return EXIT_TIMEOUT
    except BrokenPipeError:  # stdout closed early (`| head -1`): not the connection's fault
        stdout_to_devnull()  # no error at exit
        return EXIT_FAILED
    except (rpc.ConnectionClosed, OSError) as exc:
        _say(f"peerwire: connection failed: {exc}{_dialect_hint(args)}")
        return EXIT_CONNECTION
    except rpc.RpcError as exc:  # PayloadError, StreamOverflow and any the core may add
        _say(f"peerwire: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line for scripts, as for every other failure; -v: where
        log.debug("unexpected failure", exc_info=True)
        _say(f"peerwire: {type(exc).__name__}: {exc} (-v shows where)")
        return EXIT_FAILED


def _dialect_hint(args: argparse.Namespace) -> str:
    """A Chatter connection in the legacy dialect that fails after connecting most likely
    reached a peer of the current dialect (hat-drivers, hat-event): say how to ask for it.
    Not for a stream cut after a result came (:func:`client` says so without this)."""
    try:
        url = rpc.parse_url(getattr(args, "url", ""))
    except rpc.UrlError:
        return ""
    if url.codec != "sbs" or url.dialect not in (None, Dialect.LEGACY):
        return ""
    current = dataclasses.replace(url, dialect=Dialect.CURRENT)
    return (
        f" (the peer probably speaks the current Chatter dialect, as hat-drivers and "
        f"hat-event do: try {current})"
    )


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code (console scripts pass it to sys.exit)."""
    args = build_parser().parse_args(argv)
    std_fds_open()  # else a socket may take fd 1 (``>&-``), and uvloop aborts closing it
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
