"""History compaction through TeamRuntime against the emulator: background summary, stable reuse."""

from __future__ import annotations

import orjson

from sdk.compression.history import SUMMARY_OPEN
from sdk.runtime import slipstream_headers
from sdk.types import Endpoint, LLMRequest

POLICY = "{enabled: true, history: {enabled: true, trigger_tokens: 600, keep_turns: 1}, summarizer: {provider: claude, model: claude-haiku-cheap}}"


def turns(n: int) -> list[dict]:
    messages: list[dict] = []
    for t in range(n):
        messages.append({"role": "user", "content": f"Turn {t}: tell me about release {t} of the deploy tool, " + "with details " * 30})
        messages.append({"role": "assistant", "content": f"Release {t} changed the rollout order. " + "More notes. " * 20})
    return messages


def ask_body(n: int) -> dict:
    return {"model": "claude-test", "max_tokens": 8, "system": "Be brief.", "messages": [*turns(n), {"role": "user", "content": f"Question {n}?"}]}


def sent(emulator, model: str) -> dict:
    return next(orjson.loads(r["body"]) for r in reversed(emulator.state.recent) if orjson.loads(r["body"] or b"{}").get("model") == model)


def compactor(runtime):
    return next(s for s in runtime.pipeline.stages if s.name == "compression").compressor.history


async def test_history_is_summarized_in_background_and_reused_verbatim(make_runtime, fresh_emulator):
    runtime = make_runtime(POLICY)
    answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, ask_body(6)))
    assert ctx.compression.history == "pending" and "history=pending" in slipstream_headers(ctx, answer)["x-slipstream-compression"]
    assert sent(fresh_emulator, "claude-test")["messages"] == ask_body(6)["messages"]  # this request went unchanged
    await compactor(runtime).drain()
    summarizer_call = sent(fresh_emulator, "claude-haiku-cheap")
    assert "Turn 0: tell me about release 0" in summarizer_call["messages"][0]["content"]

    firsts = []
    for n in (7, 8):  # the next turns: earlier turns replaced by the same summary, the rest verbatim
        answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, ask_body(n)))
        assert ctx.compression.history == "compacted" and ctx.compression.after < ctx.compression.before
        messages = sent(fresh_emulator, "claude-test")["messages"]
        assert messages[0]["role"] == "user" and messages[0]["content"].startswith(SUMMARY_OPEN)
        assert messages[-1] == {"role": "user", "content": f"Question {n}?"}
        assert messages[1:] == ask_body(n)["messages"][13:]  # from the kept turn on, untouched
        firsts.append(messages[0]["content"].split("\n\n" + "Turn 6")[0])
    assert firsts[0] == firsts[1]


async def test_long_tail_is_recompacted_from_the_previous_summary(make_runtime, fresh_emulator):
    runtime = make_runtime(POLICY)
    await runtime.handle(LLMRequest(Endpoint.MESSAGES, ask_body(6)))
    await compactor(runtime).drain()
    _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, ask_body(12)))  # the tail outgrew the trigger
    assert ctx.compression.history == "compacted"  # the old summary is used while the new one is computed
    await compactor(runtime).drain()
    assert "Summary of the conversation before this point" in sent(fresh_emulator, "claude-haiku-cheap")["messages"][0]["content"]
    _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, ask_body(13)))
    messages = sent(fresh_emulator, "claude-test")["messages"]
    assert ctx.compression.history == "compacted" and messages[1:] == ask_body(13)["messages"][25:]


async def test_history_inside_a_client_cached_prefix_is_left_alone(make_runtime, fresh_emulator):
    runtime = make_runtime(POLICY)
    body = ask_body(6)
    body["messages"][-2] = {"role": "assistant", "content": [{"type": "text", "text": "ok", "cache_control": {"type": "ephemeral"}}]}
    _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, body))
    await compactor(runtime).drain()
    _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, body))
    assert ctx.compression.history == "" and sent(fresh_emulator, "claude-test")["messages"] == body["messages"]


async def test_a_summary_is_the_teams_spend_and_counts_against_its_budget(make_runtime, fresh_emulator):
    # A summary is sent on the shared provider account for the team: before, it bypassed the team's
    # limits and budget, so compaction let a team spend past both.
    from sdk.spend import periods, record_key

    extra = ("prompt_cache: {enabled: false}\nbudget: {usd: 100, period: day}\n"
             "pricing: {claude-test: {input: 1, output: 1}, claude-haiku-cheap: {input: 1000, output: 1000}}\n")
    runtime = make_runtime(POLICY, extra=extra, team="summaries-spend")
    await runtime.handle(LLMRequest(Endpoint.MESSAGES, ask_body(6)))
    state = runtime.limits.state
    request_only = (await state.spend(record_key("summaries-spend", periods()[0])))["model:claude-test"]
    await compactor(runtime).drain()
    spent = await state.spend(record_key("summaries-spend", periods()[0]))
    assert sent(fresh_emulator, "claude-haiku-cheap")
    assert spent["model:claude-haiku-cheap"] > 100 * request_only  # the summary, at its own price
    assert spent["total"] == spent["model:claude-haiku-cheap"] + request_only


async def test_a_summary_the_teams_budget_cannot_cover_is_not_sent(make_runtime, fresh_emulator):
    from sdk.compression import report

    # Nothing is spent yet, so the request is admitted; its hold (its worst cost), and then its spend,
    # use up the budget before the summary asks.
    extra = ("prompt_cache: {enabled: false}\nbudget: {usd: 0.002, period: day}\n"
             "pricing: {claude-test: {input: 10, output: 10}, claude-haiku-cheap: {input: 1, output: 1}}\n")
    runtime = make_runtime(POLICY, extra=extra, team="summaries-refused")
    answer, _ = await runtime.handle(LLMRequest(Endpoint.MESSAGES, ask_body(6)))
    await compactor(runtime).drain()
    assert answer.status == 200
    summaries = [r for r in fresh_emulator.state.recent if orjson.loads(r["body"] or b"{}").get("model") == "claude-haiku-cheap"]
    assert not summaries  # nothing went upstream for it
    assert report.HISTORY.labels("summaries-refused", "refused")._value.get() == 1
    assert report.HISTORY.labels("summaries-refused", "summarized")._value.get() == 0


async def test_a_summary_counts_against_the_per_key_limits_of_the_key_that_asked(make_runtime, fresh_emulator):
    """A summary was admitted with no key, so only the team's limits applied: a key at its own
    `per_key` limit went on having the shared account called for it through the summaries its
    long conversations triggered. It is admitted and charged as a call of the key whose request
    asked for it now: here the key's one request a minute is used by that request, so its summary
    waits (refused, nothing sent), while the team's limits alone would have let it through."""
    from sdk.compression import report
    from sdk.pipeline import RequestContext

    runtime = make_runtime(POLICY, extra="prompt_cache: {enabled: false}\nlimits: {per_key: {requests_per_minute: 1}}\n",
                           team="summaries-per-key")
    request = LLMRequest(Endpoint.MESSAGES, ask_body(6))
    answer, _ = await runtime.handle(request, RequestContext(request=request, team="summaries-per-key", key_id="key-one"))
    await compactor(runtime).drain()
    assert answer.status == 200
    summaries = [r for r in fresh_emulator.state.recent if orjson.loads(r["body"] or b"{}").get("model") == "claude-haiku-cheap"]
    assert not summaries  # before: sent, the key's limit never asked
    assert report.HISTORY.labels("summaries-per-key", "refused")._value.get() == 1


def test_history_needs_a_known_summarizer(tmp_path, fresh_emulator):
    import pytest

    from sdk.errors import PolicyError
    from sdk.policy import load_policy
    from tests.helpers import write_policy

    for compression, message in (
        ("{enabled: true, history: {enabled: true}}", "needs a 'summarizer'"),
        ("{enabled: true, summarizer: {provider: nope, model: m}}", "unknown provider 'nope'"),
        ("{enabled: true, summarizer: {provider: claude}}", "needs a model name"),
    ):
        path = write_policy(tmp_path, "bad", "k", fresh_emulator.url, extra=f"compression: {compression}\n")
        with pytest.raises(PolicyError, match=message):
            load_policy(path)
    assert load_policy(write_policy(tmp_path, "ok", "k", fresh_emulator.url, extra="compression: {enabled: true}\n")).compression.enabled
