"""A Messages request whose compact_20260112 edit would act, toward an OpenAI model: refused, saying what works there.

Claude compacts past the edit's trigger by writing a summary and answering from it; the gateway does not write one
behind the client's back, so the request is refused (context_edits.py). The refusal named the edit and its trigger
only, and a client had no way on at that target but another route; it now says what works there, and following it
works: the summary asked for outright (`compaction: {type: "summarize"}`, compaction.py), then the conversation from
its compaction block, the edit's trigger counted on that. The official anthropic client through the proxy (team key
"sk-routing"), the emulator as OpenAI.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.routing.conftest import routed_proxy

ROUTES = """  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]"""
TURNS: Any = [{"role": "user", "content": "Plan the release of version 2. " + "The notes so far are long. " * 400},
              {"role": "assistant", "content": "Freeze on Monday, tag on Wednesday, ship on Friday."}]
EDITS: Any = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1500}}]}
BETAS: Any = ["compact-2026-01-12"]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("compact_refusal"), emulator.url, ROUTES)


def test_a_compaction_that_would_act_is_refused_saying_what_works_instead(an, fresh_emulator):
    ask: Any = [*TURNS, {"role": "user", "content": "What is next?"}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        an.beta.messages.create(model="claude-x", max_tokens=64, messages=ask, context_management=EDITS, betas=BETAS)
    message = str(refused.value)
    assert "compact_20260112" in message and "reaches its trigger of 1500" in message
    assert '`compaction: {"type": "summarize"}`' in message and "compaction block" in message
    assert not fresh_emulator.state.recent  # nothing sent

    # what the refusal says, done: the summary, then the conversation from its compaction block, the edit kept
    summary = an.beta.messages.create(model="claude-x", max_tokens=512, messages=TURNS, compaction={"type": "summarize"})
    block = summary.content[0].model_dump(exclude_none=True)
    assert summary.stop_reason == "compaction" and block["type"] == "compaction"
    answer = an.beta.messages.create(model="claude-x", max_tokens=64, context_management=EDITS, betas=BETAS, messages=[
        {"role": "user", "content": [block]}, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "What is next?"}])
    assert answer.content and answer.context_management is not None and answer.context_management.applied_edits == []
