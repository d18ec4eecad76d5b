"""The cyclic garbage collector, set for a serving process.

CPython runs a collector pass whenever allocations outnumber deallocations by the first
generation's threshold (700), and now and then a full pass over every tracked object. A serving
proxy holds some hundred thousand long-lived objects (modules, the app, policies, tokenizer tables)
that every full pass walks again, and at concurrency 64 the live objects of 64 requests that every
young pass walks again while they are in flight: measured with `bench/proxy_cpu.py`, the passes took
about 150 µs of a JSON request's CPU in the proxy (a full pass every ~800 requests, ~100 ms each on a
loaded 2-core machine).

`settle()`, once the app is loaded and before the first request: collect once, freeze what is left
(`gc.freeze`: the start-up heap moves to a permanent generation that no pass walks), and raise the
first threshold so that most of a request's objects are freed by reference counting before a pass
would walk them. That holds only while requests leave no reference cycles behind
(tests/gateway/test_request_memory.py): cyclic garbage still goes, collected every
`FIRST_THRESHOLD` net allocations instead of every 700.
"""

from __future__ import annotations

import gc

FIRST_THRESHOLD = 10_000  # net allocations between young passes (CPython's default: 700)


def settle() -> None:
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(FIRST_THRESHOLD, second, third)
