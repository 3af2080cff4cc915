"""``peerwire serve --metrics`` and ``peerwire top``: a real server process exposing metrics,
a client calling it, and the live view (plain text) reading them back."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from rpc import top
from rpc.cli import build_parser
from tests.test_cli import PEERWIRE, ROOT, Serving, run_cli
from tests.test_metrics import scrape


def test_quantiles_interpolate_inside_buckets() -> None:
    buckets = {0.001: 0.0, 0.01: 10.0, 0.1: 20.0, float("inf"): 20.0}
    assert abs(top.quantile(0.5, buckets) - 0.01) < 1e-12  # type: ignore[operator]
    assert abs(top.quantile(0.25, buckets) - 0.0055) < 1e-12  # type: ignore[operator]
    assert abs(top.quantile(0.75, buckets) - 0.055) < 1e-12  # type: ignore[operator]
    assert top.quantile(0.99, {0.1: 0.0, float("inf"): 4.0}) == 0.1  # past the last bound
    assert top.quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert top.metrics_url("127.0.0.1:9100") == "http://127.0.0.1:9100/metrics"
    assert top.metrics_url("http://h:1/x") == "http://h:1/x"


async def test_serve_metrics_and_top() -> None:
    with Serving("examples/greet.py", "--listen", "tcp+gotalk://127.0.0.1:0", "--metrics",
                 "127.0.0.1:0") as server:  # fmt: skip
        metrics_url = server.next_line("metrics on ").split()[-1]
        (url,) = server.urls(1)
        port = int(re.search(r":(\d+)/metrics$", metrics_url).group(1))  # type: ignore[union-attr]
        async with rpc.connect(url) as peer:
            calls = 0
            stop = asyncio.Event()

            async def keep_calling() -> None:
                nonlocal calls
                while not stop.is_set():
                    await peer.request("greet", {"name": "Ada"})
                    calls += 1
                    await asyncio.sleep(0.01)  # a steady load, not synchronisation

            caller = asyncio.create_task(keep_calling())
            try:
                code, out, err = await run_cli(
                    "top", metrics_url, "--count", "3", "--interval", "0.3", "--plain"
                )
            finally:
                stop.set()
                await caller
            assert code == 0, err
            assert scrape(port).value("peerwire_requests_total", op="greet") == calls
        frames = [f for f in out.split("\n\n") if f.strip()]
        assert len(frames) == 3
        for frame in frames:
            assert frame.startswith(f"peerwire top {metrics_url}")
            assert "connections open 1" in frame
            assert re.search(r"^op\s+calls/s\s+errors\s+p50\s+p90\s+p99\s+total$", frame, re.M)
        later = re.search(r"^greet\s+([\d,.]+)\s+(\S+)\s+([\d.]+ ms)", frames[-1], re.M)
        assert later is not None, frames[-1]
        assert float(later.group(1).replace(",", "")) > 0  # calls/s over the last interval
        assert later.group(2) == "0.0%"
        assert server.stop() == 0


async def test_top_of_nothing_exits_3() -> None:
    code, _, err = await run_cli("top", "127.0.0.1:1", "--count", "1", "--plain")
    assert code == 3
    assert "cannot read 127.0.0.1:1" in err


async def answering(replies: dict[bytes, bytes]) -> asyncio.Server:
    """A server on port 0 that reads one request and writes the reply for its path."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        path = request.split(b" ")[1]
        writer.write(replies[path])
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def http_ok(body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (size, body)


async def test_top_of_what_is_not_a_metrics_endpoint_says_so_in_one_line() -> None:
    """An RPC port (it answers `01f00000001`), a body cut short, and bodies that are not
    Prometheus text: before, BadStatusLine, IncompleteRead and KeyError tracebacks."""
    bucket = b'peerwire_request_duration_seconds_bucket{side="server",op="x"} 1\n'
    server = await answering(
        {
            b"/gotalk": b"01f00000001",
            b"/short": http_ok(b"peerwire_connections_open 1\n", length=100),
            b"/no-le": http_ok(bucket),
            b"/html": http_ok(b"<html><body>hello</body></html>\n"),
        }
    )
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    expected = {"/gotalk": 3, "/short": 3, "/no-le": 1, "/html": 1}
    try:
        done = await asyncio.gather(
            *(run_cli("top", base + path, "--count", "1", "--plain") for path in expected)
        )
    finally:
        server.close()
        await server.wait_closed()
    for (path, code), (status, out, err) in zip(expected.items(), done, strict=True):
        assert (status, out) == (code, ""), (path, err)
        assert "Traceback" not in err and err.count("\n") == 1, (path, err)
        url = base + path
        what = f"cannot read {url}: " if code == 3 else f"{url} is not a metrics endpoint: "
        assert err.startswith(f"peerwire: {what}"), (path, err)
    assert "not a whole HTTP answer: BadStatusLine('01f00000001')" in done[0][2]


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "soon"])
def test_top_refuses_an_interval_that_is_no_positive_number(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An interval of 0 scraped the endpoint in a tight loop."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["top", "127.0.0.1:9100", "--interval", interval])
    assert exit_info.value.code == 2
    assert "--interval: must be a number of seconds above 0" in capsys.readouterr().err


def metrics_text(requests: float, errors: float, fast: float, received: float) -> str:
    """One scrape of a server that served ``requests`` echo calls, ``errors`` of them failed
    (no such series while 0, as a fresh server has none), ``fast`` within 1 ms and the rest
    within 10 ms, and received and sent ``received`` bytes each."""
    echo = 'side="server",protocol="gotalk",op="echo"'
    bucket = "peerwire_request_duration_seconds_bucket"
    lines = [
        "# TYPE peerwire_requests counter",
        f'peerwire_requests_total{{{echo},kind="request"}} {requests}',
        "# TYPE peerwire_request_duration_seconds histogram",
        f'{bucket}{{{echo},le="0.001"}} {fast}',
        f'{bucket}{{{echo},le="0.01"}} {requests}',
        f'{bucket}{{{echo},le="+Inf"}} {requests}',
        f"peerwire_request_duration_seconds_count{{{echo}}} {requests}",
        f"peerwire_request_duration_seconds_sum{{{echo}}} 1.0",
        "# TYPE peerwire_received_bytes counter",
        f"peerwire_received_bytes_total {received}",
        "# TYPE peerwire_sent_bytes counter",
        f"peerwire_sent_bytes_total {received}",
    ]
    if errors:
        lines.append("# TYPE peerwire_errors counter")
        lines.append(f'peerwire_errors_total{{{echo},error="handler"}} {errors}')
    return "\n".join(lines) + "\n"


def test_counters_reset_by_a_restart_count_from_zero_not_negative() -> None:
    """After a server restart its counters start again from 0: the view takes the new value
    as the increase since the reset (as Prometheus' rate() does). Before, the calls/s and
    bytes/s of that interval were negative (echo -4,990.0 calls/s)."""
    before = top.parse(metrics_text(5000, 100, 4000, 10_000_000), "server", 10.0)
    now = top.parse(metrics_text(10, 2, 10, 500), "server", 12.0)
    (row,) = top.rows(before, now)
    assert (row.op, row.rate, row.error_rate, row.total) == ("echo", 5.0, 0.2, 10)
    assert all(v is not None and 0 <= v <= 0.001 for v in row.latencies), row.latencies
    assert "in 250 B/s  out 250 B/s" in top.summary(before, now)
    # the same scrape with the error series not yet there again (no error since the restart)
    no_errors = top.parse(metrics_text(10, 0, 10, 500), "server", 12.0)
    (row,) = top.rows(before, no_errors)
    assert (row.rate, row.error_rate) == (5.0, 0.0)
    # counters that only grew: the difference, as before
    later = top.parse(metrics_text(30, 2, 20, 2500), "server", 14.0)
    (row,) = top.rows(now, later)
    assert (row.rate, row.error_rate) == (10.0, 0.0)
    assert "in 1,000 B/s" in top.summary(now, later)
    assert row.latencies[1] is not None and 0.001 < row.latencies[1] <= 0.01


@pytest.mark.parametrize("op", ["items[/x]", "[red]x", "[bold]", "a\\[b]"])
def test_rich_view_shows_op_names_as_they_are(op: str) -> None:
    """Op names are anyone's text: the rich table read them as markup, so `items[/x]`
    (a closing tag with nothing open) raised MarkupError and `[red]x` showed as `x`."""
    from rich.console import Console

    escaped = op.replace("\\", "\\\\").replace('"', '\\"')
    text = f'peerwire_requests_total{{side="server",op="{escaped}",kind="request"}} 7\n'
    now = top.parse(text, "server", 1.0)
    assert list(now.ops) == [op]
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(top._rich_frame("h:1", None, now))
    (line,) = [line for line in out.getvalue().splitlines() if line.rstrip().endswith("7 │")]
    assert line.split("│")[1].strip() == op


@contextlib.asynccontextmanager
async def top_process(stdout: Any, *options: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``peerwire top URL --plain *options`` in a process of its own, writing to ``stdout``,
    against a metrics endpoint here that serves one small scrape; the process killed if it
    still runs, and the endpoint closed, at the block's end."""
    reply = http_ok(metrics_text(10, 1, 5, 100).encode())
    server = await answering({b"/metrics": reply})
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    process = None
    try:
        process = await asyncio.create_subprocess_exec(
            *PEERWIRE,
            "top",
            url,
            "--plain",
            *options,
            cwd=ROOT,
            stdout=stdout,
            stderr=asyncio.subprocess.PIPE,
        )
        yield process
    finally:
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
        server.close()
        await server.wait_closed()


async def test_top_into_a_pipe_closed_early_is_not_a_scrape_failure() -> None:
    """``peerwire top URL --plain | head -1``: our stdout closing is the pipe's end, as for
    ``call`` and ``stream`` (exit 1, nothing said), not "cannot read URL: Broken pipe"
    (exit 3), which it was (helper-130's hunt)."""
    read_end, write_end = os.pipe()
    async with top_process(write_end, "--interval", "0.05") as process:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as out:
            first = await asyncio.to_thread(out.readline)  # then the reader goes away
        assert first, "top printed nothing"
        async with asyncio.timeout(30):
            _, err = await process.communicate()
    assert (process.returncode, err.decode()) == (1, "")
