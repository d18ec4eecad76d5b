"""Extractive pruning of one document: retention, code blocks, protection and refusal."""

from __future__ import annotations

import pytest

from sdk.compression import extractive
from sdk.compression.protection import find_items
from sdk.compression.scoring import score_static
from sdk.compression.splitting import split_units
from tests.compression.textdata import document
from tests.helpers import requires_extra

pytestmark = requires_extra("semantic")  # the static scorer reads MiniLM's embedding table

# (question, a phrase of the answer-bearing sentence); the document holds all 14 topics (~9k tokens).
QUESTIONS = [
    ("What does a bare raise statement with no expressions do?", 'If no expressions are present, "raise" re-raises'),
    ("Which code block does a global declaration hold for?", "holds for the entire current code block"),
    ("What are lambda expressions used for?", "are used to create anonymous functions"),
    ("What happens when the iterator of a for loop is exhausted?", "When the iterator is exhausted"),
    ("When is __debug__ False?", "when optimization is requested"),
    ("How is deletion of a target list defined?", "Deletion is recursively defined"),
    ("What is the while statement used for?", "used for repeated execution as long as an expression is true"),
    ("Where may a return statement occur?", '"return" may only occur syntactically nested in a function definition'),
]
TOPICS = ("assert", "for", "with", "while", "try", "raise", "global", "lambda", "del", "return", "import", "if", "class", "function")
NO_PROTECTION = extractive.Budget(ratio=0.5, max_tokens=None, neighbours=True, marker="[…]", protect=())


def compress(text: str, question: str, budget: extractive.Budget = NO_PROTECTION) -> extractive.Outcome:
    prepared = extractive.prepare(text)
    return extractive.finish(prepared, score_static(question, prepared.units), budget, question, "")


def answer_sentence(text: str, phrase: str) -> str:
    return next(u.text(text) for u in split_units(text) if phrase in u.text(text).replace("\n", " "))


def test_answer_bearing_sentences_survive_half_the_tokens():
    text = document(*TOPICS)
    kept = 0
    for question, phrase in QUESTIONS:
        outcome = compress(text, question)
        assert outcome.after <= 0.55 * outcome.before  # the ratio applies to prose; these topics hold little code
        kept += answer_sentence(text, phrase) in outcome.text
    assert kept == len(QUESTIONS)


def test_output_is_original_sentences_in_original_order():
    text = document("for", "while", "raise")
    outcome = compress(text, "What happens when the iterator of a for loop is exhausted?")
    pieces = [p.strip() for p in outcome.text.split("[…]") if p.strip()]
    position = 0
    for piece in pieces:  # every kept run is verbatim and in order
        position = text.index(piece, position) + len(piece)
    assert outcome.removed and all(unit in text for unit in outcome.removed)


@pytest.mark.parametrize(
    "code",
    [
        "```python\ndef quota(user):\n    return LIMITS[user] * 2\n```",
        "def quota(user):\n    return LIMITS[user] * 2\nlimit = quota('ann')\nprint(limit)",  # pasted without a fence
        '{\n  "tenant": "acme",\n  "max_requests": 4096\n}',
    ],
)
def test_code_blocks_are_kept_whole(code: str):
    text = document("while", "try") + "\n\n" + code + "\n\n" + document("del")
    outcome = compress(text, "How is deletion defined?")
    assert outcome.after < outcome.before and code in outcome.text


def test_protected_items_are_detected():
    items = find_items("Set max_retries to 5 in config.yaml for Acme Corp, see os.path.join() and HTTP 429.", ("numbers", "identifiers", "entities"))
    assert {"number:5", "number:429", "identifier:max_retries", "identifier:config.yaml", "identifier:os.path.join()", "identifier:HTTP", "entity:Acme Corp"} <= items


def test_protected_number_is_kept_by_covering_its_sentence():
    fact = "The service accepts at most 4096 requests per minute from one tenant."
    text = document("while") + "\n\n" + fact + "\n\n" + document("del", "return")
    protected = extractive.Budget(0.6, None, True, "[…]", ("numbers",))
    assert fact in compress(text, "What is the while statement used for?", protected).text
    assert fact not in compress(text, "What is the while statement used for?").text  # unprotected: irrelevant, dropped


def test_compression_that_would_drop_a_protected_item_is_refused_and_reported():
    text = document("while", "del", "return")
    tiny = extractive.Budget(0.05, None, True, "[…]", ("numbers", "identifiers", "entities"))
    outcome = compress(text, "What is the while statement used for?", tiny)
    assert outcome.refused and outcome.text == text and outcome.after == outcome.before
    assert all(item.split(":", 1)[0] in ("number", "identifier", "entity") for item in outcome.refused)


@pytest.mark.parametrize("max_tokens", [150, 400])
def test_max_tokens_caps_the_document(max_tokens: int):
    outcome = compress(document("try"), "What does finally do?", extractive.Budget(1.0, max_tokens, True, "[…]", ()))
    assert outcome.after <= max_tokens + 40  # markers and joins are not in the budget
