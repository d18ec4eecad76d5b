"""prefix_affinity: a shared prefix sticks to one target, new prefixes spread, load stays bounded,
a replica's removal moves only its share, and a failed owner hands its prefixes on."""

from __future__ import annotations

from collections import Counter

import orjson

from sdk.routing.affinity import BLOCK_BYTES, PrefixOwners, affinity_order, prefix_hashes
from tests.routing.conftest import collect, inject, messages_request

SYSTEM = "You are a careful assistant for the billing team. " * 20  # several blocks


def conversation(system: str, turns: int) -> dict:
    messages = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"question {i} " * 10},
                     {"role": "assistant", "content": f"answer {i} " * 10}]
    return {"system": system, "messages": messages + [{"role": "user", "content": "and now?"}]}


def test_a_growing_conversation_keeps_its_earlier_hashes():
    short, longer = prefix_hashes(conversation(SYSTEM, 1)), prefix_hashes(conversation(SYSTEM, 3))
    shared = len(orjson.dumps([SYSTEM])) // BLOCK_BYTES
    assert shared >= 3 and longer[:shared] == short[:shared]
    assert prefix_hashes(conversation("other " + SYSTEM, 1))[0] != short[0]
    assert len(prefix_hashes({"messages": [{"role": "user", "content": "hi"}]})) == 1


def test_new_prefixes_spread_and_removal_moves_only_its_share():
    keys = ["engine/a", "engine/b", "engine/c"]
    firsts = [prefix_hashes({"system": f"system prompt number {n} " * 30})[0] for n in range(300)]
    picks = [keys[affinity_order(keys, [0, 0, 0], [h], PrefixOwners())[0]] for h in firsts]
    assert all(60 < count < 140 for count in Counter(picks).values())
    kept = ["engine/a", "engine/c"]
    moved = [(p, kept[affinity_order(kept, [0, 0], [h], PrefixOwners())[0]]) for p, h in zip(picks, firsts, strict=False)]
    assert all(before == after for before, after in moved if before != "engine/b")


def test_a_handful_of_new_prefixes_lands_evenly():
    keys = ["engine/a", "engine/b", "engine/c"]
    for batch in range(20):  # whatever the prompts hash to: the cache of a replica with more thrashes first
        owners = PrefixOwners()
        for n in range(9):
            hashes = prefix_hashes({"system": f"agent {batch}.{n}: " + "long instructions " * 40})
            owners.remember(hashes, keys[affinity_order(keys, [0, 0, 0], hashes, owners)[0]])
        assert sorted(owners.roots_held[k] for k in keys) == [3, 3, 3]


def test_a_spill_leaves_the_shared_prefix_with_its_owner_and_a_failure_hands_it_on():
    keys = ["engine/a", "engine/b", "engine/c"]
    owners = PrefixOwners()
    first = prefix_hashes(conversation(SYSTEM, 1))
    owner = keys[affinity_order(keys, [0, 0, 0], first, owners)[0]]
    owners.remember(first, owner, keys)
    spill = next(k for k in keys if k != owner)
    longer = prefix_hashes(conversation(SYSTEM, 3))
    owners.remember(longer, spill, keys)  # answered elsewhere because the owner was busy
    assert keys[affinity_order(keys, [0, 0, 0], longer, owners)[0]] == spill  # its history is there now
    another = prefix_hashes(conversation(SYSTEM, 2) | {"messages": [{"role": "user", "content": "new"}]})
    assert keys[affinity_order(keys, [0, 0, 0], another, owners)[0]] == owner  # the system prompt is not
    owners.remember(another, spill)  # the owner failed and the spill target answered: it takes over
    assert keys[affinity_order(keys, [0, 0, 0], another, owners)[0]] == spill
    assert owners.roots_held[spill] == 1 and owners.roots_held[owner] == 0


def test_the_deepest_known_prefix_wins_and_load_is_bounded():
    keys = ["engine/a", "engine/b", "engine/c"]
    owners = PrefixOwners()
    hashes = prefix_hashes(conversation(SYSTEM, 4))
    natural = keys[affinity_order(keys, [0, 0, 0], hashes, owners)[0]]
    other = next(k for k in keys if k != natural)
    owners.remember(hashes[:2], natural)
    owners.remember(hashes, other)  # a later turn was answered elsewhere: follow the deeper match
    assert keys[affinity_order(keys, [0, 0, 0], hashes, owners)[0]] == other
    busy = [8 if k == other else 0 for k in keys]  # over 1.5x its fair share of 9 in flight, plus two
    assert keys[affinity_order(keys, busy, hashes, owners)[0]] != other


async def test_conversations_stick_to_their_replica_and_move_when_it_fails(build_runtime, fresh_emulator):
    routes = """  - match: {model: "claude-*"}
    strategy: prefix_affinity
    targets: [{provider: claude, model: claude-a}, {provider: claude, model: claude-b}, {provider: claude, model: claude-c}]"""
    runtime = build_runtime(routes, extra="retry: {max_attempts: 2, base_delay_ms: 1, max_delay_ms: 10}\n")
    served: dict[int, set[str]] = {}
    for turn in range(1, 4):
        for n in range(6):
            body = conversation(f"system prompt of conversation {n} " * 20, turn)
            answer, ctx = await runtime.handle(messages_request(**body))
            await collect(answer)
            served.setdefault(n, set()).add(ctx.route)
    assert all(len(routes) == 1 for routes in served.values())
    assert len({r for routes in served.values() for r in routes}) >= 2  # spread, not all on one
    owner = next(iter(served[0]))
    inject(fresh_emulator, "500", count=5, model=owner.split("/")[1])
    answer, ctx = await runtime.handle(messages_request(**conversation("system prompt of conversation 0 " * 20, 4)))
    await collect(answer)
    assert ctx.route != owner
    answer, ctx_next = await runtime.handle(messages_request(**conversation("system prompt of conversation 0 " * 20, 5)))
    await collect(answer)
    assert ctx_next.route == ctx.route  # the prefix now lives where it was answered
