"""Canonical hashing: equivalent requests share a key; anything that changes the answer splits the partition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.cache.keys import cache_keys
from sdk.types import Endpoint, LLMRequest
from tests.cache.helpers import claude, gpt


def test_key_order_stream_flag_and_cache_control_do_not_change_the_exact_key():
    plain = claude("What is a monad?", system="Be brief.")
    marked = LLMRequest(
        Endpoint.MESSAGES,
        {
            "stream": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is a monad?", "cache_control": {"type": "ephemeral"}}]}],
            "system": "Be brief.",
            "temperature": 0,
            "max_tokens": 200,
            "model": plain.model,
            "metadata": {"user_id": "u-1"},
        },
    )
    assert cache_keys("t", plain).exact == cache_keys("t", marked).exact


def test_system_tools_sampling_and_history_split_the_partition():
    base = cache_keys("t", claude("Hi"))
    assert cache_keys("t", claude("Hi", system="Pirate voice.")).partition != base.partition
    assert cache_keys("t", claude("Hi", tools=[{"name": "f", "input_schema": {"type": "object"}}])).partition != base.partition
    assert cache_keys("t", claude("Hi", temperature=0.7)).partition != base.partition
    assert cache_keys("t", claude("Hi", before=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])).partition != base.partition
    assert cache_keys("t", claude("Hello there")).partition == base.partition  # only the latest turn differs


def test_query_is_the_latest_user_text_only():
    assert cache_keys("t", claude("  Why is the sky blue? ")).query == "Why is the sky blue?"
    tool_result = claude("ignored", before=[])
    tool_result.body["messages"][-1]["content"] = [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]
    assert cache_keys("t", tool_result).query is None
    assert cache_keys("t", gpt("Why?")).query == "Why?"


def test_unset_temperature_counts_as_sampled():
    assert cache_keys("t", claude("Hi", temperature=None)).sampled
    assert not cache_keys("t", claude("Hi", temperature=0)).sampled


parts = st.tuples(
    st.sampled_from(["search", "billing", "ads"]),
    st.sampled_from(["claude-sonnet-5", "claude-haiku-4-5"]),
    st.sampled_from(["", "Be brief.", "Answer in French."]),
    st.sampled_from([0, 0.5, 1.0]),
    st.sampled_from([(), ("earlier question", "earlier answer")]),
)


@settings(max_examples=200, deadline=None)
@given(parts, parts)
def test_partitions_match_exactly_when_every_partition_component_matches(x, y):
    def keys(p):
        team, model, system, temperature, history = p
        before = [{"role": r, "content": c} for r, c in zip(("user", "assistant"), history, strict=False)]
        request = claude("Same question?", temperature=temperature, before=before, **({"system": system} if system else {}))
        request.body["model"] = model
        return cache_keys(team, request)

    assert (keys(x).partition == keys(y).partition) == (x == y)
    assert (keys(x).exact == keys(y).exact) == (x == y)
