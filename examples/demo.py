"""End-to-end demo: one server on both protocols, driven by the CLI and by the Python API.

    make demo                  # or: .venv/bin/python examples/demo.py

It starts ``peerwire serve examples/greet.py`` on Chatter and Gotalk (free ports), calls it
with ``peerwire call`` processes and with ``rpc.connect``, checks every answer, stops the
server and exits 0 only if everything worked, so it doubles as a smoke test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import rpc

ROOT = Path(__file__).resolve().parent.parent
GREET = Path("examples") / "greet.py"
# `python -m rpc.cli` is the `peerwire` console script without relying on PATH
PEERWIRE = [sys.executable, "-m", "rpc.cli"]

failures: list[str] = []


def check(what: str, got: Any, expected: Any) -> None:
    """Print one line per step; remember mismatches for the exit code."""
    ok = got == expected
    print(f"  {'ok ' if ok else 'FAIL'} {what} -> {got!r}")
    if not ok:
        failures.append(f"{what}: expected {expected!r}, got {got!r}")


def start_server() -> tuple[subprocess.Popen[str], queue.Queue[str | None]]:
    """The server's stdout is read by a thread, so a silent server cannot hang the demo."""
    args = [
        *PEERWIRE,
        "serve",
        str(GREET),
        "--listen",
        "tcp+sbs://127.0.0.1:0",
        "--listen",
        "tcp+gotalk://127.0.0.1:0",
    ]
    print(f"$ peerwire {shlex.join(args[len(PEERWIRE) :])}")
    server = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return server, lines


def bound_urls(lines: queue.Queue[str | None], count: int) -> dict[str, str]:
    """codec ("sbs" or "gotalk") -> the URL the server printed."""
    urls: dict[str, str] = {}
    while len(urls) < count:
        try:
            line = lines.get(timeout=15)
        except queue.Empty:
            raise RuntimeError("the server printed no URL within 15 s") from None
        if line is None:
            raise RuntimeError("the server exited before listening")
        print(f"  {line}")
        url = line.removeprefix("listening on ")
        urls[rpc.parse_url(url).codec] = url
    return urls


def cli_call(url: str, op: str, payload: Any) -> Any:
    args = ["call", url, op, json.dumps(payload, ensure_ascii=False)]
    print(f"$ peerwire {shlex.join(args)}")
    done = subprocess.run([*PEERWIRE, *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip()}"
    return json.loads(done.stdout)


async def python_api(urls: dict[str, str]) -> None:
    gotalk, hat = urls["gotalk"], urls["sbs"]
    current = f"{urls['sbs']}?dialect=HatChatter"

    print(f"async with rpc.connect({gotalk!r}) as peer:")
    async with rpc.connect(gotalk) as peer:
        got = [n async for n in peer.stream("count", value={"to": 5})]
        check('[n async for n in peer.stream("count", value={"to": 5})]', got, [1, 2, 3, 4, 5])
        got = [s async for s in peer.stream("sum", parts=[1, 2, 3, 4])]
        check('[s async for s in peer.stream("sum", parts=[1, 2, 3, 4])]', got, [10])
        peer.notify("log", "hello over Gotalk")
        print('  sent peer.notify("log", "hello over Gotalk")')

    print(f"async with rpc.connect({current!r}) as peer:")
    async with rpc.connect(current) as peer:
        got = [n async for n in peer.stream("count", value={"to": 3})]
        check('[n async for n in peer.stream("count", value={"to": 3})]', got, [1, 2, 3])
        got = [s async for s in peer.stream("sum", parts=[0.5, 0.25])]
        check('[s async for s in peer.stream("sum", parts=[0.5, 0.25])]', got, [0.75])
        peer.notify("log", "hello over Hat Chatter")
        print('  sent peer.notify("log", "hello over Hat Chatter")')

    print(f"async with rpc.connect({hat!r}) as peer:  # legacy Hat dialect")
    async with rpc.connect(hat) as peer:
        try:
            await peer.request("greet", {"nom": "Ada"})
            check("greet with bad input raises RemoteError", "no error", "RemoteError")
        except rpc.RemoteError as exc:
            print(f"  ok  greet with bad input -> RemoteError: {exc}")


def start_webchat() -> tuple[subprocess.Popen[str], str]:
    """The browser demo, on port 8080 when free (else any port); returns (process, URL)."""
    with socket.socket() as probe:
        port = 8080 if probe.connect_ex(("127.0.0.1", 8080)) != 0 else 0
    listen = f"ws+gotalk://127.0.0.1:{port}/gotalk/"
    args = [sys.executable, "examples/webchat/server.py", "--listen", listen]
    print(f"$ python examples/webchat/server.py --listen {listen}")
    chat = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert chat.stdout is not None
    first = chat.stdout.readline().strip()  # "open http://127.0.0.1:PORT/"
    threading.Thread(target=lambda: [None for _ in chat.stdout], daemon=True).start()  # type: ignore[union-attr]
    return chat, first.removeprefix("open ")


async def webchat_check(page_url: str) -> None:
    url = "ws+gotalk://" + page_url.split("://", 1)[1] + "gotalk/"
    print(f"async with rpc.connect({url!r}) as peer:  # what the page's script does")
    client = rpc.Registry()

    @client.handle("whoami")
    def whoami(_value: Any) -> str:
        return "demo"

    async with rpc.connect(url, registry=client) as peer:
        await peer.request("send", "hello from the demo")
        history = await peer.request("history")
        texts = [entry.get("text") for entry in history if isinstance(entry, dict)]
        check("web chat history has our message", "hello from the demo" in texts, True)


def main() -> int:
    print("== the web chat (browser demo)")
    chat, page = start_webchat()
    print(f"  open {page} in a browser (several tabs chat with each other)")
    print("\n== a server on both protocols")
    server, lines = start_server()
    try:
        urls = bound_urls(lines, 2)
        print("\n== the CLI (each call is a `peerwire call` process)")
        for url in (urls["gotalk"], f"{urls['sbs']}?dialect=HatChatter"):
            check("greet", cli_call(url, "greet", {"name": "Ada"}), {"greeting": "Hello Ada"})
        for url in (urls["gotalk"], urls["sbs"]):  # sbs without dialect: legacy Hat
            value = {"list": [1, 2.5, None], "text": "héllo"}
            check("echo", cli_call(url, "echo", value), value)

        print("\n== the Python API")
        asyncio.run(python_api(urls))
        asyncio.run(webchat_check(page))
    except Exception as exc:  # a demo reports and fails; it does not hide the cause
        failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        print("\n== stopping the server (SIGTERM); what it printed meanwhile:")
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
        printed = []
        while (line := lines.get(timeout=5)) is not None:
            print(f"  {line}")
            printed.append(line)
    check("server exit code", code, 0)
    for text in ("hello over Gotalk", "hello over Hat Chatter"):
        check(f"server printed log: {text}", f"log: {text}" in printed, True)

    if sys.stdin.isatty() and not failures:
        print(f"\nthe web chat is still running at {page}: press Enter to stop it")
        with contextlib.suppress(EOFError, KeyboardInterrupt):
            input()
    chat.send_signal(signal.SIGTERM)
    try:
        chat.wait(timeout=15)
    except subprocess.TimeoutExpired:
        chat.kill()
    if failures:
        print("\ndemo FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\ndemo OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
