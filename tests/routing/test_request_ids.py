"""Every answer names its request: `x-slipstream-request-id` on the gateway's own errors too, through
the proxy and the drop-in SDK, and the access log names the route of an upstream error answer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

import sdk
from gateway.testing import running_proxy
from sdk.observability import access_log
from tests.routing.conftest import inject

KEY = "sk-ids"
HEADER = "x-slipstream-request-id"
HELLO = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def _policy(emulator_url: str) -> str:
    return f"""team: ids
api_keys: [{{value: "{KEY}"}}]
providers:
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai"}}
routes:
  - match: {{model: "gpt-*"}}
    targets: [{{provider: gpt}}]
retry: {{max_attempts: 1}}
limits: {{max_body_bytes: 2000, requests_per_minute: 5}}
"""


@pytest.fixture(scope="module")
def policy(tmp_path_factory, emulator):
    path = tmp_path_factory.mktemp("ids") / "ids.yaml"
    path.write_text(_policy(emulator.url))
    return path


@pytest.fixture
def proxy(policy) -> Iterator[str]:
    with running_proxy([policy.parent], watch_interval_s=None) as running:
        yield running.url


@pytest.fixture
def access(caplog):
    access_log.configure("json")
    yield caplog
    access_log.configure("off")


def _records(caplog) -> list[dict]:
    return [r.msg for r in caplog.records if r.name == "slipstream.access" and isinstance(r.msg, dict)]


def test_the_proxy_names_every_answer_its_own_errors_included(proxy, fresh_emulator):
    auth = {"authorization": f"Bearer {KEY}"}
    answers = {
        400: httpx.post(f"{proxy}/v1/chat/completions", content=b"{not json", headers=auth),
        401: httpx.post(f"{proxy}/v1/chat/completions", json=HELLO, headers={"authorization": "Bearer wrong"}),
        404: httpx.get(f"{proxy}/v1/no-such-path", headers=auth),
        413: httpx.post(f"{proxy}/v1/chat/completions", json={**HELLO, "pad": "x" * 4000}, headers=auth),
        431: httpx.get(f"{proxy}/v1/models", headers={**auth, "x-big": "a" * 70_000}),  # the edge's, before the app
        200: httpx.get(f"{proxy}/v1/models", headers=auth),
    }
    for _ in range(6):  # past the team's 5 requests a minute
        last = httpx.post(f"{proxy}/v1/chat/completions", json=HELLO, headers=auth)
    answers[429] = last
    ids = set()
    for status, response in answers.items():
        assert response.status_code == status, response.text
        assert len(response.headers[HEADER]) == 16, status
        ids.add(response.headers[HEADER])
    assert len(ids) == len(answers)  # one per answer
    for path in ("/healthz", "/readyz", "/metrics", "/ui"):  # the app's own pages, beside the door core
        page = httpx.get(f"{proxy}{path}", headers=auth)
        assert len(page.headers[HEADER]) == 16 and page.headers[HEADER] not in ids, path


def test_an_upstream_error_is_logged_with_its_route_and_the_id_it_carries(proxy, fresh_emulator, access):
    inject(fresh_emulator, "500")
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(**HELLO)
    headers = failed.value.response.headers
    [record] = _records(access)
    assert record["status"] == 500 and record["route"] == headers["x-slipstream-route"] == "gpt/gpt-4o"
    assert record["request_id"] == headers[HEADER]


def test_the_drop_in_names_its_own_errors(policy, fresh_emulator, access):
    client = sdk.OpenAI(policy=policy, max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="claude-x", messages=HELLO["messages"])  # no route for it
    with pytest.raises(openai.APIStatusError) as large:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x" * 4000}])
    assert large.value.status_code == 413
    ids = [missing.value.response.headers[HEADER], large.value.response.headers[HEADER]]
    assert all(len(i) == 16 for i in ids) and ids[0] != ids[1]
    records = _records(access)
    assert [r["request_id"] for r in records if r["status"] == 404] == ids[:1]  # the log names the same request
