"""The compression stage through TeamRuntime against the emulator: what upstream sees, header, metrics."""

from __future__ import annotations

import contextvars
import copy

import numpy as np
import orjson

from sdk.observability.metrics import REGISTRY
from sdk.runtime import slipstream_headers
from sdk.types import Endpoint, LLMRequest
from tests.compression.textdata import FILLER, document
from tests.helpers import requires_extra

QUESTION = "What happens when the iterator of a for loop is exhausted?"
TOOLS = [{"name": "lookup", "description": "Look a word up. " * 200, "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}}}]
SYSTEM = "You answer questions about Python. " * 150


def sent_body(emulator) -> dict:
    """The last body the emulator received."""
    return orjson.loads(emulator.state.recent[-1]["body"])


def anthropic_body(content: list, **extra) -> dict:
    return {"model": "claude-test", "max_tokens": 8, "system": SYSTEM, "tools": TOOLS, "messages": [{"role": "user", "content": content}], **extra}


async def test_documents_are_pruned_and_everything_else_is_sent_unchanged(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: true, protect: []}")
    body = anthropic_body([{"type": "text", "text": FILLER}, {"type": "text", "text": QUESTION}])
    original = copy.deepcopy(body)
    answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, body))
    assert answer.status == 200 and body == original  # the client's body is never mutated
    sent = sent_body(fresh_emulator)
    assert sent["system"] == SYSTEM and sent["tools"] == TOOLS
    document_text, question = sent["messages"][0]["content"]
    assert question == {"type": "text", "text": QUESTION}
    assert "When the iterator is exhausted" in document_text["text"].replace("\n", " ") and "[…]" in document_text["text"]
    header = slipstream_headers(ctx, answer)["x-slipstream-compression"]
    assert header == f"before={ctx.compression.before};after={ctx.compression.after};compressed=latest_turn:1;left=system:no_lead_in:1"  # long instructions, no material announced
    assert ctx.compression.after < 0.6 * ctx.compression.before
    assert REGISTRY.get_sample_value("slipstream_compression_tokens_total", {"team": "docs", "when": "before"}) >= ctx.compression.before
    assert REGISTRY.get_sample_value("slipstream_compression_requests_total", {"team": "docs", "outcome": "compressed"}) >= 1


async def test_tagged_documents_and_document_blocks_in_openai_and_anthropic(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: true, protect: []}")
    tagged = f"Context:\n<document>\n{FILLER}\n</document>\n{QUESTION}"
    body = {"model": "gpt-test", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": tagged}]}
    _, ctx = await runtime.handle(LLMRequest(Endpoint.CHAT_COMPLETIONS, body))
    sent = sent_body(fresh_emulator)["messages"]
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert sent[1]["content"].startswith("Context:\n<document>\n") and sent[1]["content"].endswith(f"\n</document>\n{QUESTION}")
    assert ctx.compression.after < ctx.compression.before
    block = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": FILLER}, "title": "Python reference"}
    await runtime.handle(LLMRequest(Endpoint.MESSAGES, anthropic_body([block, {"type": "text", "text": QUESTION}])))
    sent_block = sent_body(fresh_emulator)["messages"][0]["content"][0]
    assert sent_block["title"] == "Python reference" and len(sent_block["source"]["data"]) < 0.6 * len(FILLER)


async def test_cached_prefix_and_citations_are_never_touched(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: true, protect: []}")
    cited = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": FILLER}, "citations": {"enabled": True}}
    marked = anthropic_body([{"type": "text", "text": FILLER, "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": QUESTION}])
    earlier = {"role": "user", "content": [{"type": "text", "text": FILLER}, {"type": "text", "text": "Summarize it.", "cache_control": {"type": "ephemeral"}}]}
    multi_turn = anthropic_body([{"type": "text", "text": QUESTION}])
    multi_turn["messages"] = [earlier, {"role": "assistant", "content": "Done."}, *multi_turn["messages"]]
    for body in (anthropic_body([cited, {"type": "text", "text": QUESTION}]), marked, multi_turn):
        answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, copy.deepcopy(body)))
        assert sent_body(fresh_emulator)["messages"] == body["messages"]
        assert ctx.compression.before == ctx.compression.after
        assert slipstream_headers(ctx, answer)["x-slipstream-compression"].startswith("before=")


async def test_plain_rag_prompts_are_compressed_with_the_question_byte_identical(make_runtime, fresh_emulator):
    """The issue's prompts: reference material pasted into a plain user message, in the system
    prompt, or before the question of the latest message; defaults only (ratio as the user set it)."""
    runtime = make_runtime("{enabled: true, documents: {ratio: 0.5}}")
    pasted = {"role": "user", "content": "Reference documents:\n\n" + FILLER}
    ack = {"role": "assistant", "content": "Thanks, I have read them."}
    body = {"model": "gpt-test", "messages": [pasted, ack, {"role": "user", "content": QUESTION}]}
    answer, ctx = await runtime.handle(LLMRequest(Endpoint.CHAT_COMPLETIONS, copy.deepcopy(body)))
    sent = sent_body(fresh_emulator)["messages"]
    assert sent[1:] == body["messages"][1:] and sent[0]["content"].startswith("Reference documents:\n\n")
    assert "When the iterator is exhausted" in sent[0]["content"].replace("\n", " ") and ctx.compression.after < 0.65 * ctx.compression.before
    assert "compressed=earlier_turns:1" in slipstream_headers(ctx, answer)["x-slipstream-compression"]

    system = "You answer questions about Python.\n\nUse the following documentation:\n\n" + FILLER
    body = {"model": "claude-test", "max_tokens": 8, "system": system, "messages": [{"role": "user", "content": QUESTION}]}
    _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, copy.deepcopy(body)))
    sent = sent_body(fresh_emulator)
    assert sent["system"].startswith("You answer questions about Python.\n\nUse the following documentation:\n") and len(sent["system"]) < 0.65 * len(system)
    assert sent["messages"] == body["messages"] and ctx.compression.compressed == {"system": 1}

    latest = f"Here are the relevant documents:\n\n{FILLER}\n\nQuestion: {QUESTION}"
    body = anthropic_body([{"type": "text", "text": latest}])
    _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, copy.deepcopy(body)))
    text = sent_body(fresh_emulator)["messages"][0]["content"][0]["text"]
    assert text.startswith("Here are the relevant documents:\n\n") and text.endswith(f"\n\nQuestion: {QUESTION}") and len(text) < 0.65 * len(latest)
    assert sent_body(fresh_emulator)["system"] == SYSTEM  # no lead-in announces material: instructions stay whole


async def test_material_left_whole_is_counted_with_its_reason(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: true}")
    body = anthropic_body([{"type": "text", "text": FILLER}])  # long, and no question to tell apart
    answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, copy.deepcopy(body)))
    assert sent_body(fresh_emulator)["messages"] == body["messages"]
    assert slipstream_headers(ctx, answer)["x-slipstream-compression"].endswith(";left=latest_turn:no_question:1,system:no_lead_in:1")
    assert REGISTRY.get_sample_value("slipstream_compression_left_total", {"team": "docs", "place": "latest_turn", "reason": "no_question"}) >= 1


async def test_scope_limits_the_places(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: true, protect: [], scope: [earlier_turns]}")
    doc_turn = {"role": "user", "content": [{"type": "text", "text": FILLER}, {"type": "text", "text": QUESTION}]}
    body = anthropic_body([{"type": "text", "text": document("while")}, {"type": "text", "text": "And while loops?"}])
    body["messages"] = [doc_turn, {"role": "assistant", "content": "It ends."}, *body["messages"]]
    await runtime.handle(LLMRequest(Endpoint.MESSAGES, copy.deepcopy(body)))
    sent = sent_body(fresh_emulator)["messages"]
    assert sent[2] == body["messages"][2] and len(sent[0]["content"][0]["text"]) < 0.6 * len(FILLER)


async def test_refusal_is_reported_in_header_and_metrics(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: true, protect: [numbers, identifiers, entities], documents: {ratio: 0.05}}")  # the broad protection
    body = anthropic_body([{"type": "text", "text": FILLER}, {"type": "text", "text": QUESTION}])
    answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, copy.deepcopy(body)))
    assert sent_body(fresh_emulator)["messages"] == body["messages"]
    assert slipstream_headers(ctx, answer)["x-slipstream-compression"].endswith(";refused=1;left=latest_turn:protected_items:1,system:no_lead_in:1")
    assert REGISTRY.get_sample_value("slipstream_compression_refusals_total", {"team": "docs"}) >= 1


async def test_contextual_scorer_uses_the_shared_minilm(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: true, protect: [], documents: {scorer: contextual}}")
    body = anthropic_body([{"type": "text", "text": document("for", "while", "del")}, {"type": "text", "text": QUESTION}])
    _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, body))
    text = sent_body(fresh_emulator)["messages"][0]["content"][0]["text"]
    assert "When the iterator is exhausted" in text.replace("\n", " ") and ctx.compression.after < ctx.compression.before


async def test_disabled_compression_adds_no_stage_and_no_header(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: false}")
    assert "compression" not in [stage.name for stage in runtime.pipeline.stages]
    answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, anthropic_body([{"type": "text", "text": QUESTION}])))
    assert ctx.compression is None and "x-slipstream-compression" not in slipstream_headers(ctx, answer)


async def test_compressed_prefix_is_stable_so_the_prompt_cache_reads_it(make_runtime, fresh_emulator):
    runtime = make_runtime("{enabled: true, protect: []}", extra="prompt_cache: {enabled: true}\n")
    turn = [{"type": "text", "text": FILLER}, {"type": "text", "text": QUESTION}]
    body = anthropic_body(turn)
    await runtime.handle(LLMRequest(Endpoint.MESSAGES, copy.deepcopy(body)))
    first = sent_body(fresh_emulator)["messages"][0]
    body["messages"] += [{"role": "assistant", "content": "It ends."}, {"role": "user", "content": "And then?"}]
    answer, _ = await runtime.handle(LLMRequest(Endpoint.MESSAGES, body))
    second = sent_body(fresh_emulator)["messages"][0]
    strip = lambda m: [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]  # noqa: E731
    assert strip(first) == strip(second)  # same compressed document on the next turn
    assert answer.usage.cache_read_tokens > 1000


async def test_a_traced_request_has_a_compression_span(make_runtime, fresh_emulator):
    import asyncio

    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from sdk.observability import tracing

    exporter = InMemorySpanExporter()
    tracing.install(SimpleSpanProcessor(exporter))
    try:
        runtime = make_runtime("{enabled: true, protect: []}")
        _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, anthropic_body([{"type": "text", "text": FILLER}, {"type": "text", "text": QUESTION}])))
        await asyncio.sleep(0)  # spans are handed over on the loop's next turn
    finally:
        tracing.reset()
    [span] = [s for s in exporter.get_finished_spans() if s.name == "compression"]
    assert span.attributes["slipstream.compression.outcome"] == "compressed"
    assert (span.attributes["slipstream.compression.tokens_before"], span.attributes["slipstream.compression.tokens_after"]) == (
        ctx.compression.before, ctx.compression.after)
    assert span.attributes["slipstream.compression.pieces"] == 1
    [request] = [s for s in exporter.get_finished_spans() if s.parent is None]
    assert span.parent.span_id == request.context.span_id


async def test_token_counts_are_remembered_without_the_texts(make_runtime, fresh_emulator):
    """Compression remembers each message's token count for every team in one memo of 16,384 entries,
    which was keyed by the message's text: it kept every text counted alive (a team's 16,384 distinct
    1 MiB messages, 16 GiB, in the process every team shares). It is keyed by a digest of the text now."""
    from sdk.compression import compressor

    runtime = make_runtime("{enabled: true, protect: []}")
    text = FILLER + " unique document" * 20_000
    answer, _ = await runtime.handle(LLMRequest(Endpoint.MESSAGES, anthropic_body([{"type": "text", "text": text},
                                                                                  {"type": "text", "text": QUESTION}])))
    assert answer.status == 200
    # A key is (team, what stands for the text); other tests' teams may be in the memo too.
    assert any(team == "docs" for team, _ in compressor._COUNTS)
    kept = max(len(text_key) for _, text_key in compressor._COUNTS)
    assert kept < 1024  # before: the message's 300,000 characters


@requires_extra("semantic")  # the static scorer reads MiniLM's embedding table
def test_one_teams_new_words_do_not_clear_another_teams_word_vectors(monkeypatch):
    """The static scorer's word vectors were one memo for every team, cleared whole past its bound:
    a team whose documents brought that many new words made every team's vectors be computed again.
    Each team's words are held apart now, and a full memo drops the fullest team's."""
    from sdk.compression import scoring
    from sdk.offload import TENANT

    monkeypatch.setattr(scoring, "MAX_MEMO_WORDS", 1_000, raising=False)
    vectors = scoring.StaticVectors()

    def as_team(team: str, words: list[str]) -> None:
        TENANT.set(team)
        vectors.matrix(words)

    contextvars.Context().run(as_team, "beta", ["invoice", "refund", "ledger"])
    for start in range(0, 3_000, 500):
        contextvars.Context().run(as_team, "alpha", [f"token{i}" for i in range(start, start + 500)])
    assert len(vectors._memo) <= 1_000
    assert all(("beta", word) in vectors._memo for word in ("invoice", "refund", "ledger"))  # cleared with alpha's before


@requires_extra("semantic")  # the static scorer reads MiniLM's embedding table
def test_word_vectors_are_remembered_for_words_of_a_usual_length_only():
    """The static scorer remembers each word's vector, for every team in one memo of up to 200,000
    words, and kept words of any length: a team's documents of long 'words' (a base64 blob is one)
    were kept by the megabyte. Words over MAX_MEMO_WORD characters are scored, not kept."""
    from sdk.compression.scoring import MAX_MEMO_WORD, static_vectors

    vectors = static_vectors()
    long_word = "q" * 100_000
    matrix = vectors.matrix(["python", long_word, "python"])
    assert matrix.shape == (3, 384) and float(np.linalg.norm(matrix[1])) > 0.99
    assert ("", long_word) not in vectors._memo and ("", "python") in vectors._memo  # before: the 100,000 characters kept
    assert max(len(word) for _, word in vectors._memo) <= MAX_MEMO_WORD


async def test_the_pieces_remembered_are_bounded_in_what_they_hold(make_runtime, fresh_emulator, monkeypatch):
    """Compression remembers each piece's outcome (its compressed text and the units it dropped), so a
    piece resent on later turns is compressed once: 1,024 per team, whatever their size, so a team's
    distinct large documents, each up to its body limit, stayed in the process every team shares long
    after their requests. They are kept within OUTCOME_CHARS of text now (64 KiB for this test, 16 MiB
    by default), the least recently used going first."""
    from sdk.compression import compressor

    monkeypatch.setattr(compressor, "OUTCOME_CHARS", 64 << 10, raising=False)  # absent on the old code: it kept every piece
    runtime = make_runtime("{enabled: true, protect: []}")
    for i in range(8):
        text = f"Manual {i}.\n\n{FILLER}"
        answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, anthropic_body([{"type": "text", "text": text},
                                                                                      {"type": "text", "text": QUESTION}])))
        assert answer.status == 200 and ctx.compression.after < ctx.compression.before
    remembered = next(s for s in runtime.pipeline.stages if s.name == "compression").compressor._outcomes
    held = sum(len(outcome.text) + sum(map(len, outcome.removed)) for outcome in remembered._entries.values())
    assert 0 < held <= 64 << 10  # before: all eight, about 120,000 characters
    assert len(remembered) >= 2
