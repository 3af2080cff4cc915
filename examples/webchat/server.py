"""Web chat: browser tabs chat through one peerwire server over Gotalk on WebSocket.

    .venv/bin/python examples/webchat/server.py --listen ws+gotalk://127.0.0.1:8080/gotalk/

prints ``open http://127.0.0.1:8080/``; open it in several tabs (``/?name=ada`` picks a name).

- the page calls ``send`` (the server broadcasts a ``message`` notification to every tab)
  and ``history`` (the last messages, shown when a tab connects);
- the server calls ``whoami``, an operation each page registers, as soon as a tab connects,
  then prints the name and broadcasts the ``users`` list.

The page loads the browser library from ``/gotalk/gotalk.js``, served by the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

import rpc
from transports.websocket import HttpOptions

STATIC = Path(__file__).resolve().parent / "static"
MAX_TEXT = 500
MAX_NAME = 40


class Message(msgspec.Struct):
    sender: str
    text: str
    time: float


class Chat:
    """The chat room: who is here (by connection) and the last ``history`` messages."""

    def __init__(self, history: int = 50) -> None:
        self.members: dict[rpc.Peer, str] = {}
        self.history: collections.deque[Message] = collections.deque(maxlen=history)
        self.registry = rpc.Registry()
        self.registry.handle("send")(self.send)
        self.registry.handle("history")(self.recent)
        self.registry.handle("users")(self.users)

    # --- operations the page calls ---

    def send(self, text: str) -> int:
        """Broadcast ``text`` from the calling tab; returns how many tabs it reached."""
        text = text.strip()
        if not text or len(text) > MAX_TEXT:
            raise ValueError(f"a message has 1 to {MAX_TEXT} characters")
        sender = self.members.get(rpc.current_peer.get(), "someone")
        message = Message(sender, text, time.time())
        self.history.append(message)
        return self.broadcast("message", message)

    def recent(self, _: Any = None) -> list[Message]:
        return list(self.history)

    def users(self, _: Any = None) -> list[str]:
        return sorted(self.members.values())

    # --- connections ---

    async def on_connect(self, peer: rpc.Peer) -> None:
        """Ask the new tab for its name (a request from the server to the browser)."""
        try:
            name = await peer.request("whoami", timeout=10)
        except rpc.RpcError as exc:
            print(f"{peer.remote_address} did not say who it is: {exc}", flush=True)
            return
        name = str(name).strip()[:MAX_NAME] or "anonymous"
        self.members[peer] = name
        peer.closed.add_done_callback(lambda _: self._left(peer))
        print(f"{name} joined from {peer.remote_address[0]}", flush=True)
        self.broadcast("users", self.users())

    def _left(self, peer: rpc.Peer) -> None:
        name = self.members.pop(peer, None)
        if name is not None:
            print(f"{name} left", flush=True)
            self.broadcast("users", self.users())

    def broadcast(self, name: str, value: object) -> int:
        reached = 0
        for peer in list(self.members):
            if peer.is_open:
                peer.notify(name, value)
                reached += 1
        return reached


def serve(listen: str, chat: Chat) -> rpc.Server:
    """The chat's operations on ``listen`` (a ``ws+gotalk://`` URL), with the page."""
    return rpc.serve(
        listen,
        registry=chat.registry,
        on_connect=chat.on_connect,
        web=HttpOptions(static_dir=STATIC),
    )


async def run(listen: str) -> None:
    async with serve(listen, Chat()) as server:
        host = server.url.host
        host = f"[{host}]" if ":" in host else host
        print(f"open http://{host}:{server.url.port}/", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="peerwire web chat demo")
    parser.add_argument(
        "--listen",
        default="ws+gotalk://127.0.0.1:8080/gotalk/",
        help="ws+gotalk:// URL, or HOST:PORT (port 0 picks a free port)",
    )
    args = parser.parse_args(argv)
    listen = args.listen if "://" in args.listen else f"ws+gotalk://{args.listen}/gotalk/"
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(listen))


if __name__ == "__main__":
    main()
