"""A finished request is freed by reference counting, not left for the garbage collector.

A streamed answer's stages hang callbacks off the stream (sdk/streams.on_end) that close over the
stream itself; while those callbacks stayed referenced after firing, every streamed request's
objects sat in a reference cycle until a collector pass found them, and those passes were a fifth of
the proxy's CPU per streamed request (bench/proxy_cpu.py). With the collector off, nothing of a
finished request may be left alive.
"""

from __future__ import annotations

import gc
import subprocess
import sys

import anthropic
import openai
import pytest

from emulator.testing import running_emulator
from gateway.testing import running_proxy
from sdk.types import LLMRequest, LLMStream
from tests.helpers import wait_until, write_policy

KEY = "sk-memory"
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_emulator() as upstream:
        directory = tmp_path_factory.mktemp("memory")
        write_policy(directory, "memory", KEY, upstream.url)
        with running_proxy([directory]) as proxy:
            yield proxy


def _alive() -> list[object]:
    return [thing for thing in gc.get_objects() if isinstance(thing, (LLMStream, LLMRequest))]


def _requests(proxy) -> None:
    oai = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    claude = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    for _ in range(3):
        for _event in oai.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True):
            pass
        with claude.messages.stream(model="claude-sonnet-4-5", max_tokens=64, messages=MESSAGES) as events:
            for _event in events:
                pass
        oai.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    left = oai.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    next(iter(left))
    left.close()  # a client that leaves mid-stream: the stream ends by close(), not by its last event


def test_finished_requests_leave_no_cycles(stack):
    _requests(stack)  # warm: first-use caches and pools are not per request
    gc.collect()
    gc.disable()
    try:
        # Held here, so their ids stay theirs: the warm round's last request may still be finishing
        # on the proxy's thread (and is freed later), which a count taken now would include.
        before = _alive()
        known = {id(thing) for thing in before}
        _requests(stack)
        # The proxy finishes a request on its own thread a moment after the client has read the end.
        wait_until(lambda: not [thing for thing in _alive() if id(thing) not in known], "every request's objects freed")
    finally:
        gc.enable()


def test_a_serving_process_settles_its_collector():
    """`slipstream serve`'s config freezes the start-up heap and raises the young threshold once its
    app is loaded, in each process (a subprocess here: a frozen heap would outlive this test)."""
    code = (
        "import gc\n"
        "from gateway.collector import FIRST_THRESHOLD\n"
        "from gateway.edge import EdgeLimits\n"
        "from gateway.serving import server_config\n"
        "async def app(scope, receive, send): pass\n"
        "default = gc.get_threshold()\n"
        "config = server_config(app, EdgeLimits())\n"
        "config.load()\n"
        "assert gc.get_freeze_count() == 0 and gc.get_threshold() == default, 'a test server is left alone'\n"
        "config = server_config(app, EdgeLimits())\n"
        "config.serving = True  # what run_server sets\n"
        "config.load()\n"
        "assert gc.get_freeze_count() > 10_000 and gc.get_threshold()[0] == FIRST_THRESHOLD\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
