"""One team's slow upstream name lookups do not hold another team's connections, through the proxy."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as Pending
from urllib.parse import urlsplit

import openai

from gateway import serving
from gateway.testing import running_proxy
from tests.helpers import write_policy

SLOW = "slow-dns.test"


def test_a_teams_slow_name_lookups_do_not_hold_another_teams_connections(tmp_path, monkeypatch, fresh_emulator):
    """A new upstream connection looked its provider's name up with getaddrinfo in asyncio's default
    thread pool (uvloop: in libuv's four threads; a few threads, first come, first served, shared with
    every `to_thread` caller), one
    lookup per connection, and a lookup cannot be cancelled: alpha's 40 new connections to a provider
    whose resolver answered slowly took every thread, and beta's connection to another provider waited
    behind them. Here the resolver holds alpha's name until beta has been answered: on the old code
    beta was not answered (every thread held alpha's lookups, one each). Lookups of one name are shared
    now (sdk/providers/dns.py), in threads of their own: one for alpha's 40, and beta's runs at once."""
    port = urlsplit(fresh_emulator.url).port
    write_policy(tmp_path, "alpha", "sk-alpha", f"http://{SLOW}:{port}")
    write_policy(tmp_path, "beta", "sk-beta", f"http://localhost:{port}")
    real = socket.getaddrinfo
    answer = threading.Event()
    asked: list[str] = []

    def resolver(host, *args, **kwargs):  # the network's edge: a resolver slow to answer for one name
        asked.append(host)
        if host == SLOW:
            answer.wait(60)
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    # uvloop (the server's loop) looks names up in libuv's threads, out of this resolver's reach, and those
    # are a pool of four, first come, first served, as asyncio's default pool is: the test serves on
    # asyncio's loop, whose lookups the resolver sees, to show the old queue.
    monkeypatch.setitem(serving.SERVER_OPTIONS, "loop", "asyncio")
    with running_proxy([tmp_path], watch_interval_s=None) as proxy, ThreadPoolExecutor(48) as pool:
        alpha = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-alpha", max_retries=0, timeout=60)
        beta = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-beta", max_retries=0, timeout=60)

        def ask(client: openai.OpenAI) -> str:
            return client.chat.completions.create(model="gpt-4o", max_tokens=4, messages=[{"role": "user", "content": "Hi?"}]).id

        alphas = [pool.submit(ask, alpha) for _ in range(40)]
        deadline = time.monotonic() + 30  # a hang guard, not a timing bound
        while SLOW not in asked:
            assert time.monotonic() < deadline, "alpha's lookups never started"
            time.sleep(0.005)
        time.sleep(0.3)  # let alpha's other requests reach their connections
        betas = pool.submit(ask, beta)
        try:
            answered = bool(betas.result(timeout=15))
        except Pending:
            answered = False
        finally:
            held = not answer.is_set()
            lookups = asked.count(SLOW)
            answer.set()
        assert all(future.result() for future in alphas)
        assert betas.result()
    assert answered and held  # beta was answered while alpha's name was still being looked up
    assert lookups == 1  # alpha's 40 connections shared one lookup (one each, a thread each, before)
