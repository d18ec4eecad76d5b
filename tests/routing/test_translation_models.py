"""Cross-protocol requests to Claude models whose API differs from model to model (a third audit's
sequel to test_translation_clients): what one model takes, another refuses with a 400.

The official OpenAI client through the proxy (team key "sk-routing"), the emulator upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.routing.conftest import routed_proxy
from tests.routing.conftest import sent as _sent

ROUTES = """  - match: {model: "gpt-opus48-*"}
    targets: [{provider: claude, model: claude-opus-4-8}]
  - match: {model: "gpt-opus47-*"}
    targets: [{provider: claude, model: claude-opus-4-7}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("models"), emulator.url, ROUTES)



def test_sampling_settings_reach_a_claude_that_samples_as_it_does_left_out_and_named(oa, fresh_emulator):
    """Claude Opus 4.7 (and 4.8, Sonnet 5) refuse temperature other than 1, and top_p, with a 400
    ("`temperature` is deprecated for this model"): a Chat client's usual temperature 0.2 failed every
    request routed there. They are left out for those models and named; Sonnet 4.5 still gets them."""
    ask = [{"role": "user", "content": "Name a fjord."}]
    raw = oa.chat.completions.with_raw_response.create(model="gpt-opus47-x", messages=ask, temperature=0.2, top_p=0.9)
    assert raw.parse().choices[0].message.content
    assert "temperature" not in _sent(fresh_emulator) and "top_p" not in _sent(fresh_emulator)
    assert {"temperature", "top_p"} <= set(raw.headers["x-slipstream-dropped-fields"].split(","))
    oa.responses.create(model="gpt-opus47-x", input="Name a fjord.", temperature=0.2)
    assert "temperature" not in _sent(fresh_emulator)
    oa.chat.completions.create(model="gpt-x", messages=ask, temperature=0.2)
    assert _sent(fresh_emulator)["temperature"] == 0.2


def test_a_later_system_message_stays_in_place_as_each_claude_model_takes_it(oa, fresh_emulator):
    """A system or developer message after the first turn (LangGraph's and Codex's later instructions)
    went to every Claude model as a mid-conversation `role: "system"` message, which only Opus 4.8,
    Opus 5, Fable 5 and Mythos 5 take: the others (Sonnet 4.5, Opus 4.7, ...) answered 400. They get it
    in the same place as a system reminder in the user turn, as Claude Code writes them; the
    conversation before it, and so its cached prefix, is unchanged."""
    history: Any = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello."}, {"role": "developer", "content": "Answer in French."},
                    {"role": "user", "content": "How are you?"}]
    for model, roles in (("gpt-opus48-x", ["user", "assistant", "system", "user"]), ("gpt-opus47-x", ["user", "assistant", "user"]),
                         ("gpt-x", ["user", "assistant", "user"])):
        assert oa.chat.completions.create(model=model, max_tokens=16, messages=history).choices[0].message.content
        body = _sent(fresh_emulator)
        assert body["system"] in ("You are terse.", [{"type": "text", "text": "You are terse."}])
        assert [m["role"] for m in body["messages"]] == roles
        assert "Answer in French." in body["messages"][2]["content"][0]["text"]
    assert body["messages"][2]["content"][0]["text"] == "<system-reminder>\nAnswer in French.\n</system-reminder>"
