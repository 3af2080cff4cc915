"""Group broadcast: one ``notify`` reaches every member, over Chatter's gossip frame.

import rpc, rpc.group

registry = rpc.Registry()

@registry.handle_notification("chat")
def on_chat(text: str) -> None:
    print(text)

node = await rpc.group.GroupNode.start(
    "127.0.0.1", 7000, key=b"group secret", peers=["127.0.0.1:7001"], registry=registry
)
await node.notify("chat", "hello, everyone")
await node.close()

The frame's encryption is weak (reused keystream, no MAC): see the README section "Group broadcast".
"""

from rpc.group.multicast import MulticastConfig
from rpc.group.node import GroupNode
from rpc.group.options import Footprint, GroupOptions, GroupStats, as_netid
from rpc.group.payloads import PayloadType, PayloadTypes, TagCollision
from rpc.group.planner import Chunk, Planner, fanout_bound
from wire.gossip import NetID

__all__ = [
    "Chunk",
    "Footprint",
    "GroupNode",
    "GroupOptions",
    "GroupStats",
    "MulticastConfig",
    "NetID",
    "PayloadType",
    "PayloadTypes",
    "Planner",
    "TagCollision",
    "as_netid",
    "fanout_bound",
]
