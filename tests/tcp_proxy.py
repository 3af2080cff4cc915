"""A loopback TCP proxy for tests: drops, stalls and black-holes connections on demand.

    async with Proxy(target_port) as proxy:       # listens on 127.0.0.1, port 0
        url = f"tcp+gotalk://127.0.0.1:{proxy.port}"
        proxy.drop()          # close every connection now (both sides)
        proxy.refuse()        # accept new connections and close them at once
        proxy.stall()         # accept new connections and never carry a byte
        proxy.black_hole()    # connections open now stay open but carry nothing more
        proxy.forward(port)   # new connections go to ``port`` (default: the current target)

Transport-agnostic: TLS and WebSocket connections pass through as bytes. ``accepted`` holds
the loop time of every accepted connection (to measure the waits between attempts).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from typing import Any


class Mode(enum.Enum):
    FORWARD = "forward"
    REFUSE = "refuse"
    STALL = "stall"


class _Link:
    """One accepted connection and, when forwarded, its upstream connection."""

    def __init__(self, writers: list[asyncio.StreamWriter]) -> None:
        self.writers = writers
        self.holed = False
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        for task in self.tasks:
            task.cancel()
        for writer in self.writers:
            writer.transport.abort()


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.accepted: list[float] = []
        self._mode = Mode.FORWARD
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None

    @property
    def open_links(self) -> int:
        return len(self._links)

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.close()
        self.drop()
        if self._server is not None:
            await self._server.wait_closed()

    # --- controls ------------------------------------------------------------------------

    def forward(self, port: int | None = None) -> None:
        if port is not None:
            self.target_port = port
        self._mode = Mode.FORWARD

    def refuse(self) -> None:
        self._mode = Mode.REFUSE

    def stall(self) -> None:
        self._mode = Mode.STALL

    def drop(self) -> None:
        for link in list(self._links):
            link.abort()
        self._links.clear()

    def black_hole(self) -> None:
        for link in self._links:
            link.holed = True

    # --- connections ---------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted.append(asyncio.get_running_loop().time())
        if self._mode is Mode.REFUSE:
            writer.transport.abort()
            return
        link = _Link([writer])
        self._links.add(link)
        if self._mode is Mode.STALL:
            return  # held open until dropped; nothing read, nothing sent
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            self._links.discard(link)
            writer.transport.abort()
            return
        link.writers.append(up_writer)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link)),
            asyncio.create_task(self._pump(up_reader, writer, link)),
        ]
        await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
        link.abort()
        self._links.discard(link)

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if link.holed:
                    continue  # read and dropped: the other side hears nothing more
                writer.write(data)
                await writer.drain()
