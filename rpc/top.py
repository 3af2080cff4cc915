"""``peerwire top URL``: a live view of a server's metrics endpoint (the ``top`` extra).

Every ``interval`` seconds (default 1) it scrapes ``URL`` (``HOST:PORT`` means
``http://HOST:PORT/metrics``), and shows per op the calls/s, the error rate and the latency
percentiles over the last interval, computed from the differences of two scrapes (the
percentiles interpolate inside histogram buckets, as Prometheus' ``histogram_quantile``
does), and the server's open connections, refusals and bytes/s. A counter lower than at
the last scrape was reset (the server restarted): as Prometheus' ``rate()`` does, its value
is then the increase since the reset, never a negative rate. With ``rich`` and a
terminal it redraws a table; otherwise (or with ``--plain``) it prints one text block per
refresh, so it can be piped or logged.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import io
import math
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, TextIO

QUANTILES = (0.5, 0.9, 0.99)


class NotMetrics(ValueError):
    """The endpoint answered, but not with Prometheus text (or not with sane histograms)."""


class OutputFailed(Exception):
    """Our output cannot take a frame (stdout on a full disk): not a failed scrape, which an
    OSError is; ``error``: the output's OSError. A BrokenPipeError (``| head -1``) is raised
    as it is."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class OpCounts:
    requests: float = 0.0
    errors: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)
    """Cumulative count per upper bound (``le``), summed over protocols."""


@dataclass
class Snapshot:
    """One scrape, reduced to what the view shows (for one ``side``)."""

    at: float
    ops: dict[str, OpCounts]
    connections_open: float
    refused: float
    received: float
    sent: float


def seconds_above_0(text: str) -> float:
    """An argparse type: a number of seconds above 0 and finite (top's ``--interval``: 0
    would scrape in a tight loop; the client commands' timeouts: nan waited for good, 0 or
    less failed at once)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0: {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``peerwire top`` (rpc.cli runs it), checked as they are parsed."""
    parser.add_argument("url", metavar="URL", help="e.g. 127.0.0.1:9100 or http://h:9100/metrics")
    parser.add_argument(
        "--interval", metavar="S", type=seconds_above_0, default=1.0, help="default 1"
    )
    parser.add_argument("--count", metavar="N", type=_count, help="stop after N refreshes")
    parser.add_argument(
        "--side", choices=("server", "client"), default="server", help="whose calls to show"
    )
    parser.add_argument("--plain", action="store_true", help="plain text even on a terminal")


def metrics_url(target: str) -> str:
    if "://" not in target:
        target = f"http://{target}"
    scheme, _, rest = target.partition("://")
    if "/" not in rest:
        rest += "/metrics"
    return f"{scheme}://{rest}"


def parse(text: str, side: str = "server", at: float = 0.0) -> Snapshot:
    """Raises NotMetrics when ``text`` is not Prometheus text (any server may answer)."""
    try:
        return _parse(text, side, at)
    except ValueError as exc:  # the parser's one error type, for any malformed line
        raise NotMetrics(str(exc) or f"malformed line in {text[:60]!r}") from None


def _parse(text: str, side: str, at: float) -> Snapshot:
    # imported here, so that the CLI can say which extra is missing
    from prometheus_client.parser import text_string_to_metric_families

    ops: dict[str, OpCounts] = defaultdict(OpCounts)
    totals: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            name = sample.name
            if name in (
                "peerwire_connections_open",
                "peerwire_connections_refused_total",
                "peerwire_received_bytes_total",
                "peerwire_sent_bytes_total",
            ):
                totals[name] += sample.value
                continue
            if labels.get("side") != side or "op" not in labels:
                continue
            counts = ops[labels["op"]]
            if name == "peerwire_requests_total":
                counts.requests += sample.value
            elif name == "peerwire_errors_total":
                counts.errors += sample.value
            elif name == "peerwire_request_duration_seconds_bucket":
                if "le" not in labels:
                    raise NotMetrics(f"a histogram bucket without `le`: {labels}")
                le = float(labels["le"])
                counts.buckets[le] = counts.buckets.get(le, 0.0) + sample.value
    return Snapshot(
        at,
        dict(ops),
        totals["peerwire_connections_open"],
        totals["peerwire_connections_refused_total"],
        totals["peerwire_received_bytes_total"],
        totals["peerwire_sent_bytes_total"],
    )


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The ``q`` quantile of a cumulative histogram (``le`` -> count), interpolated linearly
    inside its bucket; None without observations. Past the last finite bound: that bound."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _increase(before: float, now: float) -> float:
    """A counter's increase between two scrapes: ``now`` itself when it dropped (a reset)."""
    return now - before if now >= before else now


def _was_reset(old: OpCounts, new: OpCounts) -> bool:
    """Any of an op's counters dropped: the server restarted, and all of them started anew
    (so the calls, errors and buckets of one interval stay consistent with each other)."""
    return (
        new.requests < old.requests
        or new.errors < old.errors
        or any(n < old.buckets.get(le, 0.0) for le, n in new.buckets.items())
    )


@dataclass
class Row:
    op: str
    rate: float
    error_rate: float | None
    latencies: tuple[float | None, ...]
    total: float


def rows(before: Snapshot | None, now: Snapshot) -> list[Row]:
    """Per op: rates over the interval since ``before`` (or totals since start without it)."""
    elapsed = now.at - before.at if before is not None else 0.0
    result = []
    for op, counts in sorted(now.ops.items()):
        old = before.ops.get(op, OpCounts()) if before is not None else OpCounts()
        if _was_reset(old, counts):
            old = OpCounts()
        calls = counts.requests - old.requests
        errors = counts.errors - old.errors
        window = {le: n - old.buckets.get(le, 0.0) for le, n in counts.buckets.items()}
        rate = calls / elapsed if elapsed > 0 else 0.0
        result.append(
            Row(
                op,
                rate,
                errors / calls if calls > 0 else None,
                tuple(quantile(q, window) for q in QUANTILES),
                counts.requests,
            )
        )
    return result


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def summary(before: Snapshot | None, now: Snapshot) -> str:
    elapsed = now.at - before.at if before is not None else 0.0
    if before is not None and elapsed > 0:
        rx = _increase(before.received, now.received) / elapsed
        tx = _increase(before.sent, now.sent) / elapsed
        rates = f"  in {rx:,.0f} B/s  out {tx:,.0f} B/s"
    else:
        rates = ""
    return (
        f"connections open {now.connections_open:.0f}  refused {now.refused:.0f}"
        f"  (received {now.received:,.0f} B, sent {now.sent:,.0f} B){rates}"
    )


HEADERS = ("op", "calls/s", "errors", *(f"p{round(q * 100)}" for q in QUANTILES), "total")


def cells(row: Row) -> tuple[str, ...]:
    return (
        row.op,
        f"{row.rate:,.1f}",
        _pct(row.error_rate),
        *(_ms(v) for v in row.latencies),
        f"{row.total:,.0f}",
    )


def plain_frame(url: str, before: Snapshot | None, now: Snapshot) -> str:
    table = [HEADERS, *(cells(row) for row in rows(before, now))]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    lines = [f"peerwire top {url}  {time.strftime('%H:%M:%S')}", summary(before, now)]
    for line in table:
        lines.append(
            "  ".join(
                cell.ljust(width) if i == 0 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(line, widths, strict=True))
            )
        )
    return "\n".join(lines)


def _rich_frame(url: str, before: Snapshot | None, now: Snapshot) -> Any:
    """Every string as a ``Text``: rich reads a plain str as markup, and op names (any
    server's, any peer's) and URLs may hold brackets (``items[/x]`` raised MarkupError)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = Text(f"peerwire top {url}  {time.strftime('%H:%M:%S')}")
    table = Table(title=title, caption=None)
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows(before, now):
        table.add_row(*(Text(cell) for cell in cells(row)))
    return Group(table, Text(summary(before, now)))


MAX_BODY = 32 * 1024 * 1024
"""Bytes of a scrape's body read at most (32 MiB); a longer one is no metrics endpoint."""
_CHUNK = 64 * 1024


def fetch(url: str, timeout: float) -> str:
    """The body at ``url``, all of it (the redirects, headers and body) within ``timeout``
    seconds: an endpoint that trickles its answer is cut at that deadline, not a timeout
    after its latest byte. Raises OSError when nothing answers in time (TimeoutError),
    NotMetrics for a body that is not text or is longer than :data:`MAX_BODY`, and
    ConnectionError for an answer that is not HTTP (an RPC port, say), is cut short, or is
    an HTTP error (urllib's follows redirects, and says a loop of them in three lines):
    http.client's errors are no OSError, and are as much a failed scrape."""
    deadline = time.monotonic() + timeout
    opener = urllib.request.build_opener(
        _HTTPHandler(deadline, timeout), _HTTPSHandler(deadline, timeout)
    )
    chunks: list[bytes] = []
    size = 0
    try:
        with opener.open(url, timeout=timeout) as response:
            while size <= MAX_BODY and (chunk := response.read(_CHUNK)):
                chunks.append(chunk)
                size += len(chunk)
            length = response.headers.get("Content-Length", "")
            if size <= MAX_BODY and length.isdigit() and size < int(length):
                raise http.client.IncompleteRead(b"", int(length) - size)  # read(n) says not
    except urllib.error.HTTPError as exc:
        exc.close()
        reason = str(exc.reason).partition("\n")[0]
        raise ConnectionError(f"HTTP error {exc.code}: {reason}") from None
    except http.client.HTTPException as exc:
        raise ConnectionError(f"not a whole HTTP answer: {exc!r}") from None
    if size > MAX_BODY:
        raise NotMetrics(f"the body is more than {MAX_BODY:,} bytes")
    try:
        return b"".join(chunks).decode()
    except UnicodeDecodeError as exc:
        raise NotMetrics(f"the body is not UTF-8 text ({exc})") from None


class _Deadline(io.RawIOBase):
    """A response's reads from ``sock``, each waiting only for what is left until
    ``deadline`` (monotonic). Reads through the socket's own raw file, which keeps the
    socket open after urllib closes its connection (as the response's file does)."""

    def __init__(self, sock: socket.socket, deadline: float, timeout: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline
        self._timeout = timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole answer within {self._timeout} s")
        self._sock.settimeout(left)
        try:
            return int(self._raw.readinto(buffer) or 0)
        except TimeoutError:
            raise TimeoutError(f"no whole answer within {self._timeout} s") from None

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Sock:
    """What an ``HTTPResponse`` is given for the socket: its reads keep the deadline."""

    def __init__(self, sock: socket.socket, deadline: float, timeout: float) -> None:
        self._reader = _Deadline(sock, deadline, timeout)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self._reader)


class _Timed:
    """Mixed into an ``http.client`` connection: connects within what is left until the
    deadline, and its response reads to the deadline."""

    def __init__(self, host: str, *, deadline: float, scrape: float, **kw: Any) -> None:
        kw["timeout"] = max(deadline - time.monotonic(), 0.001)
        super().__init__(host, **kw)  # type: ignore[call-arg]
        self._deadline = deadline
        self._scrape = scrape

    def response_class(self, sock: Any, *args: Any, **kw: Any) -> http.client.HTTPResponse:
        timed = _Sock(sock, self._deadline, self._scrape)
        return http.client.HTTPResponse(timed, *args, **kw)  # type: ignore[arg-type]


# response_class: a method, called as the class is (``self.response_class(sock, ...)``)
class _HTTP(_Timed, http.client.HTTPConnection):  # type: ignore[misc]
    pass


class _HTTPS(_Timed, http.client.HTTPSConnection):  # type: ignore[misc]
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: float, scrape: float) -> None:
        super().__init__()
        self._timed = functools.partial(_HTTP, deadline=deadline, scrape=scrape)

    def do_open(self, http_class: Any, req: Any, **kw: Any) -> Any:
        return super().do_open(self._timed, req, **kw)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: float, scrape: float) -> None:
        super().__init__()
        self._timed = functools.partial(_HTTPS, deadline=deadline, scrape=scrape)

    def do_open(self, http_class: Any, req: Any, **kw: Any) -> Any:
        return super().do_open(self._timed, req, **kw)


def run(
    target: str,
    *,
    interval: float = 1.0,
    count: int | None = None,
    side: str = "server",
    plain: bool = False,
    out: TextIO | None = None,
) -> None:
    """Refresh every ``interval`` s (> 0), ``count`` times (forever when None). Raises
    OSError (urllib's URLError is one) when the endpoint cannot be scraped, NotMetrics when
    what it answers is not Prometheus text, :class:`OutputFailed` when ``out`` (default: the
    ``sys.stdout`` of the call; None with fd 1 closed at the start: frames go nowhere) cannot
    take a frame. The live table (on the main thread) turns SIGTERM into SystemExit(143)
    while it runs, so the terminal gets its cursor back."""
    if out is None:
        out = sys.stdout
    if not interval > 0:
        raise ValueError(f"interval must be above 0 s, not {interval}")
    url = metrics_url(target)
    use_rich = not plain and out is not None and out.isatty() and _have_rich()
    before: Snapshot | None = None
    live: Any = None
    sigterm: Any = None
    if use_rich:
        from rich.live import Live

        if threading.current_thread() is threading.main_thread():
            sigterm = signal.signal(signal.SIGTERM, _terminated)
        live = Live(auto_refresh=False)
        live.start()
    try:
        shown = 0
        next_at = time.monotonic()
        while count is None or shown < count:
            now = parse(fetch(url, timeout=max(interval, 1.0)), side, time.monotonic())
            try:
                if live is not None:
                    live.update(_rich_frame(url, before, now), refresh=True)
                else:
                    print(plain_frame(url, before, now), end="\n\n", file=out, flush=True)
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise OutputFailed(exc) from exc
            before = now
            shown += 1
            if count is not None and shown >= count:
                break
            next_at += interval
            if next_at < (now_at := time.monotonic()):  # a slow scrape: no burst to catch up
                next_at = now_at + interval
            time.sleep(next_at - now_at)
    finally:
        if live is not None:
            live.stop()
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (``kill``) while the live table hides the cursor: exit (128 + 15, as the
    signal would) through its clean-up, which shows the cursor again."""
    raise SystemExit(128 + signum)


def _have_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True
