"""Token-level pruning with the demo model's surprisal: fillers go, protected items and code stay."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from sdk.compression import extractive
from sdk.compression.surprisal import TokenPruner, demo_model_path
from tests.compression.textdata import document

pytestmark = pytest.mark.skipif(not (demo_model_path() / "model.safetensors").exists(), reason="demo model not built")


def test_low_surprisal_words_are_dropped_but_protected_sentences_question_words_and_code_are_not():
    code = "```\nfor item in items:\n    the_total += item\n```"
    fact = "The loop ran 4096 times in the Acme Corp build and took 45 minutes."
    text = document("for") + f"\n\n{fact}\n\n" + code
    before = extractive.Outcome(text, 1000, 1000, [], [])
    budget = extractive.Budget(0.5, None, True, "[…]", ())
    question = "Which statement is the loop's else clause executed after?"
    outcome = TokenPruner(0.7, ("query", "quantities", "codes", "names")).prune(before, budget, question)
    assert outcome.after < 0.9 * extractive.tokens.count(text)
    assert "the" in outcome.removed and code in outcome.text and fact in outcome.text  # the fact's sentence stays verbatim
    assert all(word in outcome.text.split() for word in ("statement", "loop", "clause", "executed"))


async def test_token_pruning_through_the_stage(make_runtime, fresh_emulator):
    from sdk.types import Endpoint, LLMRequest

    runtime = make_runtime("{enabled: true, protect: [], token_pruning: {enabled: true, ratio: 0.8}}")
    content = [{"type": "text", "text": document("for", "while", "del")}, {"type": "text", "text": "When does a for loop end?"}]
    _, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, {"model": "claude-t", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}))
    assert ctx.compression.after < 0.5 * ctx.compression.before
