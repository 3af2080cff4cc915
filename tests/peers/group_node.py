"""A group node in its own process, driven over stdin/stdout with JSON lines.

usage: group_node.py [--key K] [--seed N] [--quiet] [--port P] [--peers H:P,...] [--learn]
                     [--loop asyncio|uvloop] [--retry-base S] [--retry-after S]

Prints ``{"event": "ready", "port": P}`` once listening on 127.0.0.1 (``--port``, default
any free port; ``--peers`` are passed to ``GroupNode.start``, which then broadcasts a join).
Commands (one JSON object per stdin line), each answered with one line:

    {"cmd": "peers", "peers": ["127.0.0.1:P", ...]}      -> {"event": "ok"}
    {"cmd": "members"}                        -> {"event": "members", "members": ["H:P", ...]}
    {"cmd": "notify", "values": [v, ...]}     -> {"event": "sent", "count": n, "t0": t, "t1": t}
    {"cmd": "notify", "value": v, "count": n} -> the same, broadcasting v n times
    {"cmd": "stats"}                          -> {"event": "stats", "stats": {...}}

Every ``msg`` broadcast received prints ``{"event": "got", "value": v, "t": t}`` (with
``--quiet`` only a count is kept, reported by ``stats`` as ``got``, and the time of the last
as ``last_t``). Times are ``time.monotonic()``, one clock for every process of the machine.
End of stdin closes the node.

:class:`Cluster` starts and drives such processes for tests and benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import rpc  # noqa: E402
from rpc.group import GroupNode, GroupOptions  # noqa: E402

SCRIPT = Path(__file__).resolve()
LINE_LIMIT = 1 << 24  # JSON lines carry benchmark payloads


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def serve(args: argparse.Namespace) -> None:
    key: bytes = args.key.encode()
    quiet: bool = args.quiet
    registry = rpc.Registry()
    got = 0
    last_t = 0.0

    @registry.handle_notification("msg")
    def on_msg(value: Any) -> None:
        nonlocal got, last_t
        got += 1
        last_t = time.monotonic()
        if not quiet:
            _say({"event": "got", "value": value, "t": last_t})

    rng = random.Random(args.seed) if args.seed is not None else None
    options = GroupOptions(
        learn=args.learn, retry_base=args.retry_base, retry_after=args.retry_after
    )
    peers = [p for p in args.peers.split(",") if p]
    node = await GroupNode.start(
        "127.0.0.1", args.port, key=key, peers=peers, registry=registry, rng=rng, options=options
    )
    _say({"event": "ready", "port": node.netid.port})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            cmd = json.loads(line)
            if cmd["cmd"] == "peers":
                for peer in cmd["peers"]:
                    node.add_peer(peer)
                _say({"event": "ok"})
            elif cmd["cmd"] == "notify":
                values = cmd.get("values") or [cmd["value"]] * cmd["count"]
                t0 = time.monotonic()
                for value in values:
                    await node.notify("msg", value)
                reply = {"event": "sent", "count": len(values)}
                _say({**reply, "t0": t0, "t1": time.monotonic()})
            elif cmd["cmd"] == "members":
                _say({"event": "members", "members": [str(m) for m in node.members]})
            elif cmd["cmd"] == "stats":
                backed_off = node.footprint().backed_off
                stats = {**node.stats.as_dict(), "got": got, "last_t": last_t}
                stats["backed_off"] = backed_off
                _say({"event": "stats", "stats": stats})
            else:
                _say({"event": "error", "message": f"unknown command {cmd['cmd']!r}"})
    finally:
        await node.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--key", default="cluster key")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--peers", default="")
    parser.add_argument("--learn", action="store_true")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--retry-base", type=float, default=GroupOptions().retry_base)
    parser.add_argument("--retry-after", type=float, default=GroupOptions().retry_after)
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(serve(args))
    else:
        asyncio.run(serve(args))


# --- driving processes --------------------------------------------------------------------


class NodeProcess:
    """One node process: its port, what it received, and a command channel."""

    def __init__(self, index: int, proc: asyncio.subprocess.Process) -> None:
        self.index = index
        self.proc = proc
        self.port = 0
        self.received: list[Any] = []
        self.times: list[float] = []
        self.replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.on_got: Callable[[], None] = lambda: None
        self._reader: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def start_reading(self) -> None:
        ready = await self._next_line()
        if ready.get("event") != "ready":
            raise RuntimeError(f"node {self.index} did not start: {ready}")
        self.port = ready["port"]
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _next_line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"node {self.index} exited (code {await self.proc.wait()})")
        return json.loads(line)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            event = json.loads(line)
            if event["event"] == "got":
                self.received.append(event["value"])
                self.times.append(event["t"])
                self.on_got()
            else:
                self.replies.put_nowait(event)

    async def command(self, timeout: float = 10.0, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        await self.proc.stdin.drain()
        async with asyncio.timeout(timeout):
            return await self.replies.get()

    async def kill(self) -> None:
        """SIGKILL: no goodbye, sockets closed by the kernel."""
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        if self.alive:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                async with asyncio.timeout(5):
                    await self.proc.wait()
            except TimeoutError:
                await self.kill()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


async def spawn(index: int, args: Sequence[str]) -> NodeProcess:
    """One node process, started and listening (30 s at most)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=LINE_LIMIT,
    )
    node = NodeProcess(index, proc)
    try:
        async with asyncio.timeout(30):
            await node.start_reading()
    except BaseException:
        await node.stop()
        raise
    return node


class Cluster:
    """``n`` node processes on 127.0.0.1, each knowing all the others."""

    def __init__(self, nodes: list[NodeProcess]) -> None:
        self.nodes = nodes
        self._changed = asyncio.Event()
        for node in nodes:
            node.on_got = self._changed.set

    @classmethod
    async def start(
        cls, n: int, *, seed: int = 1, quiet: bool = False, args: Sequence[str] = ()
    ) -> Cluster:
        """Start ``n`` processes (``args``: more command-line options for each) and give
        each the others as static peers."""
        flags = [*(["--quiet"] if quiet else []), *args]
        nodes = await asyncio.gather(
            *(spawn(i, ["--seed", str(seed + i), *flags]) for i in range(n)),
            return_exceptions=True,
        )
        cluster = cls([node for node in nodes if isinstance(node, NodeProcess)])
        try:
            for node in nodes:
                if isinstance(node, BaseException):
                    raise node
            async with asyncio.timeout(30):
                everyone = [node.address for node in cluster.nodes]
                await asyncio.gather(
                    *(node.command(cmd="peers", peers=everyone) for node in cluster.nodes)
                )
        except BaseException:
            await cluster.stop()
            raise
        return cluster

    async def restart(self, index: int, args: Sequence[str] = ()) -> NodeProcess:
        """Start node ``index`` again (after :meth:`NodeProcess.kill`) with ``args``."""
        node = await spawn(index, args)
        node.on_got = self._changed.set
        self.nodes[index] = node
        return node

    @property
    def alive(self) -> list[NodeProcess]:
        return [node for node in self.nodes if node.alive]

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait for ``predicate`` to hold, re-checking whenever a node receives something."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            return predicate()
        return True

    async def stats(self) -> list[dict[str, Any]]:
        replies = await asyncio.gather(*(node.command(cmd="stats") for node in self.alive))
        return [reply["stats"] for reply in replies]

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes), return_exceptions=True)


if __name__ == "__main__":
    main()
