"""Mutated valid bodies on every generating endpoint: the emulator answers a provider-shaped 4xx
(or a 200), never a 5xx, and stays up. Bounded: a few hundred examples, a few seconds."""

from __future__ import annotations

import copy

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .helpers import HTTP

HEADERS = {"authorization": "Bearer k", "x-api-key": "k", "anthropic-version": "2023-06-01"}
FN = {"type": "object", "properties": {"a": {"type": "string"}}}
VALID = {
    "/v1/chat/completions": {
        "model": "gpt-4o", "messages": [{"role": "user", "content": "use a tool"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": FN}}], "n": 2,
        "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": FN}}},
    "/v1/responses": {
        "model": "gpt-5", "instructions": "be brief", "stream": True,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c", "output": "x"}],
        "tools": [{"type": "function", "name": "f", "parameters": FN}], "tool_choice": "auto",
        "text": {"format": {"type": "json_schema", "name": "n", "schema": FN}},
        "reasoning": {"effort": "low", "summary": "auto"}, "include": ["reasoning.encrypted_content"]},
    "/v1/responses/input_tokens": {"model": "gpt-4o", "input": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {
        "model": "claude-sonnet-4-6", "max_tokens": 2000, "stream": True,
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "use a tool"}]}],
        "tools": [{"name": "f", "input_schema": FN}], "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "output_config": {"effort": "high"}},
    "/v1/messages/count_tokens": {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/embeddings": {"model": "text-embedding-3-small", "input": ["a", [1, 2]], "dimensions": 4},
    "/v1/completions": {"model": "gpt-3.5-turbo-instruct", "prompt": ["a"], "n": 2, "logprobs": 2,
                        "stop": ["x"]},
    "/v1/messages/batches": {"requests": [{"custom_id": "a", "params": {
        "model": "claude-sonnet-4-6", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}}]},
}

leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 3000), st.floats(allow_nan=False, allow_infinity=False),
                 st.text(max_size=6))
value = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                     max_leaves=8)


def _mutate(body: dict, path: list[int], new: object) -> dict:
    """Replace one value somewhere in `body`, walking down by the indices in `path`."""
    out = copy.deepcopy(body)
    node: object = out
    for step, k in enumerate(path):
        if isinstance(node, dict) and node:
            key = sorted(node)[k % len(node)]
            if step + 1 < len(path) and isinstance(node[key], (dict, list)) and node[key]:
                node = node[key]
                continue
            node[key] = new
            return out
        if isinstance(node, list) and node:
            i = k % len(node)
            if step + 1 < len(path) and isinstance(node[i], (dict, list)) and node[i]:
                node = node[i]
                continue
            node[i] = new
            return out
    return out


def test_mutated_bodies_never_get_a_5xx(emu):
    @settings(max_examples=250, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(sorted(VALID)), st.lists(st.integers(0, 40), min_size=1, max_size=5), value)
    def check(path: str, where: list[int], new: object) -> None:
        r = HTTP.post(emu.url + path, json=_mutate(VALID[path], where, new), headers=HEADERS)
        assert r.status_code < 500, (path, r.text[:300])
        if r.status_code >= 400:
            assert "error" in r.json()

    check()
    for path in VALID:
        for raw in (b"[]", b"1", b'"x"', b"{", b"\xff\xfe"):
            r = HTTP.post(emu.url + path, content=raw, headers=HEADERS)
            assert 400 <= r.status_code < 500 and "error" in r.json(), (path, raw, r.text)
    assert httpx.get(emu.url + "/v1/models", headers=HEADERS).status_code == 200  # still up
