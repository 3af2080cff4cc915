"""The browser library's layout: parts of one job each, joined into the one script served.

``transports/web/gotalk.parts.json`` lists the parts in order; the server serves them joined
at ``<mount>gotalk.js`` and ``<mount>peerwire.js``, and ``transports/web/gotalk.js`` runs the
same joined text under Node. Here: the list is the one expected (a part dropped from it, or
a part file left out of it, fails), each part stays under the project's ~500-line limit, a
real server serves exactly the parts joined (Content-Length, ETag and gzip of those bytes),
Node's loader stops with an error when a part is missing, and the socket (which owns its
Connection rather than extending it) still has every setting and call of the connection
that pages use, each reaching the connection.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

import rpc
from tests.rpc_helpers import gotalk_peer_registry
from tests.test_web_js_node import node, run_node
from tests.test_websocket import http_get
from transports.websocket import HttpOptions

WEB = Path(__file__).resolve().parent.parent / "transports" / "web"
PARTS = [
    "gotalk-head.js",
    "gotalk-codec.js",
    "gotalk-events.js",
    "gotalk-stream.js",
    "gotalk-connection.js",
    "gotalk-sock.js",
    "gotalk-api.js",
]
"""The parts in the order they make one script (what ``gotalk.parts.json`` must list)."""
MAX_LINES = 500


def joined() -> bytes:
    return b"".join((WEB / name).read_bytes() for name in PARTS)


def test_parts_are_listed_in_order_and_each_is_under_the_line_limit() -> None:
    assert json.loads((WEB / "gotalk.parts.json").read_text()) == PARTS
    on_disk = sorted(p.name for p in WEB.glob("gotalk-*.js"))
    assert on_disk == sorted(PARTS), "a part on disk that is not listed, or one missing"
    for name in [*PARTS, "gotalk.js"]:
        lines = (WEB / name).read_text(encoding="utf-8").count("\n")
        assert 0 < lines < MAX_LINES, f"{name}: {lines} lines"


@pytest.mark.both_loops
async def test_the_served_script_is_exactly_the_parts_joined() -> None:
    script = joined()
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=gotalk_peer_registry()
    ) as server:
        port = server.url.port
        for name in ("gotalk.js", "peerwire.js"):
            status, headers, body = await asyncio.to_thread(http_get, port, f"/gotalk/{name}")
            assert status == 200 and body == script, name
            assert headers["Content-Length"] == str(len(script))
            assert headers["ETag"] == '"' + hashlib.sha1(script).hexdigest() + '"'
            status, headers, zipped = await asyncio.to_thread(
                http_get, port, f"/gotalk/{name}", {"Accept-Encoding": "gzip"}
            )
            assert status == 200 and headers["Content-Encoding"] == "gzip"
            assert headers["Content-Length"] == str(len(zipped))
            assert gzip.decompress(zipped) == script


def test_node_loader_fails_loudly_without_a_part(tmp_path: Path) -> None:
    copy = shutil.copytree(WEB, tmp_path / "web")
    probe = "const g = require(process.argv[1]); console.log(typeof g.connection, g.version);"
    done = subprocess.run(
        [*node(), "-e", probe, str(copy / "gotalk.js")], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "function 1.0.0-peerwire\n"), done.stderr
    (copy / "gotalk-stream.js").unlink()
    done = subprocess.run(
        [*node(), "-e", probe, str(copy / "gotalk.js")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "ENOENT" in done.stderr and "gotalk-stream.js" in done.stderr


FORWARDED = """
const s = gotalk.Sock();
const out = {};
out.before = [s.ws, s.isOpen, s.address(), s.heartbeatInterval, s.connectTimeout,
              s.maxMessageSize, s.sendBufferLimit];
s.sendBufferLimit = 1; // one request queued while connecting, the next refused
s.maxMessageSize = 64;
s.heartbeatInterval = 0; // no heartbeats: none can cut in before the results below
const up = new Promise((resolve, reject) => s.open(ADDR, (e) => (e ? reject(e) : resolve())));
const queued = s.request('greet', {name: 'q'});
out.overLimit = await s.request('greet', {name: 'r'}).catch((e) => e.message);
await up;
out.open = [s.isOpen, s.ws.readyState, s.address() === ADDR, s.heartbeatInterval];
s.sendHeartbeat(0.5);
out.queued = await queued;
const closed = new Promise((resolve) => s.once('close', resolve));
out.tooBig = await s.bufferRequest('echo', 'x'.repeat(65)).catch((e) => e.message);
out.closed = [(await closed).code, s.isOpen, s.ws];

const t = await connect(ADDR);
const ended = new Promise((resolve) => t.once('close', resolve));
const slow = t.request('sleep', {ms: 100});
t.end(); // closes once the pending request is answered
out.afterEnd = [t.isOpen, await t.request('greet', {name: 'x'}).catch((e) => e.message)];
out.slow = await slow;
out.ended = [await ended, t.isOpen];
return out;
"""


@pytest.mark.both_loops
async def test_socket_forwards_the_connections_settings_and_calls(tmp_path: Path) -> None:
    """Settings set on the socket reach its connection: sendBufferLimit refuses the second
    request queued while connecting, maxMessageSize closes the connection on a larger result,
    heartbeatInterval and the state (ws, isOpen, address()) read through; end() waits for
    the pending request, refusing new ones, then closes normally."""
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=gotalk_peer_registry(),
        web=HttpOptions(allow_missing_origin=True),  # Node's WebSocket sends no Origin
    ) as server:
        result = await run_node(tmp_path, FORWARDED, f"ws://127.0.0.1:{server.url.port}/gotalk/")
    assert result == {
        "before": [None, False, None, 20000, 10000, 16 * 1024 * 1024, 100],
        "overLimit": "socket is closed",
        "open": [True, 1, True, 0],
        "queued": {"greeting": "Hello q"},
        "tooBig": "gotalk protocol error: payload of 65 bytes is over the limit",
        "closed": [2, False, None],
        "afterEnd": [True, "socket is closed"],
        "slow": {"slept": 100},
        "ended": [None, False],
    }
