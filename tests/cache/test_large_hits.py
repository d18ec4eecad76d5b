"""A hit on a large entry does not hold the loop every team's requests share.

Entries are read under the response cache's one lock, on the loop, and were parsed there too: a
Responses entry kept the `instructions` its response echoed (a team's megabytes, up to its body
limit), and every hit read and parsed them again; an entry holding a long answer was parsed on the
loop on every hit. Instructions are no longer stored (a hit echoes its own request's, which its key
makes the same), and a large entry is parsed in the heavy-work pool.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import RunningServer, running_proxy
from tests.helpers import skip_without_extra, write_policy

skip_without_extra("semantic")  # the teams' policies turn the semantic cache on

KEY, BRIEF = "sk-large-hits", "sk-brief-hits"  # long answers; the emulator's default (short) ones
INSTRUCTIONS = "Answer as the style guide below says.\n" + "rule: be brief. " * 130_000  # about 2 MiB


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    long_answers = EmulatorConfig(default_output_tokens=80_000)  # about 400 KB of Chat answer
    with running_emulator(long_answers) as emulator, running_emulator() as brief, pytest.MonkeyPatch.context() as patch:
        data = tmp_path_factory.mktemp("large-hits-data")
        patch.setenv("SLIPSTREAM_DATA_DIR", str(data))
        directory = tmp_path_factory.mktemp("large-hits")
        for team, key, upstream in (("large", KEY, emulator), ("brief", BRIEF, brief)):
            write_policy(directory, team, key, upstream.url,
                         extra="prompt_cache: {enabled: false}\nsemantic_cache: {enabled: true, semantic: false, cache_sampled: true}\n")
        with running_proxy([directory], watch_interval_s=None) as running:
            running.app.state.data_dir = data
            yield running



def _client(proxy: RunningServer, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0, timeout=120)


def _largest_entry(proxy: RunningServer, team: str) -> int:
    with sqlite3.connect(proxy.app.state.data_dir / "response-cache.sqlite3") as db:
        return db.execute("SELECT MAX(length(response)) FROM entries WHERE team = ?", (team,)).fetchone()[0] or 0


def test_a_responses_entry_does_not_keep_the_instructions_a_hit_echoes(proxy):
    client = _client(proxy, BRIEF)
    first = client.responses.create(model="gpt-4.1", instructions=INSTRUCTIONS, input="Is a short answer fine?")
    assert first.instructions == INSTRUCTIONS
    assert _largest_entry(proxy, "brief") < 64 * 1024  # the answer only (2 MiB and more, with the instructions, before)
    hit = client.responses.with_raw_response.create(model="gpt-4.1", instructions=INSTRUCTIONS, input="Is a short answer fine?")
    assert hit.headers["x-slipstream-cache"] == "exact-hit"
    second = hit.parse()
    assert second.instructions == INSTRUCTIONS and second.id != first.id
    assert second.output_text == first.output_text


def test_a_hit_on_a_long_answer_is_parsed_off_the_loop(proxy, pooled):
    client = _client(proxy)
    ask = {"model": "gpt-4.1", "max_tokens": 100_000, "messages": [{"role": "user", "content": "Tell me everything."}]}
    first = client.chat.completions.create(**ask)
    pooled.clear()
    hit = client.chat.completions.with_raw_response.create(**ask)
    assert hit.headers["x-slipstream-cache"] == "exact-hit"
    assert hit.parse().choices[0].message.content == first.choices[0].message.content
    assert [getattr(fn, "__qualname__", None) for fn in pooled] == ["Entry.parse"]  # nothing ran in the pool before


def test_a_hit_copies_only_what_it_changes(proxy, monkeypatch):
    """A Chat or Messages hit deep-copied the whole stored answer (400 KB here) on the loop to change
    its ids: its size again, per hit. It copies the ids' containers only now."""
    import copy

    copied: list[int] = []
    deepcopy = copy.deepcopy

    def counted(thing: Any, *args: Any) -> Any:
        if isinstance(thing, dict) and ("choices" in thing or "content" in thing):
            copied.append(1)
        return deepcopy(thing, *args)

    monkeypatch.setattr(copy, "deepcopy", counted)
    client = _client(proxy)
    ask = {"model": "gpt-4.1", "max_tokens": 100_000, "messages": [{"role": "user", "content": "Tell me it all again."}]}
    first = client.chat.completions.create(**ask)
    hit = client.chat.completions.with_raw_response.create(**ask)
    assert hit.headers["x-slipstream-cache"] == "exact-hit"
    answer = hit.parse()
    assert answer.choices[0].message.content == first.choices[0].message.content and answer.id != first.id
    assert copied == []  # one deep copy of the answer per hit before


def test_a_large_answer_is_read_for_the_cache_off_the_loop(proxy, pooled):
    """Storing an answer parses it (the body, or a stream's last event, which echoes a Responses
    request's instructions): on the loop before, in the heavy-work pool now when it is large."""
    client = _client(proxy)
    client.chat.completions.create(model="gpt-4.1", max_tokens=100_000, messages=[{"role": "user", "content": "Say it at length."}])
    assert "from_body" in [getattr(fn, "__name__", "") for fn in pooled]
    brief = _client(proxy, BRIEF)
    ask = {"model": "gpt-4.1", "instructions": INSTRUCTIONS, "input": "And streamed?"}
    streamed = list(brief.responses.create(**ask, stream=True))
    assert "StreamCapture.feed" in [getattr(fn, "__qualname__", "") for fn in pooled]
    hit = brief.responses.with_raw_response.create(**ask)
    assert hit.headers["x-slipstream-cache"] == "exact-hit"  # stored whole from the stream
    assert hit.parse().output_text == streamed[-1].response.output_text  # type: ignore[union-attr]
