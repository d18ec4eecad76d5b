"""Issue 14's findings, one test each, against a real proxy in front of the emulator.

Availability (nothing stalls the loop), correctness (malformed input is a provider-shaped 4xx, an
unexpected exception a logged and counted provider-shaped 500), isolation and secrets (keys,
credentials and prompt text stay where they belong), and the smaller ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from statistics import median

import httpx
import openai
import orjson
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import RunningServer, free_port, running_proxy
from tests.helpers import bound_from, spend_report, write_policy

KEY_A, KEY_B = "sk-hard-alpha", "sk-hard-beta"
ALPHA = "prompt_cache: {enabled: true, reorder: true}\nretry: {max_attempts: 1}\n"
CROSS = """  - match: {model: "to-claude"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]
  - match: {model: "named-model"}
    targets: [{provider: gpt, model: gpt-4o}]
"""
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("hardening")
    alpha = write_policy(directory, "alpha", KEY_A, emulator.url, extra=ALPHA)
    alpha.write_text(alpha.read_text().replace("routes:\n", "routes:\n" + CROSS, 1))
    write_policy(directory, "beta", KEY_B, emulator.url, extra="retry: {max_attempts: 1}\n")
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running


def _post(proxy: RunningServer, path: str, body: object, key: str = KEY_A, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(proxy.url + path, content=content, headers={"authorization": f"Bearer {key}", **headers}, timeout=30)


def _openai_error(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["type"]
    return error["message"]


# --- availability -----------------------------------------------------------------------------------


def _seconds(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def test_adversarial_system_prompt_does_not_stall_the_proxy(proxy):
    """A 16 KB system prompt of `req-req-…` took ~13 s in the volatility scan, on the loop; now milliseconds."""
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "req-" * 4096}, *HELLO]}
    # The same request with a system prompt of the same size and nothing adversarial, and /healthz,
    # measured just before under the same load: the bounds below are relative to them.
    plain = {"model": "gpt-4o", "messages": [{"role": "system", "content": "Be terse. " * 1638}, *HELLO]}
    baseline = median(_seconds(lambda: _post(proxy, "/v1/chat/completions", plain)) for _ in range(3))
    healthz = median(_seconds(lambda: httpx.get(f"{proxy.url}/healthz", timeout=30)) for _ in range(5))
    stalls: list[float] = []

    def probe() -> None:
        for _ in range(20):
            started = time.perf_counter()
            httpx.get(f"{proxy.url}/healthz", timeout=30)
            stalls.append(time.perf_counter() - started)
            time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.perf_counter()
    assert _post(proxy, "/v1/chat/completions", body).status_code == 200
    took = time.perf_counter() - started
    prober.join()
    assert took < bound_from(baseline, floor_s=5.0), f"the adversarial request took {took:.1f}s (a plain one {baseline:.3f}s)"
    assert max(stalls) < bound_from(healthz, floor_s=3.0), f"/healthz waited {max(stalls):.2f}s behind it ({healthz:.3f}s alone)"


def test_large_requests_do_not_stall_other_teams(tmp_path, emulator):
    """Two 6 MB system prompts that differ only at the end: tokenizing them and naming the miss cause
    (a character loop over the common prefix) ran on the loop for seconds; now that work is bounded
    or in a worker thread, and another team's small requests keep being answered.

    Team alpha's provider is a closed port, so its requests end right after Slipstream's own work:
    the emulator (in this process, sharing its GIL) never spends time on the 6 MB."""
    write_policy(tmp_path, "alpha", KEY_A, f"http://127.0.0.1:{free_port()}", extra=ALPHA)
    write_policy(tmp_path, "beta", KEY_B, emulator.url, extra="retry: {max_attempts: 1}\n")
    prompt = "All shipments are logged with their weight and route. " * 110_000
    stalls: list[float] = []
    done = threading.Event()
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        small = {"model": "gpt-4o", "messages": HELLO}
        alone = median(_seconds(lambda: _post(proxy, "/v1/chat/completions", small, key=KEY_B)) for _ in range(5))

        def probe() -> None:
            while not done.is_set():
                started = time.perf_counter()
                assert _post(proxy, "/v1/chat/completions", {"model": "gpt-4o", "messages": HELLO}, key=KEY_B).status_code == 200
                stalls.append(time.perf_counter() - started)
                time.sleep(0.02)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            for ending in ("first", "second", "third"):
                body = {"model": "gpt-4o", "messages": [{"role": "system", "content": prompt + ending}, *HELLO]}
                assert _post(proxy, "/v1/chat/completions", body).status_code == 502  # after all of Slipstream's work
        finally:
            done.set()
            prober.join()
    assert max(stalls) < bound_from(alone, floor_s=2.0), \
        f"team beta waited {max(stalls):.2f}s behind team alpha's large requests ({alone:.3f}s alone)"


def test_metric_labels_come_from_the_policy_only(proxy):
    """Invented model names on a wildcard route are one series (gpt/other), not one series each."""
    for i in range(30):
        assert _post(proxy, "/v1/chat/completions", {"model": f"gpt-invented-{i}", "messages": HELLO}).status_code == 200
    assert _post(proxy, "/v1/chat/completions", {"model": "named-model", "messages": HELLO}).status_code == 200
    text = httpx.get(f"{proxy.url}/metrics").text
    assert "gpt-invented" not in text
    assert 'slipstream_requests_total{route="gpt/other",status="200",team="alpha"}' in text
    assert 'route="gpt/gpt-4o"' in text  # a model the policy names keeps its own label


def test_spend_labels_come_from_the_policy_only(tmp_path, emulator):
    """A priced glob (`gpt-*`) priced every invented model name a wildcard route passes on, and each
    became a `slipstream_spend_usd_total` series for good: a team grew /metrics, which every team's
    operator scrapes, by one series per request."""
    from sdk.observability.metrics import ModelLabels

    write_policy(tmp_path, "labels", "sk-hard-labels", emulator.url, extra='pricing: {"gpt-*": {input: 1, output: 1}}\n')
    with running_proxy([tmp_path], watch_interval_s=None) as running:
        for i in range(ModelLabels.MAX_OTHERS + 8):
            assert _post(running, "/v1/chat/completions", {"model": f"gpt-invented-{i}", "messages": HELLO}, key="sk-hard-labels").status_code == 200
        text = httpx.get(f"{running.url}/metrics").text
        by_model = spend_report(running, "sk-hard-labels")["day"]["by_model"]
    series = [line for line in text.splitlines() if line.startswith("slipstream_spend_usd_total{") and 'team="labels"' in line]
    assert len(series) == ModelLabels.MAX_OTHERS + 1 and any('model="other"' in line for line in series)
    assert len(by_model) == ModelLabels.MAX_OTHERS + 1 and by_model["other"] > 0  # the team's own report: alike


# --- correctness: malformed input is a provider-shaped 4xx -------------------------------------------


@pytest.mark.parametrize("body, expected", [
    # a chat `tool` message without tool_call_id, translated for an Anthropic target: KeyError before
    ({"model": "to-claude", "messages": [*HELLO, {"role": "tool", "content": "42"}]}, "tool_call_id"),
    # a text part whose text is not a string, through the prompt-cache stage and the translator
    ({"model": "to-claude", "messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "text"),
    # model names that break response headers (not Latin-1; CR/LF; NUL)
    ({"model": "gpt-\u0394", "messages": HELLO}, "model"),
    ({"model": "gpt-4o\r\nx-injected: 1", "messages": HELLO}, "model"),
    ({"model": "gpt\x00", "messages": HELLO}, "model"),
])
def test_malformed_bodies_are_provider_shaped_4xx(proxy, body, expected):
    response = _post(proxy, "/v1/chat/completions", body)
    assert 400 <= response.status_code < 500, response.text
    message = _openai_error(response)
    if expected:
        assert expected in message


@pytest.mark.parametrize("text", [None, 7, ["a"], {"a": [1]}])
def test_prompt_cache_stage_takes_non_string_text(proxy, text):
    """A text block whose `text` is not a string (or not hashable) reaches the provider, which refuses it."""
    body = {"model": "claude-x", "max_tokens": 5, "system": [{"type": "text", "text": text}], "messages": HELLO}
    response = _post(proxy, "/v1/messages", body, **{"anthropic-version": "2023-06-01"})
    assert response.status_code == 400, response.text
    assert response.json()["type"] == "error"


@pytest.mark.parametrize("depth", [100, 300, 600])
def test_deeply_nested_json_is_400(proxy, depth):
    raw = b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi","x":' + b"[" * depth + b"]" * depth + b"}]}"
    response = _post(proxy, "/v1/chat/completions", raw)
    assert response.status_code == 400
    assert "nested deeper than 64 levels" in _openai_error(response)


def test_unexpected_exception_is_a_logged_counted_provider_shaped_500(proxy, monkeypatch, caplog):
    from sdk.promptcache.optimizer import Optimizer

    def broken(*args, **kwargs):  # fault injection: a bug inside a stage
        raise RuntimeError("a bug")

    monkeypatch.setattr(Optimizer, "draft", broken)
    with caplog.at_level(logging.ERROR, logger="slipstream.internal"):
        response = _post(proxy, "/v1/messages", {"model": "claude-x", "max_tokens": 5, "messages": HELLO},
                         **{"anthropic-version": "2023-06-01"})
    assert response.status_code == 500
    data = response.json()
    assert data["type"] == "error" and data["error"]["type"] == "api_error"
    request_id = response.headers["x-slipstream-request-id"]
    assert request_id in data["error"]["message"]
    assert any(request_id in record.getMessage() and record.exc_info for record in caplog.records)
    assert 'slipstream_errors_total{kind="internal",team="alpha"}' in httpx.get(f"{proxy.url}/metrics").text


def test_framework_refusals_are_provider_shaped(proxy):
    response = httpx.put(f"{proxy.url}/v1/models", headers={"authorization": f"Bearer {KEY_A}"})
    assert response.status_code == 405
    _openai_error(response)


# --- auth ---------------------------------------------------------------------------------------------


def test_empty_x_api_key_does_not_hide_authorization(proxy):
    headers = {"x-api-key": "", "authorization": f"Bearer {KEY_A}"}  # the empty one first: it used to win
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "gpt-4o", "messages": HELLO}, headers=headers)
    assert response.status_code == 200, response.text


def test_two_different_team_keys_are_refused(proxy):
    response = _post(proxy, "/v1/chat/completions", {"model": "gpt-4o", "messages": HELLO}, **{"x-api-key": KEY_B})
    assert response.status_code == 401
    assert "two different team keys" in _openai_error(response)
    same = _post(proxy, "/v1/chat/completions", {"model": "gpt-4o", "messages": HELLO}, **{"x-api-key": KEY_A})
    assert same.status_code == 200


def test_empty_cache_key_does_not_wipe_the_team_cache(proxy):
    response = httpx.delete(f"{proxy.url}/v1/slipstream/cache?key=", headers={"authorization": f"Bearer {KEY_A}"})
    assert response.status_code == 400
    assert "key: empty" in _openai_error(response)


def test_the_gateways_own_routes_count_against_the_teams_request_limits(tmp_path, emulator):
    """`GET /v1/slipstream/spend`, `/cache-report` and `DELETE /v1/slipstream/cache` reach no provider,
    but each reads the state every team shares (Redis, with replicas) or takes the response cache's
    one lock: they passed no limit, so a team over its requests per minute could go on calling them
    without end (200s before). They are counted like any request now: the team's 429, the same bucket."""
    write_policy(tmp_path, "tight", "sk-tight", emulator.url, extra="limits: {requests_per_minute: 3}\n")
    write_policy(tmp_path, "roomy", "sk-roomy", emulator.url)
    calls = [("GET", "/v1/slipstream/spend"), ("GET", "/v1/slipstream/cache-report"), ("DELETE", "/v1/slipstream/cache")]
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        def call(method: str, path: str, key: str = "sk-tight") -> httpx.Response:
            return httpx.request(method, proxy.url + path, headers={"authorization": f"Bearer {key}"}, timeout=30)

        assert [call(method, path).status_code for method, path in calls] == [200, 200, 200]  # the minute's 3
        for method, path in calls:
            refused = call(method, path)
            assert refused.status_code == 429 and "rate limit: team tight" in _openai_error(refused)
            assert int(refused.headers["retry-after"]) >= 1
        chat = _post(proxy, "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": HELLO}, key="sk-tight")
        assert chat.status_code == 429  # the same bucket as its requests
        assert [call(method, path, "sk-roomy").status_code for method, path in calls] == [200, 200, 200]


def test_metrics_need_the_admin_key_when_one_is_set(tmp_path, emulator, monkeypatch):
    write_policy(tmp_path, "secretive", "sk-secretive", emulator.url)
    monkeypatch.setenv("SLIPSTREAM_ADMIN_KEY", "admin-123")
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        assert httpx.get(f"{proxy.url}/metrics").status_code == 401
        assert httpx.get(f"{proxy.url}/metrics", headers={"authorization": "Bearer sk-secretive"}).status_code == 401
        metrics = httpx.get(f"{proxy.url}/metrics", headers={"authorization": "Bearer admin-123"})
        assert metrics.status_code == 200 and "slipstream_" in metrics.text
        health = httpx.get(f"{proxy.url}/healthz")
        assert health.json() == {"status": "ok"} and "secretive" not in health.text


# --- secrets --------------------------------------------------------------------------------------------


def test_base_url_credentials_never_reach_clients_or_logs(tmp_path, caplog):
    port = free_port()
    write_policy(tmp_path, "creds", "sk-creds", f"http://alice:hunter2@127.0.0.1:{port}", extra="retry: {max_attempts: 1}\n")
    with running_proxy([tmp_path], watch_interval_s=None) as proxy, caplog.at_level(logging.DEBUG):
        response = _post(proxy, "/v1/chat/completions", {"model": "gpt-4o", "messages": HELLO}, key="sk-creds")
    assert response.status_code == 502
    assert "cannot reach provider 'gpt'" in _openai_error(response)  # named by the policy, never located
    assert "hunter2" not in response.text and "alice" not in response.text and "127.0.0.1" not in response.text
    assert "hunter2" not in caplog.text


def test_upstream_auth_errors_do_not_echo_the_provider_key(tmp_path):
    with running_emulator(EmulatorConfig(api_keys=frozenset({"the-right-key"}))) as emu:
        write_policy(tmp_path, "leaky", "sk-leaky", emu.url, upstream_key="sk-upstream-SECRET-9876")
        with running_proxy([tmp_path], watch_interval_s=None) as proxy:
            response = _post(proxy, "/v1/chat/completions", {"model": "gpt-4o", "messages": HELLO}, key="sk-leaky")
    assert response.status_code == 401
    message = _openai_error(response)
    assert "refused the gateway's upstream credentials" in message and "Your team key was accepted" in message
    assert "9876" not in response.text


def test_prompt_text_is_not_logged_at_info(proxy, caplog):
    card = "4111-1111-1111-1111"
    system = f"Customer card token {card}\nrequest_id: 8f3a91c2d4e5 today"
    with caplog.at_level(logging.INFO, logger="slipstream"):
        for i in range(2):  # the second one changes the system prompt: a miss cause is logged too
            messages = [{"role": "system", "content": system + str(i)}, *HELLO]
            assert _post(proxy, "/v1/messages", {"model": "claude-x", "max_tokens": 5, "system": system + str(i), "messages": HELLO},
                         **{"anthropic-version": "2023-06-01"}).status_code == 200
            assert _post(proxy, "/v1/chat/completions", {"model": "gpt-4o", "messages": messages}).status_code == 200
    info = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    assert "volatile request_id" in info  # the finding is still reported...
    assert card not in info and "8f3a91c2" not in info  # ...without the prompt's text


# --- smaller ----------------------------------------------------------------------------------------------


def test_upstream_error_mid_stream_is_counted_as_an_error(tmp_path, fresh_emulator):
    write_policy(tmp_path, "midstream", "sk-mid", fresh_emulator.url)
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        httpx.post(f"{fresh_emulator.url}/_emulator/faults", json={"fault": "midstream_error:events=3", "count": 1}).raise_for_status()
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-mid", max_retries=0)
        with pytest.raises(openai.APIError):
            for _ in client.chat.completions.create(model="gpt-4o", messages=HELLO, stream=True):
                pass
        text = httpx.get(f"{proxy.url}/metrics").text
    assert 'slipstream_errors_total{kind="stream_error",team="midstream"} 1.0' in text
    assert 'status="200",team="midstream"' not in text


def test_head_through_the_pass_through_keeps_the_upstream_connection_sane(proxy):
    """A HEAD answer has a Content-Length and no body: the upstream client waited for that body, and
    the pooled connection then swallowed the next answer (found by the fuzz: a dropped connection)."""
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        for method in ("HEAD", "HEAD", "GET", "HEAD"):
            response = client.request(method, "/v1/batches/batch_1", headers={"x-api-key": KEY_A})
            # the pass-through serves no HEAD now (405, never upstream), and batch_1 is not this team's (404)
            assert response.status_code == (405 if method == "HEAD" else 404), (method, response.text)
