"""One team's prompt to the in-process local engine does not hold every team's requests.

Rendering the chat template and tokenizing a prompt is seconds of work for a few MiB of text (the
demo model: 3 s for 4 MiB, 15 s for 16 MiB, within the default 32 MiB body limit). It ran on the
event loop, so while it ran no other team's request moved at all.
"""

from __future__ import annotations

import threading
import time

import httpx
import orjson

from gateway.testing import running_proxy
from tests.helpers import PATIENCE_S, requires_extra, write_policy

pytestmark = requires_extra("engine")

KEY_A, KEY_B = "sk-local-alpha", "sk-local-beta"
LOCAL = """  - match: {model: "local-demo"}
    targets: [{provider: local}]
"""
HELLO = [{"role": "user", "content": "hello"}]


def _post(url: str, body: dict, key: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", content=orjson.dumps(body),
                      headers={"authorization": f"Bearer {key}"}, timeout=120)


def _ready(url: str) -> None:
    deadline = time.monotonic() + 4 * PATIENCE_S
    while time.monotonic() < deadline:
        if httpx.get(url + "/readyz").status_code == 200:
            return
        time.sleep(0.2)
    raise AssertionError("the local engine never loaded")


def test_a_large_local_prompt_does_not_hold_other_teams(tmp_path, emulator):
    alpha = write_policy(tmp_path, "alpha", KEY_A, emulator.url, extra="retry: {max_attempts: 1}\n")
    text = alpha.read_text().replace("providers:\n", "providers:\n  local: {kind: local, model: demo}\n")
    alpha.write_text(text.replace("routes:\n", "routes:\n" + LOCAL))
    write_policy(tmp_path, "beta", KEY_B, emulator.url, extra="retry: {max_attempts: 1}\n")
    # 8 MiB of prompt: far past the demo model's context, refused only once it is tokenized.
    large = {"model": "local-demo", "max_tokens": 4,
             "messages": [{"role": "user", "content": "hello world lorem ipsum " * (8 * 1024 * 1024 // 24)}]}
    answered: list[tuple[float, float]] = []  # team beta's requests: (sent, answered)
    done = threading.Event()
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        _ready(proxy.url)

        def probe() -> None:
            while not done.is_set():
                sent = time.perf_counter()
                assert _post(proxy.url, {"model": "gpt-4o", "messages": HELLO}, KEY_B).status_code == 200
                answered.append((sent, time.perf_counter()))

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            started = time.perf_counter()
            refused = _post(proxy.url, large, KEY_A)
            ended = time.perf_counter()
        finally:
            done.set()
            prober.join()
    assert refused.status_code == 400 and "context length" in refused.json()["error"]["message"]
    # Events, not durations: how many of beta's requests were sent and answered while alpha's was in
    # the gateway. With the tokenizing on the loop, none could be once it had begun.
    inside = [pair for pair in answered if pair[0] > started and pair[1] < ended]
    assert len(inside) >= 10, f"team beta got {len(inside)} answers during alpha's {ended - started:.1f}s request"


def test_a_local_token_count_is_its_teams_turn_in_the_heavy_work_pool(tmp_path, emulator, monkeypatch):
    """Counting a prompt for the in-process engine (count_tokens, a translated count) renders its chat
    template and tokenizes it, seconds for a few MiB. It ran in asyncio's default thread pool, first
    come, first served, which policy reloads, `/metrics` and the shared cache's replication use too:
    one team's many large counts held every other team's, and those. It is the team's turn in the
    heavy-work pool now, where the teams take turns."""
    import anthropic

    from localengine import serving_chat
    from sdk.offload import TENANT

    ran: list[tuple[str, str]] = []
    count = serving_chat.prompt_token_ids

    def recorded(*args, **kwargs):
        ran.append((threading.current_thread().name.rsplit("-", 1)[0], TENANT.get()))
        return count(*args, **kwargs)

    monkeypatch.setattr(serving_chat, "prompt_token_ids", recorded)
    alpha = write_policy(tmp_path, "alpha", KEY_A, emulator.url)
    text = alpha.read_text().replace("providers:\n", "providers:\n  local: {kind: local, model: demo}\n")
    alpha.write_text(text.replace("routes:\n", "routes:\n" + LOCAL))
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        _ready(proxy.url)
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY_A, max_retries=0)
        assert client.messages.count_tokens(model="local-demo", messages=HELLO).input_tokens > 0
    assert [r for r in ran if r[1] == "alpha"] == [("slipstream-heavy", "alpha")]  # before: asyncio's default pool (uvloop_1)
