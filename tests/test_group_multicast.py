"""UDP multicast between group nodes, inside a private network namespace.

Multicast must not leak onto the machine's networks, so pytest re-executes this file under
``unshare -n`` (a fresh network namespace holding only a loopback device, which it brings
up), where the scenarios below run and print their observations as JSON; the tests assert
on them. Where no namespace can be made, the tests fail in CI and as root (both should be
able to), and are skipped with the reason elsewhere (e.g. a developer's unprivileged shell).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import rpc  # noqa: E402
from rpc.group import GroupNode, GroupOptions, MulticastConfig  # noqa: E402
from tests.rpc_helpers import wait_until  # noqa: E402

KEY = b"multicast test key"


# --- outside: run the scenarios in a namespace --------------------------------------------


def _namespace_problem() -> str | None:
    if shutil.which("unshare") is None:
        return "the unshare command (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`unshare -n true` failed: {probe.stderr.strip() or probe.returncode}"
    return None


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    problem = _namespace_problem()
    if problem is not None:
        if os.environ.get("CI") or os.geteuid() == 0:
            pytest.fail(f"multicast tests need a private network namespace: {problem}")
        pytest.skip(f"multicast tests need `unshare -n` (root or user namespaces): {problem}")
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, __file__],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"scenarios failed:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_multicast_alone_reaches_nodes_with_no_tcp_peers(facts: dict[str, Any]) -> None:
    f = facts["multicast_only"]
    assert f["got"] == [[], ["hello", "again"], ["hello", "again"], ["hello", "again"]]
    assert f["sender"]["frames_sent"] == 0  # nothing over TCP: nobody was on its list
    # the first broadcast took the node's join along by multicast; the second is one
    # datagram (a node that knew no member sent a join with every broadcast, for good)
    assert f["second_datagrams"] == 1
    assert f["sender"]["multicast_sent"] >= 1
    assert all(s["multicast_received"] >= 1 for s in f["receivers"])


def test_own_multicast_is_ignored(facts: dict[str, Any]) -> None:
    f = facts["multicast_only"]
    assert f["sender"]["own_multicast_ignored"] >= 1  # loopback hands it back to us
    assert f["got"][0] == []
    assert f["sender"]["dispatched"] == 0


def test_peers_seeing_our_multicast_are_dropped_from_tcp_but_one(facts: dict[str, Any]) -> None:
    f = facts["pruned"]
    # nodes 1..4 multicast; node 5 has multicast off and so never reports seeing ours
    assert f["multicast_peers"] == f["expected_multicast_peers"]
    assert f["got"] == [0, 1, 1, 1, 1, 1]  # everyone once, duplicates dropped
    # TCP went to node 5 and to one node put back from the multicast ones: 2 frames, and
    # as many for node 0's join (it was started without peers), pruned the same way
    assert f["tcp_frames"] == 2 + 2
    assert f["multicast_sent"] >= 1


def test_multicast_is_off_by_default(facts: dict[str, Any]) -> None:
    f = facts["default_off"]
    assert f["multicast_listener_got"] == ["ping"]
    assert f["plain_node_got"] == []
    assert f["plain_node_stats"]["multicast_received"] == 0


# --- inside the namespace -----------------------------------------------------------------


def _loopback_up() -> None:
    """Bring ``lo`` up with SIOCSIFFLAGS (no iproute2 needed)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, request))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def _mcast(port: int, announce: float = 60.0) -> MulticastConfig:
    return MulticastConfig(port=port, interface="127.0.0.1", ttl=0, announce_interval=announce)


async def _node(got: list[Any], mcast: MulticastConfig | None, **kw: Any) -> GroupNode:
    registry = rpc.Registry()
    registry.handle_notification("chat")(got.append)
    options = GroupOptions(multicast=mcast, **kw)
    return await GroupNode.start("127.0.0.1", 0, key=KEY, registry=registry, options=options)


async def _multicast_only() -> dict[str, Any]:
    got: list[list[Any]] = [[] for _ in range(4)]
    nodes = [await _node(g, _mcast(30001)) for g in got]
    try:
        await nodes[0].notify("chat", "hello")
        await wait_until(lambda: all(got[1:]))
        sent = nodes[0].stats.multicast_sent
        await nodes[0].notify("chat", "again")  # its join went with the first
        await wait_until(lambda: all(len(g) == 2 for g in got[1:]))
        # loopback hands the sender its own datagram: once it is ignored, the test can tell
        await wait_until(lambda: nodes[0].stats.own_multicast_ignored >= 1)
        return {
            "got": got,
            "second_datagrams": nodes[0].stats.multicast_sent - sent,
            "sender": nodes[0].stats.as_dict(),
            "receivers": [n.stats.as_dict() for n in nodes[1:]],
        }
    finally:
        for n in nodes:
            await n.close()


async def _pruned() -> dict[str, Any]:
    got: list[list[Any]] = [[] for _ in range(6)]
    nodes = [await _node(g, _mcast(30002, announce=0.05)) for g in got[:5]]
    nodes.append(await _node(got[5], None))
    try:
        for n in nodes:
            for other in nodes:
                n.add_peer(other.netid)
        expected = sorted(str(n.netid) for n in nodes[1:5])
        # the announcements tell each node who sees its multicast
        await wait_until(lambda: sorted(map(str, nodes[0].multicast_peers)) == expected)
        before = nodes[0].stats.frames_sent
        await nodes[0].notify("chat", "tree")
        await wait_until(lambda: all(got[1:]))
        # every TCP frame sent has arrived (the put-back node's re-multicast went out, if it
        # did, when its frame arrived; datagrams on loopback are delivered as they are sent)
        await wait_until(
            lambda: (
                sum(n.stats.frames_sent for n in nodes)
                == sum(n.stats.frames_received for n in nodes)
            )
        )
        return {
            "multicast_peers": sorted(map(str, nodes[0].multicast_peers)),
            "expected_multicast_peers": expected,
            "got": [len(g) for g in got],
            "tcp_frames": nodes[0].stats.frames_sent - before,
            "multicast_sent": nodes[0].stats.multicast_sent,
        }
    finally:
        for n in nodes:
            await n.close()


async def _default_off() -> dict[str, Any]:
    listener_got: list[Any] = []
    plain_got: list[Any] = []
    sender = await _node([], _mcast(29999))
    listener = await _node(listener_got, _mcast(29999))
    plain = await _node(plain_got, None)  # default options: no multicast socket at all
    try:
        await sender.notify("chat", "ping")
        await wait_until(lambda: listener_got)
        # the plain node has no multicast socket at all: nothing can arrive there later
        return {
            "multicast_listener_got": listener_got,
            "plain_node_got": plain_got,
            "plain_node_stats": plain.stats.as_dict(),
        }
    finally:
        for n in (sender, listener, plain):
            await n.close()


async def _scenarios() -> dict[str, Any]:
    return {
        "multicast_only": await _multicast_only(),
        "pruned": await _pruned(),
        "default_off": await _default_off(),
    }


def main() -> None:
    interfaces = [name for _, name in socket.if_nameindex()]
    if interfaces != ["lo"]:
        sys.exit(f"refusing to multicast outside a private namespace (interfaces: {interfaces})")
    _loopback_up()
    print(json.dumps(asyncio.run(_scenarios())))


if __name__ == "__main__":
    main()
