"""Pass-through isolation (issue 25): teams that share one provider key (the emulator's `up-openai`
/ `up-anthropic`) neither see, read, use nor delete each other's files, batches and message
batches, through the proxy, the drop-in SDK, and two proxies over Redis; the pass-through runs
through the same limits, budget, routes and spend as the pipeline; and its protocol edges (dot
segments, encoded traversal, `Expect: 100-continue`, forwarding headers, upstream 401s) hold."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import orjson
import pytest

import sdk
from gateway.testing import RedisServer, RunningServer, running_proxy, running_redis
from sdk.observability import access_log
from sdk.spend import price_of
from tests.helpers import anth, oai, spend_report, upstream, wait_until, write_policy

A, B = "sk-alpha-team", "sk-beta-team"
# USD per million tokens: cents per call, so a spend report's 6 decimals show every token
PRICED = 'pricing: {"gpt-3.5-*": {input: 1000, output: 1000}, "gpt-4o-mini": {input: 1000, output: 2000}}\n'
MSG = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}


def line(cid: str, model: str = "gpt-4o-mini") -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": model, "messages": [{"role": "user", "content": cid}], "max_tokens": 8}})


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, emulator) -> Path:
    directory = tmp_path_factory.mktemp("isolation")
    write_policy(directory, "alpha", A, emulator.url, extra=PRICED)
    write_policy(directory, "beta", B, emulator.url)
    write_policy(directory, "broke", "sk-broke", emulator.url, extra=PRICED + "budget: {usd: 0.001, period: day}\n")
    write_policy(directory, "limited", "sk-limited", emulator.url, extra="limits: {per_key: {requests_per_minute: 5}}\n")
    write_policy(directory, "gone", "sk-gone", "http://127.0.0.1:9")  # nothing listens on the discard port
    write_policy(directory, "careful", "sk-careful", emulator.url, extra=PRICED + "budget: {usd: 100, period: day}\n")
    write_policy(directory, "frugal", "sk-frugal", emulator.url, extra="budget: {usd: 0.03, period: day}\n")
    return directory


def assert_files_isolated(mine: openai.OpenAI, theirs: openai.OpenAI) -> None:
    """`theirs` cannot list, read, download, use or delete a file `mine` uploaded."""
    secret = mine.files.create(file=("secret.jsonl", b"BETA CONFIDENTIAL " + uuid.uuid4().bytes.hex().encode()), purpose="user_data")
    own = theirs.files.create(file=("own.txt", b"ALPHA"), purpose="user_data")
    assert secret.id not in [f.id for f in theirs.files.list()] and own.id in [f.id for f in theirs.files.list()]
    assert own.id not in [f.id for f in mine.files.list()]
    for attempt in (lambda: theirs.files.retrieve(secret.id), lambda: theirs.files.content(secret.id),
                    lambda: theirs.files.delete(secret.id),
                    lambda: theirs.batches.create(input_file_id=secret.id, endpoint="/v1/chat/completions", completion_window="24h")):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.body["message"] == f"No such File object: {secret.id}"  # as for an id that never was
    with pytest.raises(openai.NotFoundError) as made_up:
        theirs.files.retrieve("file-madeup")
    assert made_up.value.body["message"] == "No such File object: file-madeup"
    assert mine.files.content(secret.id).read().startswith(b"BETA CONFIDENTIAL")  # still there: nothing deleted
    assert mine.files.delete(secret.id).deleted


def test_files_belong_to_the_team_that_uploaded_them(proxy, policy_dir, fresh_emulator):
    assert_files_isolated(oai(proxy, B), oai(proxy, A))
    # the drop-in SDK is the same door: a team's in-process client against the proxy's other team
    assert_files_isolated(oai(proxy, B), sdk.OpenAI(policy=policy_dir / "alpha.yaml", max_retries=0))
    assert_files_isolated(sdk.OpenAI(policy=policy_dir / "beta.yaml", max_retries=0), oai(proxy, A))
    team_keys = [r for r in fresh_emulator.app.state.recent if A in str(r["headers"]) or B in str(r["headers"])]
    assert team_keys == []  # the provider only ever saw the shared provider key


def test_batches_and_their_outputs_belong_to_their_team(proxy, fresh_emulator):
    alpha, beta = oai(proxy, A), oai(proxy, B)
    source = alpha.files.create(file=("in.jsonl", line("one") + b"\n" + line("two") + b"\n"), purpose="batch")
    batch = alpha.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_until(lambda: (b := alpha.batches.retrieve(batch.id)).status == "completed" and b, "the batch completes")
    assert batch.id in [b.id for b in alpha.batches.list()] and batch.id not in [b.id for b in beta.batches.list()]
    for attempt in (lambda: beta.batches.retrieve(batch.id), lambda: beta.batches.cancel(batch.id)):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.body["message"] == f"No batch found with id '{batch.id}'."
    with pytest.raises(openai.NotFoundError):
        beta.files.content(done.output_file_id)  # another team's batch output
    assert done.output_file_id not in [f.id for f in beta.files.list()]
    before = spend(proxy, A)
    lines = [json.loads(x) for x in alpha.files.content(done.output_file_id).text.splitlines()]
    usage = [x["response"]["body"]["usage"] for x in lines]
    # the team's price for gpt-4o-mini at batch rates: half
    expected = sum(u["prompt_tokens"] * 1000 + u["completion_tokens"] * 2000 for u in usage) / 1e6 * 0.5
    charged = wait_until(lambda: (s := spend(proxy, A)).get("gpt-4o-mini", 0) > before.get("gpt-4o-mini", 0) and s, "batch spend")
    assert charged["gpt-4o-mini"] - before.get("gpt-4o-mini", 0) == pytest.approx(expected)
    alpha.files.content(done.output_file_id).read()  # read again: charged once
    assert spend(proxy, A)["gpt-4o-mini"] == pytest.approx(charged["gpt-4o-mini"])


def spend(proxy: RunningServer, key: str) -> dict[str, float]:
    return spend_report(proxy, key)["day"]["by_model"]


@pytest.mark.parametrize("door", ["proxy", "drop-in"])
def test_message_batches_belong_to_their_team_and_results_come_back_through_the_gateway(proxy, policy_dir, fresh_emulator, door):
    beta = anth(proxy, B)
    if door == "proxy":
        alpha, origin = anth(proxy, A), proxy.url
    else:
        alpha, origin = sdk.Anthropic(policy=policy_dir / "alpha.yaml", max_retries=0), "http://slipstream.invalid"
    batch = alpha.messages.batches.create(requests=[{"custom_id": "a", "params": MSG}])
    ended = wait_until(lambda: (b := alpha.messages.batches.retrieve(batch.id)).processing_status == "ended" and b, "ended")
    assert ended.results_url == f"{origin}/v1/messages/batches/{batch.id}/results"
    fresh_emulator.app.state.recent.clear()
    results = list(alpha.messages.batches.results(batch.id))  # follows results_url: through the gateway
    assert [r.custom_id for r in results] == ["a"] and results[0].result.type == "succeeded"
    fetched = upstream(fresh_emulator, f"{batch.id}/results")
    assert fetched and all(dict(r["headers"]).get("x-api-key") == "up-anthropic" for r in fetched)
    assert batch.id not in [b.id for b in beta.messages.batches.list()]
    for attempt in (lambda: beta.messages.batches.retrieve(batch.id), lambda: list(beta.messages.batches.results(batch.id)),
                    lambda: beta.messages.batches.cancel(batch.id), lambda: beta.messages.batches.delete(batch.id)):
        with pytest.raises(anthropic.NotFoundError) as refused:
            attempt()
        assert refused.value.body["error"]["message"] == f"message_batch: {batch.id} not found"
    alpha.messages.batches.delete(batch.id)  # still alpha's to delete
    with pytest.raises(anthropic.NotFoundError):
        alpha.messages.batches.retrieve(batch.id)


def test_batch_rates_halve_a_batchs_tokens_not_its_searches(proxy, fresh_emulator):
    """Both providers bill a batch's tokens at half price; a web search it runs is billed in full ($10
    per 1,000). The gateway halved the search fees with the tokens, when it charged the results and
    when it checked a batch's worst case against the budget: a budgeted team's batch of searches was
    admitted and charged at half what the shared account paid for them."""
    params = {**MSG, "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]}
    sent = fresh_emulator.stats()["requests_total"]
    # Five requests, a search each: $0.05 of searches in full and each line's tokens at batch rates (its search
    # loop: the prompt read twice and the search's results, docs/spend.md), past a $0.03 budget (admitted before,
    # as $0.0257, when the searches were halved too).
    with pytest.raises(anthropic.RateLimitError, match=r"team frugal's batch at batch rates may cost up to \$0\.2009"):
        anth(proxy, "sk-frugal").messages.batches.create(requests=[{"custom_id": f"s{i}", "params": params} for i in range(5)])
    assert fresh_emulator.stats()["requests_total"] == sent  # refused before anything was sent
    alpha = anth(proxy, A)
    batch = alpha.messages.batches.create(requests=[{"custom_id": "s", "params": params}])
    wait_until(lambda: alpha.messages.batches.retrieve(batch.id).processing_status == "ended", "ended")
    before = spend(proxy, A).get(MSG["model"], 0.0)
    usage = next(iter(alpha.messages.batches.results(batch.id))).result.message.usage  # type: ignore[union-attr]
    assert usage.server_tool_use is not None and usage.server_tool_use.web_search_requests == 1
    price = price_of(MSG["model"], {})
    assert price is not None
    tokens = (usage.input_tokens * price.input + usage.output_tokens * price.output) / 1e6
    charged = wait_until(lambda: (now := spend(proxy, A).get(MSG["model"], 0.0)) > before and now, "the results charged")
    assert charged - before == pytest.approx(tokens * 0.5 + price.web_search / 1000, abs=2e-6)  # the search in full
    alpha.messages.batches.delete(batch.id)  # the module's later list pages hold alpha's own batches only


def test_a_team_among_many_on_one_key_still_gets_full_list_pages(proxy):
    alpha, beta = anth(proxy, A), anth(proxy, B)
    mine = alpha.messages.batches.create(requests=[{"custom_id": "a", "params": MSG}]).id
    theirs = [beta.messages.batches.create(requests=[{"custom_id": f"b{i}", "params": MSG}]).id for i in range(5)]
    first = alpha.messages.batches.list(limit=2)  # the provider's first pages hold only beta's (newest first)
    assert [b.id for b in first.data] == [mine]  # not an empty page, at which the official client would stop
    assert mine in [b.id for b in alpha.messages.batches.list(limit=1)]
    assert set(theirs) <= {b.id for b in beta.messages.batches.list(limit=3)}  # auto-paging the team's own


def test_a_model_outside_the_team_routes_never_reaches_the_provider(proxy, fresh_emulator):
    alpha = oai(proxy, A)
    with pytest.raises(openai.NotFoundError) as refused:
        alpha.completions.create(model="davinci-002", prompt="x", max_tokens=4)
    assert "no route for model 'davinci-002'" in refused.value.body["message"]
    source = alpha.files.create(file=("in.jsonl", line("ok") + b"\n" + line("sneaky", "davinci-002") + b"\n"), purpose="batch")
    with pytest.raises(openai.NotFoundError, match="davinci-002"):
        alpha.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(anthropic.NotFoundError, match="llama-3"):
        anth(proxy, A).messages.batches.create(requests=[{"custom_id": "a", "params": MSG},
                                                         {"custom_id": "b", "params": {**MSG, "model": "llama-3"}}])
    assert upstream(fresh_emulator, "/completions") == [] and upstream(fresh_emulator, "batches") == []


def test_budget_limits_and_spend_hold_on_the_pass_through(proxy, fresh_emulator, capsys):
    access_log.configure("json")
    try:
        broke = oai(proxy, "sk-broke")
        first = broke.completions.with_raw_response.create(model="gpt-3.5-turbo-instruct", prompt="Once", max_tokens=8)
        usage = first.parse().usage
        assert spend(proxy, "sk-broke")["gpt-3.5-turbo-instruct"] == pytest.approx(usage.total_tokens * 1000 / 1e6)
        source = broke.files.create(file=("in.jsonl", line("x") + b"\n"), purpose="batch")  # no model runs: allowed
        for attempt in (lambda: broke.completions.create(model="gpt-3.5-turbo-instruct", prompt="Again", max_tokens=8),
                        lambda: broke.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")):
            with pytest.raises(openai.RateLimitError, match="budget"):
                attempt()
        with pytest.raises(anthropic.RateLimitError, match="budget"):
            anth(proxy, "sk-broke").messages.batches.create(requests=[{"custom_id": "a", "params": MSG}])
        access_log.flush()  # lines are written by the access log's thread
        records = [orjson.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    finally:
        access_log.configure("off")
    assert len(upstream(fresh_emulator, "/completions")) == 1 and upstream(fresh_emulator, "batches") == []
    logged = [r for r in records if r["team"] == "broke"]
    assert [(r["endpoint"], r["status"]) for r in logged] == [
        ("passthrough:completions", 200), ("passthrough:files", 200), ("passthrough:completions", 429),
        ("passthrough:batches", 429), ("passthrough:messages_batches", 429)]
    assert logged[0]["request_id"] == first.headers["x-slipstream-request-id"] and logged[0]["output_tokens"] == 8
    assert "sk-broke" not in str(records)


def test_a_budgeted_team_cannot_pass_through_a_model_without_a_price(proxy, fresh_emulator):
    careful = oai(proxy, "sk-careful")
    assert careful.completions.create(model="gpt-3.5-turbo-instruct", prompt="x", max_tokens=2).usage.total_tokens
    for attempt in (lambda: careful.completions.create(model="gpt-unpriced", prompt="x", max_tokens=2),
                    lambda: careful.batches.create(input_file_id=careful.files.create(
                        file=("in.jsonl", line("x", "gpt-unpriced") + b"\n"), purpose="batch").id,
                        endpoint="/v1/chat/completions", completion_window="24h")):
        with pytest.raises(openai.PermissionDeniedError, match="pricing"):
            attempt()
    with pytest.raises(anthropic.PermissionDeniedError, match="pricing"):
        anth(proxy, "sk-careful").messages.batches.create(requests=[{"custom_id": "a", "params": {**MSG, "model": "claude-unpriced"}}])
    assert len(upstream(fresh_emulator, "/completions")) == 1 and upstream(fresh_emulator, "batches") == []


def test_a_streamed_completion_is_charged_from_its_usage_chunk(proxy, capsys):
    alpha = oai(proxy, A)
    before = spend(proxy, A).get("gpt-3.5-turbo-instruct", 0.0)
    chunks = list(alpha.completions.create(model="gpt-3.5-turbo-instruct", prompt="Once", max_tokens=4, stream=True,
                                           stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 4
    after = wait_until(lambda: (s := spend(proxy, A).get("gpt-3.5-turbo-instruct", 0.0)) > before and s, "the stream's spend")
    assert after - before == pytest.approx(usage.total_tokens * 1000 / 1e6)
    # without include_usage the gateway asks for the usage chunk itself and takes it out of the stream: charged
    # exactly too (before: its worst case, the prompt counted and all of max_tokens, marked estimated)
    access_log.configure("json")
    try:
        streamed = list(alpha.completions.create(model="gpt-3.5-turbo-instruct", prompt="Once", max_tokens=4, stream=True))
        last = wait_until(lambda: (s := spend(proxy, A).get("gpt-3.5-turbo-instruct", 0.0)) > after and s, "the stream's spend")
        access_log.flush()  # lines are written by the access log's thread
        records = [orjson.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    finally:
        access_log.configure("off")
    assert len(streamed) > 1 and all(chunk.choices and chunk.usage is None for chunk in streamed)
    assert last - after == pytest.approx(usage.total_tokens * 1000 / 1e6)
    assert records[-1].get("usage") != "estimated" and records[-1]["output_tokens"] == 4


def test_the_per_key_rate_limit_is_the_pipelines(proxy, fresh_emulator):
    limited = oai(proxy, "sk-limited")
    statuses = []
    for _ in range(12):
        try:
            limited.completions.create(model="gpt-3.5-turbo-instruct", prompt="x", max_tokens=2)
            statuses.append(200)
        except openai.RateLimitError as exc:
            assert "rate limit: key" in exc.body["message"] and exc.response.headers["retry-after"]
            statuses.append(429)
    assert statuses == [200] * 5 + [429] * 7
    with pytest.raises(openai.RateLimitError):  # the same bucket as the pipeline's
        limited.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert len(upstream(fresh_emulator, "/completions")) == 5


@pytest.mark.parametrize("path", ["/v1/files/../chat/completions", "/v1/files/%2e%2e/chat/completions",
                                  "/v1/files/x%2f..%2f..%2fchat%2fcompletions", "/v1/files//content", "/v1/batches/./b/cancel",
                                  "/v1/messages/batches/%2E%2E"])
def test_traversal_is_refused_before_anything_leaves(proxy, fresh_emulator, path):
    status, head, body = raw_request(proxy, f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {A}\r\ncontent-length: 2\r\n\r\n{{}}")
    # the gateway's own 400: forwarded, it came back as the provider's "Unknown request URL" with an x-slipstream-route
    assert status == 400 and b"not allowed in this path" in body and b"x-slipstream-route" not in head.lower()
    assert list(fresh_emulator.app.state.recent) == []


def raw_request(proxy: RunningServer, head: str, then: bytes = b"") -> tuple[int, bytes, bytes]:
    """One request on a raw socket, as curl would send it (no client normalizes the path)."""
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        if then:
            interim = sock.recv(65536)
            assert interim.startswith(b"HTTP/1.1 100"), interim  # asked to go on before the body
            sock.sendall(then)
        data = b""
        while not _complete(data):
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
    head_part, _, body = data.partition(b"\r\n\r\n")
    return int(head_part.split()[1]), head_part, body


def _complete(data: bytes) -> bool:
    """The whole answer is in: its content-length read, or a chunked body's last chunk (else the
    connection's close, after the server's keep-alive timeout, ends the read)."""
    head, found, body = data.partition(b"\r\n\r\n")
    if not found:
        return False
    for header in head.split(b"\r\n")[1:]:
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
        if name.strip().lower() == b"transfer-encoding" and value.strip().lower() == b"chunked":
            return body.endswith(b"0\r\n\r\n")
    return False


def test_expect_continue_and_forwarding_headers(proxy, fresh_emulator):
    body = json.dumps({"model": "gpt-3.5-turbo-instruct", "prompt": "x", "max_tokens": 2}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: gw.example\r\nauthorization: Bearer {A}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nexpect: 100-continue\r\nx-forwarded-for: 10.0.0.9\r\nforwarded: for=10.0.0.9\r\n"
            "via: 1.1 lb\r\nx-real-ip: 10.0.0.9\r\nconnection: keep-alive, x-hop\r\nx-hop: secret\r\n\r\n")
    status, _, answer = raw_request(proxy, head, body)
    assert status == 200 and json.loads(answer)["object"] == "text_completion"  # the final answer, not the interim 100
    (sent,) = upstream(fresh_emulator, "/completions")
    names = {name.lower() for name, _ in dict(sent["headers"]).items()}
    assert not names & {"expect", "x-forwarded-for", "forwarded", "via", "x-real-ip", "x-hop"}


def test_an_upstream_401_that_echoes_the_key_is_replaced(proxy, policy_dir, fresh_emulator, monkeypatch):
    monkeypatch.setattr(fresh_emulator.app.config, "api_keys", frozenset({"another-key"}))
    for client in (oai(proxy, A), sdk.OpenAI(policy=policy_dir / "alpha.yaml", max_retries=0)):
        with pytest.raises(openai.AuthenticationError) as refused:
            client.files.list()
        assert "refused the gateway's upstream credentials" in refused.value.body["message"]
        assert "up-" not in str(refused.value.body) and "enai" not in str(refused.value.body)
    for anthropic_client in (anth(proxy, A), sdk.Anthropic(policy=policy_dir / "alpha.yaml", max_retries=0)):
        with pytest.raises(anthropic.AuthenticationError) as refused_a:
            anthropic_client.messages.batches.list()
        assert "refused the gateway's upstream credentials" in str(refused_a.value.body)


def test_an_unreachable_provider_is_named_not_located(proxy, policy_dir):
    for client in (oai(proxy, "sk-gone"), sdk.OpenAI(policy=policy_dir / "gone.yaml", max_retries=0)):
        with pytest.raises(openai.APIStatusError) as failed:
            client.files.list()
        assert failed.value.status_code == 502 and "provider 'gpt'" in failed.value.body["message"]
        assert "127.0.0.1" not in str(failed.value.body) and ":9" not in str(failed.value.body)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    pytest.importorskip("redis")
    with running_redis() as server:
        yield server


def test_two_replicas_over_redis_agree_on_owners(tmp_path, emulator, redis):
    write_policy(tmp_path, "alpha", A, emulator.url)
    write_policy(tmp_path, "beta", B, emulator.url)
    url = f"{redis.url}?prefix=t{uuid.uuid4().hex[:8]}&timeout_ms=500"
    with running_proxy([tmp_path], state_url=url) as one, running_proxy([tmp_path], state_url=url) as two:
        made = oai(one, A).files.create(file=("a.txt", b"ALPHA ONLY"), purpose="user_data")
        assert oai(two, A).files.content(made.id).read() == b"ALPHA ONLY"  # the other replica knows it is alpha's
        assert made.id in [f.id for f in oai(two, A).files.list()]
        with pytest.raises(openai.NotFoundError):
            oai(two, B).files.content(made.id)
        assert made.id not in [f.id for f in oai(two, B).files.list()]
        batch = anth(one, B).messages.batches.create(requests=[{"custom_id": "b", "params": MSG}])
        with pytest.raises(anthropic.NotFoundError):
            anth(two, A).messages.batches.retrieve(batch.id)
        assert anth(two, B).messages.batches.retrieve(batch.id).id == batch.id
        oai(two, A).files.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            oai(one, A).files.retrieve(made.id)  # deleted on one replica: gone on the other


def test_a_pass_through_model_is_held_to_the_pipelines_rules(tmp_path, fresh_emulator):
    """The pass-through checked only that some route matched a model, then sent the name as written to
    the team's first provider of its kind: a model the policy renames (`gpt-4o` runs `gpt-4o-mini` for
    this team) or sends to another provider ran as named on the account every team shares, and a name
    the pipeline refuses at its door (a line break in it, 300 characters) went upstream and into the
    access log. Now such a name is a 400, and a model whose route does not send it as named to that
    provider a 404, both before anything is sent."""
    (tmp_path / "steered.yaml").write_text(f"""team: steered
api_keys: [{{value: "sk-steered"}}]
providers:
  claude: {{kind: anthropic, base_url: "{fresh_emulator.url}", api_key: "up-anthropic"}}
  gpt: {{kind: openai, base_url: "{fresh_emulator.url}/v1", api_key: "up-openai"}}
routes:
  - match: {{model: "gpt-4o"}}
    targets: [{{provider: gpt, model: gpt-4o-mini}}]
  - match: {{model: "davinci-*"}}
    targets: [{{provider: claude, model: claude-haiku-4-5}}]
  - match: {{model: "*"}}
    targets: [{{provider: gpt}}]
""")
    with running_proxy([tmp_path]) as proxy:
        steered = oai(proxy, "sk-steered")
        assert steered.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4).model.startswith("gpt-4o-mini")  # what its policy runs
        assert steered.completions.create(model="gpt-3.5-turbo-instruct", prompt="x", max_tokens=2).usage.total_tokens
        for renamed in ("gpt-4o", "davinci-002"):
            with pytest.raises(openai.NotFoundError, match="does not send model"):
                steered.completions.create(model=renamed, prompt="x", max_tokens=2)
        for odd in ("gpt-x\ninjected", "gpt-" + "x" * 300):
            with pytest.raises(openai.BadRequestError, match="model"):
                steered.completions.create(model=odd, prompt="x", max_tokens=2)
        source = steered.files.create(file=("in.jsonl", line("ok") + b"\n" + line("big", "gpt-4o") + b"\n"), purpose="batch")
        with pytest.raises(openai.NotFoundError, match="gpt-4o"):
            steered.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    sent = [orjson.loads(r["body"])["model"] for r in upstream(fresh_emulator, "/completions") if "chat" not in r["path"]]
    assert sent == ["gpt-3.5-turbo-instruct"] and upstream(fresh_emulator, "batches") == []  # before: gpt-4o, davinci-002, the odd names, a batch


def test_a_batch_input_file_is_checked_a_part_at_a_time(proxy, fresh_emulator, monkeypatch):
    """Creating a batch reads its input file back from the provider to check what its lines run. Every
    line was parsed and held, then checked in one pass on the event loop every team shares: a file
    may be as large as the team's upload limit (512 MiB by default), gigabytes of parsed lines and
    seconds of the loop. Its lines are checked a part at a time as they arrive now, and let go."""
    import sdk.passthrough as passthrough

    seen: list[int] = []
    check = passthrough.check_account_objects

    def counted(objects, bodies):
        bodies = list(bodies)
        seen.append(len(bodies))
        return check(objects, bodies)

    monkeypatch.setattr(passthrough, "check_account_objects", counted)
    monkeypatch.setattr(passthrough.spends, "check_account_objects", counted)  # the create request's own check
    alpha = oai(proxy, A)
    source = alpha.files.create(file=("in.jsonl", b"\n".join(line(f"r{i}") for i in range(20_000)) + b"\n"), purpose="batch")
    batch = alpha.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.id and seen[0] == 1 and sum(seen[1:]) == 20_000  # the create request, then the file's lines
    assert max(seen[1:]) < 20_000  # before: every line in one part


def test_a_large_message_batch_is_checked_off_the_loop(proxy, fresh_emulator, monkeypatch):
    """A message batch create is read whole (up to the team's upload limit, 512 MiB by default) and
    every request in it walked before anything is sent: the account objects it names, its client ids
    keyed, its models, its worst cost (each request's prompt counted). That ran on the event loop every
    team's requests share, seconds of it for a large batch; a large create is checked in the heavy-work
    pool now, as its team's turn, as a large pipeline request is."""
    from sdk.limits.stage import LimitsStage
    from sdk.offload import TENANT

    ran: set[tuple[str, str]] = set()
    reservation = LimitsStage.reservation

    def recorded(self: LimitsStage, *args: object, **kwargs: object) -> float:
        ran.add((threading.current_thread().name.rsplit("-", 1)[0], TENANT.get()))
        return reservation(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LimitsStage, "reservation", recorded)
    prompt = [{"role": "user", "content": "Summarize the attached minutes. " * 40}]
    requests = [{"custom_id": f"r{i}", "params": {**MSG, "messages": prompt}} for i in range(250)]  # about 330 KB
    assert anth(proxy, A).messages.batches.create(requests=requests).id  # type: ignore[arg-type]
    assert ran == {("slipstream-heavy", "alpha")}  # before: the event loop's thread


def test_each_list_page_read_upstream_counts_against_the_teams_limits(tmp_path, fresh_emulator):
    """A list page shows only the team's own objects, so while the provider's pages hold other teams'
    the gateway reads on, up to ten pages for one request: a team among many on one key made ten
    calls on the account every team shares (and parsed ten pages) for each request its limits
    admitted. Each page after the first is admitted like a request of its own now; here the team's
    four requests a minute cover its upload, the list call and two more pages, then its 429."""
    write_policy(tmp_path, "lister", "sk-lister", fresh_emulator.url, extra="limits: {requests_per_minute: 4}\n")
    write_policy(tmp_path, "crowd", "sk-crowd", fresh_emulator.url)
    with running_proxy([tmp_path]) as proxy:
        lister, crowd = oai(proxy, "sk-lister"), oai(proxy, "sk-crowd")
        lister.files.create(file=("mine.jsonl", line("mine") + b"\n"), purpose="batch")  # the oldest: last in the list
        for i in range(12):
            crowd.files.create(file=(f"theirs-{i}.jsonl", line(f"t{i}") + b"\n"), purpose="batch")
        with pytest.raises(openai.RateLimitError):
            lister.files.list(limit=1)
    pages = [r for r in upstream(fresh_emulator, "/files") if r["method"] == "GET"]
    assert len(pages) == 3  # before: 10, the team's limit of 4 requests a minute notwithstanding
