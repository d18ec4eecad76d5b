"""The one Redis client: commands pipelined over RESP (sdk/state/resp.py) to one server, to the master
Sentinel names (found again after a failover), or to the node of a Redis Cluster that serves each
command's hash slot. The URL (sdk/state/redis_url.py) says which.

The client never retries a failed call by itself: a failure goes straight to the caller
(sdk/state/guard.py decides). What a Cluster or Sentinel answers in the normal course of a move is
followed, not a failure: a MOVED reply updates the slot map and the command is sent to the node it
names, an ASK reply sends it there once behind ASKING, and a lost connection to a Cluster node or a
Sentinel master makes the next call read the slot map, or ask the sentinels, afresh.

On a Cluster every command's keys must share one hash slot (scripts above all): callers give every
key a script touches the same hash tag (`{TEAM}`, sdk/state/backend.py:team_slot).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from sdk.state.redis_url import Target
from sdk.state.resp import Link, Reply, RespError, StateUnavailable

SLOTS = 16384
# A call whose arguments add up to this many bytes or more (a team's stored response, a cached answer)
# goes on connections of its own. Redis answers a connection's commands in order and every team's
# calls of one client share its connection: one team's megabytes, written at the network's pace, held
# every other team's calls queued behind them (their stored-response puts and reads) past their timeouts.
BULK_BYTES = 256 * 1024


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def key_slot(key: str | bytes) -> int:
    """The Cluster hash slot of a key: CRC16 (XMODEM) of its hash tag (`{…}`, when not empty) or of it all."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[(crc >> 8) ^ byte]
    return crc % SLOTS


def first_key(command: tuple[Any, ...]) -> Any:
    """The key a command is routed by (None: any node will do)."""
    name = str(command[0]).upper()
    if name in ("EVAL", "EVALSHA"):
        return command[3] if int(command[2]) > 0 else None
    if name == "XREAD":
        upper = [str(arg).upper() for arg in command]
        return command[upper.index("STREAMS") + 1]
    return command[1] if len(command) > 1 else None


class RedisClient:
    def __init__(self, url: str, connect_timeout_s: float):
        self.target = Target.parse(url)
        self.connect_timeout_s = connect_timeout_s
        self._links: dict[tuple[str, int], Link] = {}
        self._slots: list[tuple[str, int]] | None = None  # a Cluster's slot → node; None until read
        self._sentinels = [Link(node, self.target.sentinel_auth, connect_timeout_s) for node in self.target.nodes] \
            if self.target.mode == "sentinel" else []
        # the one server, or the master Sentinel names (asked anew at each connection); a Cluster's nodes are in _links
        self._link = Link(self._master if self._sentinels else self.target.nodes[0], self.target.auth, connect_timeout_s,
                          master=bool(self._sentinels))
        self._url = url
        self._bulk: RedisClient | None = None  # the same servers on connections of their own, for large calls
        self.is_bulk = False

    async def execute(self, *args: Any) -> Reply:
        reply = (await self.pipeline([args], raise_errors=False))[0]
        if isinstance(reply, RespError):
            raise reply
        return reply

    async def pipeline(self, commands: list[tuple[Any, ...]], raise_errors: bool = True) -> list[Reply]:
        """Send the commands pipelined (on a Cluster, one write per node, all at once); their replies in
        order. An error reply raises RespError (with `raise_errors=False`, it is returned in its place)."""
        if not self.is_bulk and _bulky(commands):
            return await self._bulk_client().pipeline(commands, raise_errors)
        if self.target.mode != "cluster":
            return await self._link.pipeline(commands, raise_errors)
        replies = await self._cluster(commands)
        if raise_errors:
            for reply in replies:
                if isinstance(reply, RespError):
                    raise reply
        return replies

    async def close(self) -> None:
        for link in (self._link, *self._sentinels, *self._links.values()):
            await link.close()
        if self._bulk is not None:
            await self._bulk.close()

    def _bulk_client(self) -> RedisClient:
        if self._bulk is None:
            self._bulk = RedisClient(self._url, self.connect_timeout_s)
            self._bulk.is_bulk = True
        return self._bulk

    # --- Sentinel ------------------------------------------------------------------------------

    async def _master(self) -> tuple[str, int]:
        """The master's address, from the first sentinel that knows it (the one that answered is
        asked first next time)."""
        errors = []
        for i, sentinel in enumerate(self._sentinels):
            try:
                reply = await sentinel.execute("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.target.service)
            except (RespError, OSError, TimeoutError) as exc:
                errors.append(f"{exc or type(exc).__name__}")
                continue
            if reply:
                self._sentinels.insert(0, self._sentinels.pop(i))
                return reply[0].decode(), int(reply[1])
            errors.append(f"no master named {self.target.service!r}")
        raise StateUnavailable(f"no sentinel named the master {self.target.service!r}: {'; '.join(errors)}")

    # --- Cluster -------------------------------------------------------------------------------

    def _node(self, address: tuple[str, int]) -> Link:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = Link(address, self.target.auth, self.connect_timeout_s)  # database 0: checked in the URL
        return link

    async def _read_slots(self) -> list[tuple[str, int]]:
        """The slot map (CLUSTER SLOTS), from the first node that answers: the known ones, then the seeds."""
        errors = []
        for address in dict.fromkeys([*self._links, *self.target.nodes]):
            try:
                ranges = await self._node(address).execute("CLUSTER", "SLOTS")
            except (RespError, OSError, TimeoutError) as exc:
                errors.append(f"{address[0]}:{address[1]}: {exc or type(exc).__name__}")
                continue
            slots: list[tuple[str, int]] = [address] * SLOTS
            for first, last, master, *_ in ranges:
                host = master[0].decode() or address[0]  # an empty host: the node that answered
                slots[first:last + 1] = [(host, int(master[1]))] * (last - first + 1)
            self._slots = slots
            return slots
        raise StateUnavailable(f"no Cluster node answered CLUSTER SLOTS: {'; '.join(errors)}")

    async def _cluster(self, commands: list[tuple[Any, ...]]) -> list[Reply]:
        slots = self._slots or await self._read_slots()
        by_node: dict[tuple[str, int], list[int]] = {}
        for i, command in enumerate(commands):
            key = first_key(command)
            node = slots[key_slot(key)] if key is not None else random.choice(slots)
            by_node.setdefault(node, []).append(i)
        replies: list[Reply] = [None] * len(commands)
        try:
            answers = await asyncio.gather(*(self._node(node).pipeline([commands[i] for i in group], raise_errors=False)
                                             for node, group in by_node.items()))
        except (OSError, TimeoutError):
            self._slots = None  # a node gone (failed over, removed): read the map again next time
            raise
        for group, answer in zip(by_node.values(), answers, strict=True):
            for i, reply in zip(group, answer, strict=True):
                replies[i] = reply
        moved = [i for i, reply in enumerate(replies) if isinstance(reply, RespError) and str(reply).startswith(("MOVED ", "ASK "))]
        for i in moved:  # a slot moved (resharding, failover): follow the node named, once
            kind, slot, where = str(replies[i]).split()[:3]
            host, _, port = where.rpartition(":")
            address = (host, int(port))
            if kind == "MOVED":
                if self._slots is not None:
                    self._slots[int(slot)] = address
                replies[i] = (await self._node(address).pipeline([commands[i]], raise_errors=False))[0]
            else:
                replies[i] = (await self._node(address).pipeline([("ASKING",), commands[i]], raise_errors=False))[1]
        return replies


def _bulky(commands: list[tuple[Any, ...]]) -> bool:
    """Whether the commands' arguments add up to BULK_BYTES or more (a string's length in characters)."""
    size = 0
    for command in commands:
        for arg in command:
            if isinstance(arg, (bytes, bytearray, memoryview, str)):
                size += len(arg)
        if size >= BULK_BYTES:
            return True
    return False
