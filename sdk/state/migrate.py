"""Carry keys written before the team hash tags over to their current names.

Since every key a script touches carries its team as a Redis Cluster hash tag
(`PREFIX:spend:{TEAM}:…`, backend.py:team_slot), keys an older version wrote (`PREFIX:spend:TEAM:…`)
are no longer read: an upgrade would start the month's spend from zero and lose stored responses
(so `previous_response_id` chains) and the current rate-limit buckets. `slipstream state migrate`
renames them (RENAMENX: a key already written under the new name is kept, and the old one reported).
Those versions spoke to one server (or a Sentinel master), so a Cluster URL is refused: there are no
old keys to carry, and the old names of one team would hash to many slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sdk.state.backend import team_slot
from sdk.state.redis import split_url
from sdk.state.redis_client import RedisClient

FAMILIES = ("spend", "responses", "limit")  # key families whose second part is the team


@dataclass(slots=True)
class Migration:
    renamed: list[tuple[str, str]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (old, new) where new already existed


def new_name(prefix: str, family: str, key: str) -> str | None:
    """The hash-tagged name of an old key of `family`, or None when it has one already."""
    rest = key[len(f"{prefix}:{family}:"):]
    if rest.startswith("{") or not rest:
        return None
    team, sep, tail = rest.partition(":")
    return f"{prefix}:{family}:{team_slot(team)}{sep}{tail}"


async def migrate_hash_tags(url: str, dry_run: bool = False) -> Migration:
    server, prefix, timeout_s = split_url(url)
    client = RedisClient(server, timeout_s)
    if client.target.mode == "cluster":
        raise ValueError("a Redis Cluster holds no keys from before the hash tags (those versions used one server)")
    result = Migration()
    try:
        for family in FAMILIES:
            cursor = b"0"
            while True:
                reply = await client.execute("SCAN", cursor, "MATCH", f"{prefix}:{family}:*", "COUNT", 1000)
                cursor, keys = reply[0], reply[1]
                for raw in keys:
                    old = raw.decode() if isinstance(raw, bytes) else str(raw)
                    new = new_name(prefix, family, old)
                    if new is None:
                        continue
                    if dry_run:
                        moved = not await client.execute("EXISTS", new)
                    else:
                        moved = bool(await client.execute("RENAMENX", old, new))
                    (result.renamed if moved else result.kept).append((old, new))
                if cursor in (b"0", "0", 0):
                    break
    finally:
        await client.close()
    return result
