"""Where the material is: questions and lead-ins found by structure, places by scope, specific items."""

from __future__ import annotations

import pytest

from sdk.compression import extractive
from sdk.compression.framing import system_frame, user_frame
from sdk.compression.places import locate
from sdk.compression.protection import DEFAULT_PROTECT, find_items, unit_items
from sdk.compression.scoring import score_static
from tests.compression.textdata import FILLER
from tests.helpers import requires_extra

Q = "What happens when the iterator of a for loop is exhausted?"
ALL = frozenset({"system", "earlier_turns", "latest_turn"})


@pytest.mark.parametrize(
    ("text", "question"),
    [
        (f"Reference documents:\n\n{FILLER}\n\n{Q}", Q),
        (f"Reference documents:\n\n{FILLER}\n\nQuestion: {Q}\nAnswer:", f"Question: {Q}\nAnswer:"),
        (f"Docs:\n{FILLER}\nQ: {Q}\nA:", f"Q: {Q}\nA:"),
        (f"{FILLER}\n\nExplain how a for loop ends, in two sentences.", "Explain how a for loop ends, in two sentences."),
        (f"{FILLER.rstrip()} {Q}", None),  # no blank line: the question is the end of the last paragraph
    ],
)
def test_the_question_is_found_by_structure_and_left_outside_the_material(text: str, question: str | None):
    frame = user_frame(text, latest=True)
    assert not isinstance(frame, str)
    assert text[frame.end :].strip().endswith(question or Q) and (question is None or frame.question == question)
    assert "Assert statements are a convenient way" in text[frame.start : frame.end]
    assert not text[frame.start : frame.end].rstrip().endswith("?")


def test_without_a_question_the_latest_turn_is_left_whole_but_an_earlier_turn_is_material():
    assert user_frame(FILLER, latest=True) == "no_question"
    frame = user_frame("Reference documents:\n\n" + FILLER, latest=False)
    assert not isinstance(frame, str) and frame.start == len("Reference documents:") and frame.question == ""


def test_system_material_starts_after_the_announcing_line_and_instructions_stay():
    rules = "You are a support bot.\n\nRules for answering from the documents:\n- be brief\n- cite sections\n\nDocuments:\n"
    text = rules + FILLER + "\n\nAnswer only from the documents above."
    frame = system_frame(text)
    assert not isinstance(frame, str)
    assert text[: frame.start] == rules.rstrip("\n") and text[frame.end :].strip() == "Answer only from the documents above."
    langchain = "Use the following pieces of retrieved context to answer the question. If you don't know, say so.\n\n" + FILLER
    assert system_frame(langchain).start == langchain.index("\n\n")
    assert system_frame("You are a careful assistant. " * 80) == "no_lead_in"  # long instructions are not material


def test_separator_lines_fence_the_material():
    text = f"Context information is below.\n---------------------\n{FILLER}\n---------------------\nGiven the context, answer the query.\nQuery: {Q}\nAnswer: "
    frame = user_frame(text, latest=True)
    assert not isinstance(frame, str)
    assert text[frame.start : frame.end].strip() == FILLER.strip() and frame.question.startswith("Query:")


def _body(system: str | list, messages: list) -> dict:
    return {"model": "m", "max_tokens": 8, "system": system, "messages": messages}


def test_places_follow_the_scope_and_earlier_turns_rank_against_the_next_question():
    messages = [
        {"role": "user", "content": "Reference documents:\n\n" + FILLER},
        {"role": "assistant", "content": "Read them."},
        {"role": "user", "content": Q},
    ]
    body = _body("Be brief.\n\nContext:\n" + FILLER, messages)
    found = locate(body, ALL, 800).found
    assert [(f.place, f.message, f.query) for f in found] == [("system", -1, Q), ("earlier_turns", 0, Q)]
    assert [f.place for f in locate(body, frozenset({"earlier_turns"}), 800).found] == ["earlier_turns"]
    marked = _body([{"type": "text", "text": "Context:\n" + FILLER, "cache_control": {"type": "ephemeral"}}], messages)
    located = locate(marked, ALL, 800)
    assert [f.place for f in located.found] == ["earlier_turns"] and located.left == [("system", "cached_prefix", -1)]


def test_openai_system_messages_and_tool_results_are_told_apart():
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Answer from the reference material below.\n\nReference material:\n" + FILLER},
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": FILLER},  # tool results are never material
        {"role": "user", "content": FILLER},  # long, and no question: left whole, reason counted
    ]}
    located = locate(body, ALL, 800)
    assert [(f.place, f.message) for f in located.found] == [("system", 0)]
    assert located.left == [("latest_turn", "no_question", 4)]


def test_specific_items_are_rare_specific_tokens_not_every_capitalized_word():
    text = "Incident INC-4821 took 45 minutes and cost $120 on 2025-03-04 at 9:30 UTC (RFC 7231, v3.12.1) for Anna Lindqvist in Tromsø; the loop ran 3 times."
    items = find_items(text, ("quantities", "codes", "names"))
    expected = {"code:INC-4821", "quantity:45 minutes", "quantity:$120", "quantity:2025-03-04", "quantity:9:30 UTC", "code:RFC 7231", "code:v3.12.1", "name:Anna Lindqvist", "name:Tromsø"}
    assert items == expected  # a bare count ("3 times") is no quantity, and "Incident" starts the sentence
    prepared = extractive.prepare(FILLER)
    unit_words = [set(w) for w in prepared.words]
    protected = set().union(*unit_items(prepared.text, prepared.starts, unit_words, DEFAULT_PROTECT, "How does a loop end?", ""))
    # Python's documentation names "Python", "TypeError", "__iter__()" and version numbers again and again: none is rare.
    assert len(protected) < 15 and not {"name:Python", "code:3.8"} & protected


@requires_extra("semantic")
def test_default_protection_keeps_a_paraphrased_fact_and_refuses_nothing_on_documentation():
    fact = "Backups of the Marrowby cluster are copied to cold storage every 36 hours."
    text = FILLER.replace("When the iterator is exhausted", fact + " When the iterator is exhausted", 1)
    budget = extractive.Budget(0.4, None, True, "[…]", DEFAULT_PROTECT)
    for question in ("How often does the Marrowby cluster's data get archived?", "How often is data archived?"):
        prepared = extractive.prepare(text)
        outcome = extractive.finish(prepared, score_static(question, prepared.units), budget, question, "")
        assert not outcome.refused and fact in outcome.text and outcome.after < 0.6 * outcome.before
