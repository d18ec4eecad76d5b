"""The pass-through's budget holds and prompt-cache keys (issue 25), with teams that share one
provider key (the emulator's `up-openai` / `up-anthropic`):

- parallel `/v1/completions` hold their worst cost while they run, as the pipeline's requests do,
  so together they overshoot a budget by at most one request's reservation (counted in spend
  records and at the emulator, not timed);
- a batch (OpenAI `/v1/batches`, Anthropic `/v1/messages/batches`) is created only if its worst
  cost at batch rates fits in what is left of the team's budget: one that does not is refused with
  the budget's 429 and never reaches the provider; the same batch from a team without a budget runs;
  a created batch is charged its worst cost until its results are read, so batches created together
  or one after another cannot each fit the same remainder;
- a client `prompt_cache_key` in a batch (an uploaded input file's lines, a message batch's params)
  reaches the provider namespaced to the team: two teams sending the same key send different ones;
  an upload is keyed line by line as it streams, wherever its chunks are cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import openai
import orjson
import pytest

import sdk
from gateway.testing import RunningServer, running_proxy
from sdk.estimate import input_tokens, output_limit
from sdk.passthrough.bodies import keyed_upload
from sdk.policy import Price
from sdk.promptcache.keys import team_key
from sdk.spend import worst_cost_usd
from sdk.types import Endpoint, LLMRequest
from tests.helpers import answered_within_budget, anth, oai, skip_without_redis, upstream, wait_until, write_policy
from tests.helpers import spend_report as spend

ALPHA, BETA, THRIFTY, SAVER = "sk-alpha-budget", "sk-beta-budget", "sk-thrifty-budget", "sk-saver-budget"
READER = "sk-reader-budget"
PRICED = 'pricing: {"gpt-3.5-*": {input: 1000, output: 1000}, "gpt-4o-mini": {input: 1000, output: 2000}}\n'
COMPLETION = {"model": "gpt-3.5-turbo-instruct", "prompt": "Once upon a time", "max_tokens": 16}
MSG = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
# worth about two and a half completions: each answer holds (≈5 + 16 tokens) × $1,000 per million
COMPLETIONS_BUDGET = 0.00005


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, emulator) -> Path:
    directory = tmp_path_factory.mktemp("passthrough-budget")
    write_policy(directory, "alpha", ALPHA, emulator.url, extra=PRICED + f"budget: {{usd: {COMPLETIONS_BUDGET}, period: day}}\n")
    write_policy(directory, "beta", BETA, emulator.url, extra=PRICED)  # same provider key, no budget
    write_policy(directory, "thrifty", THRIFTY, emulator.url, extra=PRICED + "budget: {usd: 1, period: day}\n")
    write_policy(directory, "saver", SAVER, emulator.url, extra=PRICED + "budget: {usd: 1, period: day}\n")
    write_policy(directory, "reader", READER, emulator.url, extra=PRICED + "budget: {usd: 1, period: day}\n")
    return directory


def batch_line(cid: str, max_tokens: int = 8, **body: object) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": cid}],
                                  "max_tokens": max_tokens, **body}})


def test_parallel_completions_overshoot_a_budget_by_at_most_one_reservation(proxy, fresh_emulator):
    answered = answered_within_budget([proxy], ALPHA, lambda client: client.completions.create(**COMPLETION))
    spent = spend(proxy, ALPHA)["day"]["total"]
    reservation = worst_cost_usd(input_tokens(LLMRequest(Endpoint.CHAT_COMPLETIONS, COMPLETION)),
                                 output_limit(LLMRequest(Endpoint.CHAT_COMPLETIONS, COMPLETION)), Price(input=1000, output=1000))
    assert 1 <= answered <= COMPLETIONS_BUDGET / reservation + 1  # in-flight completions hold their worst cost
    assert spent <= COMPLETIONS_BUDGET + reservation  # the documented bound (docs/spend.md)
    assert len(upstream(fresh_emulator, "/completions")) == answered  # the refused never left
    # the other team on the same provider key is not held back by alpha's budget
    assert oai(proxy, BETA).completions.create(**COMPLETION).usage.completion_tokens == 16


def test_a_batch_is_created_only_if_its_worst_case_fits_the_budget(proxy, fresh_emulator):
    thrifty, beta = oai(proxy, THRIFTY), oai(proxy, BETA)
    # two lines of up to 1,000 tokens of gpt-4o-mini at $2,000 per million, at batch rates: ≈ $2, over $1
    big = b"\n".join(batch_line(f"big-{i}", max_tokens=1000) for i in range(2)) + b"\n"
    source = thrifty.files.create(file=("big.jsonl", big), purpose="batch")
    with pytest.raises(openai.RateLimitError, match="budget") as refused:
        thrifty.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "batch" in refused.value.body["message"]
    with pytest.raises(anthropic.RateLimitError, match="budget"):  # up to 200,000 Claude Sonnet tokens: ≈ $1.50
        anth(proxy, THRIFTY).messages.batches.create(requests=[{"custom_id": "a", "params": {**MSG, "max_tokens": 200_000}}])
    assert upstream(fresh_emulator, "batches") == []  # neither reached the provider
    assert fresh_emulator.app.state.batches.entries == {}
    # what fits is created: a small batch of the same team, and the big one from a team without a budget
    small = thrifty.files.create(file=("small.jsonl", batch_line("small") + b"\n"), purpose="batch")
    assert thrifty.batches.create(input_file_id=small.id, endpoint="/v1/chat/completions", completion_window="24h").id
    assert anth(proxy, THRIFTY).messages.batches.create(requests=[{"custom_id": "a", "params": MSG}]).id
    theirs = beta.files.create(file=("big.jsonl", big), purpose="batch")
    assert beta.batches.create(input_file_id=theirs.id, endpoint="/v1/chat/completions", completion_window="24h").id
    assert len(fresh_emulator.app.state.batches.entries) == 3
    report = spend(proxy, THRIFTY)
    assert report["budget"]["held"] == 0  # a created batch holds nothing: it is charged its worst cost
    assert report["day"]["total"] == report["day"]["unread_batches"] > 0


def test_a_created_batch_is_charged_its_worst_cost_until_its_results_are_read(proxy, fresh_emulator):
    """A batch runs after the call creating it has answered, and was charged only when its results
    were read: a team with $1 left created batch after batch worth $0.60 each (each checked against
    the same remainder, with nothing held), and a batch whose results it never read was never charged.
    Now creating one is checked and held in one step and charges its worst cost, replaced by what its
    results say when they are read."""
    saver = oai(proxy, SAVER)
    # one line of up to 600 output tokens at $2,000 per million, at batch rates: ≈ $0.60 of a $1 budget
    big = saver.files.create(file=("big.jsonl", batch_line("big", max_tokens=600) + b"\n"), purpose="batch")
    worst = spend_worst_of(proxy)
    assert 0.5 < worst < 1

    def create() -> str | None:
        try:
            return saver.batches.create(input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h").id
        except openai.RateLimitError as exc:
            assert "batch at batch rates may cost up to" in exc.body["message"]
            return None

    with ThreadPoolExecutor(2) as pool:  # two at once: one fits, not both
        created = [batch for batch in pool.map(lambda _: create(), range(2)) if batch is not None]
    assert len(created) == 1
    assert create() is None  # nor one after it: the first is charged its worst cost while it runs
    assert len(upstream(fresh_emulator, "/v1/batches")) == 1
    report = spend(proxy, SAVER)["day"]
    assert report["total"] == report["unread_batches"] == pytest.approx(worst, abs=2e-6)
    assert spend(proxy, SAVER)["budget"]["held"] == 0
    # Its results read through the gateway: charged what they say instead, and the budget is free again.
    done = wait_until(lambda: (b := saver.batches.retrieve(created[0])).status == "completed" and b, "the batch completes")
    assert done.output_file_id is not None
    saver.files.content(done.output_file_id).read()
    report = wait_until(lambda: (r := spend(proxy, SAVER)["day"])["unread_batches"] == 0 and r, "the batch trued up")
    assert 0 < report["total"] < worst / 2 and report["total"] == pytest.approx(report["by_model"]["gpt-4o-mini"], abs=2e-6)
    saver.files.content(done.output_file_id).read()  # read again: charged once, taken back once
    assert spend(proxy, SAVER)["day"]["total"] == pytest.approx(report["total"])
    assert create() is not None


def test_a_partial_read_of_batch_results_is_not_their_complete_read(proxy, fresh_emulator):
    """A client's `Range` header reaches the provider, which answers 206 with part of the file. That
    read was taken as the first complete one: the lines in it were charged, the batch's worst-cost
    charge taken back, and the claim spent, so a team read one line of a batch of many and never paid
    for the rest. A 206 is a read cut short now: charged for the lines in it, the charge kept until a
    whole read."""
    reader = oai(proxy, READER)
    lines = b"".join(batch_line(f"line-{i}", max_tokens=200) + b"\n" for i in range(2))
    made = reader.files.create(file=("two.jsonl", lines), purpose="batch")
    batch = reader.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h")
    worst = spend(proxy, READER)["day"]["unread_batches"]
    assert worst > 0
    done = wait_until(lambda: (b := reader.batches.retrieve(batch.id)).status == "completed" and b, "the batch completes")
    assert done.output_file_id is not None
    size = reader.files.retrieve(done.output_file_id).bytes
    part = reader.files.with_raw_response.content(done.output_file_id, extra_headers={"Range": f"bytes=0-{size * 3 // 4}"})
    assert part.status_code == 206 and part.content.count(b"\n") == 1  # the first line whole, the second cut
    report = wait_until(lambda: (r := spend(proxy, READER)["day"])["total"] > worst and r, "the line read is charged")
    assert report["unread_batches"] == pytest.approx(worst)  # still charged its worst cost, and the line read
    one_line = report["total"] - worst
    reader.files.content(done.output_file_id).read()
    report = wait_until(lambda: (r := spend(proxy, READER)["day"])["unread_batches"] == 0 and r, "the batch trued up")
    assert report["total"] >= one_line * 2.5  # the whole file is charged: two lines, the first again


def test_two_replicas_count_each_others_batches(policy_dir, fresh_emulator):
    """Over Redis, a message batch created through one replica is charged where the other admits:
    the second is refused there, and the results read through it take the charge back."""
    skip_without_redis()
    from gateway.testing import running_redis

    params = {**MSG, "max_tokens": 100_000}  # Claude Sonnet 4.6 output at $15 per million, halved: ≈ $0.75 of $1
    with running_redis() as server:
        url = f"{server.url}?prefix=batch-holds&timeout_ms=500"
        with running_proxy([policy_dir], state_url=url) as one, running_proxy([policy_dir], state_url=url) as two:
            made = anth(one, SAVER).messages.batches.create(requests=[{"custom_id": "a", "params": params}])
            with pytest.raises(anthropic.RateLimitError, match="batch at batch rates may cost up to"):
                anth(two, SAVER).messages.batches.create(requests=[{"custom_id": "b", "params": params}])
            assert spend(two, SAVER)["day"]["unread_batches"] == pytest.approx(0.75, abs=0.01)
            later = anth(two, SAVER)
            wait_until(lambda: later.messages.batches.retrieve(made.id).processing_status == "ended", "the batch ends")
            assert [entry.custom_id for entry in later.messages.batches.results(made.id)] == ["a"]
            wait_until(lambda: spend(one, SAVER)["day"]["unread_batches"] == 0, "the batch trued up on the other replica")
            assert later.messages.batches.create(requests=[{"custom_id": "c", "params": params}]).id


def spend_worst_of(proxy: RunningServer) -> float:
    """What the 600-token line of `test_a_created_batch_is_charged…` may cost at batch rates."""
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, orjson.loads(batch_line("big", max_tokens=600))["body"])
    return worst_cost_usd(input_tokens(request), output_limit(request), Price(input=1000, output=2000), token_rate=0.5)


def test_batch_prompt_cache_keys_are_namespaced_to_the_team(proxy, policy_dir, fresh_emulator):
    keyed = batch_line("k", prompt_cache_key="shared-prefix") + b"\n" + batch_line("plain") + b"\n"
    sent = {}
    for team, client in (("beta", oai(proxy, BETA)), ("thrifty", sdk.OpenAI(policy=policy_dir / "thrifty.yaml", max_retries=0))):
        source = client.files.create(file=("in.jsonl", keyed), purpose="batch")
        stored = fresh_emulator.app.state.files.entries[source.id].content.splitlines()
        sent[team] = orjson.loads(stored[0])["body"]["prompt_cache_key"]
        assert stored[1] == batch_line("plain")  # a line without a key is passed as it was
        assert client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id
    for team, key in (("beta", BETA), ("thrifty", THRIFTY)):
        anth(proxy, key).messages.batches.create(
            requests=[{"custom_id": "a", "params": {**MSG, "prompt_cache_key": "shared-prefix"}}])
        body = orjson.loads(upstream(fresh_emulator, "/v1/messages/batches")[-1]["body"])
        sent[f"{team} messages"] = body["requests"][0]["params"]["prompt_cache_key"]
    for team, key in (("beta", BETA), ("thrifty", THRIFTY)):
        oai(proxy, key).completions.create(**COMPLETION, extra_body={"prompt_cache_key": "shared-prefix"})
        sent[f"{team} completion"] = orjson.loads(upstream(fresh_emulator, "/v1/completions")[-1]["body"])["prompt_cache_key"]
    assert sent["beta completion"] == sent["beta"] and sent["thrifty completion"] == sent["thrifty"]
    assert "shared-prefix" not in sent.values()
    assert sent["beta"] != sent["thrifty"] and sent["beta messages"] != sent["thrifty messages"]
    # one team's key is the same wherever it sends it (a batch file, a message batch, through either door)
    assert sent["beta messages"] == sent["beta"] and sent["thrifty messages"] == sent["thrifty"]


@pytest.mark.parametrize("size", [1, 3, 64, 1 << 20])
def test_an_upload_is_keyed_line_by_line_wherever_its_chunks_are_cut(size):
    """The multipart framing, lines that are not JSON and a key spelled with a JSON escape: only the
    keys change, whatever the chunk boundaries; bytes that open no JSON line go on as they come."""
    escaped = b'{"custom_id": "e", "body": {"model": "gpt-4o-mini", "prompt\\u005fcache_key": "k"}}'
    upload = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
              + batch_line("a", prompt_cache_key="k") + b"\n" + escaped + b"\nnot json\n"
              + batch_line("b", prompt_cache_key="k") + b"\r\n--b--\r\n" + b"x" * 100)

    async def keyed() -> list[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for at in range(0, len(upload), size):
                yield upload[at:at + size]
        return [chunk async for chunk in keyed_upload(chunks(), "beta")]

    key = team_key("beta", "k")
    assert b"".join(asyncio.run(keyed())) == (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
        + batch_line("a", prompt_cache_key=key) + b"\n"
        + orjson.dumps({"custom_id": "e", "body": {"model": "gpt-4o-mini", "prompt_cache_key": key}}) + b"\nnot json\n"
        + batch_line("b", prompt_cache_key=key) + b"\r\n--b--\r\n" + b"x" * 100)


def test_bytes_that_open_no_json_line_are_not_held():
    async def first() -> bytes:
        async def endless() -> AsyncIterator[bytes]:
            while True:
                yield b"y" * 1024
        return await anext(keyed_upload(endless(), "beta"))

    assert asyncio.run(first()) == b"y" * 1024


def test_a_prompt_of_token_ids_is_held_and_charged_as_its_tokens(tmp_path, fresh_emulator, monkeypatch):
    """A completion's prompt (and embeddings' input) may be token ids, billed as those tokens; the count
    read only strings, so a prompt of 2,000 ids held and, its stream cut short, was charged no input at all."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)  # still streaming when the hold is read
    write_policy(tmp_path, "ids", "sk-token-ids", fresh_emulator.url, extra=PRICED + "budget: {usd: 100, period: day}\n")
    body = {"model": "gpt-3.5-turbo-instruct", "prompt": [1734 + i % 50 for i in range(2_000)], "max_tokens": 200}
    with running_proxy([tmp_path]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-token-ids", max_retries=0)
        with client.completions.create(**body, stream=True) as stream:
            next(iter(stream))
            held = spend(proxy, "sk-token-ids")["budget"]["held"]
        assert held == pytest.approx((2_000 + 200) * 1000 / 1e6, rel=1e-3)  # before: the 200 output tokens alone
        charged = wait_until(lambda: spend(proxy, "sk-token-ids")["day"]["total"], "the cut stream charged")
        assert charged == pytest.approx((2_000 + 200) * 1000 / 1e6, rel=1e-3)  # its worst case, the prompt counted
