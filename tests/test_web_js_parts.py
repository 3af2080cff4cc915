"""The browser library's layout: parts of one job each, joined into the one script served.

``transports/web/gotalk.parts.json`` lists the parts in order; the server serves them joined
at ``<mount>gotalk.js`` and ``<mount>peerwire.js``, and ``transports/web/gotalk.js`` runs the
same joined text under Node. Here: the list is the one expected (a part dropped from it, or
a part file left out of it, fails), each part stays under the project's ~500-line limit, a
real server serves exactly the parts joined (Content-Length, ETag and gzip of those bytes),
and Node's loader stops with an error when a part is missing.
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
from tests.test_web_js_node import node
from tests.test_websocket import http_get

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
