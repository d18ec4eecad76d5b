"""Usage accounting from provider bodies and stream events.

Anthropic's `message_delta` usage is cumulative: fields are merged by overwrite, never added to
`message_start`'s (Anthropic's streaming docs, build-with-claude/streaming). OpenAI's `prompt_tokens` (Responses: `input_tokens`)
includes cached tokens.
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.types import Endpoint, Protocol, Usage


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def merge_anthropic_usage(usage: Usage, raw: Any) -> None:
    """Overwrite, field by field, the values present in an Anthropic usage object."""
    if not isinstance(raw, dict):
        return
    if "input_tokens" in raw:
        usage.input_tokens = _int(raw["input_tokens"])
    if "output_tokens" in raw:
        usage.output_tokens = _int(raw["output_tokens"])
    if "cache_read_input_tokens" in raw:
        usage.cache_read_tokens = _int(raw["cache_read_input_tokens"])
    if "cache_creation_input_tokens" in raw:
        usage.cache_write_tokens = _int(raw["cache_creation_input_tokens"])
    if isinstance(written := raw.get("cache_creation"), dict) and "ephemeral_1h_input_tokens" in written:
        usage.cache_write_1h_tokens = _int(written["ephemeral_1h_input_tokens"])
    if isinstance(geo := raw.get("inference_geo"), str):
        usage.inference_geo = geo
    if isinstance(tools := raw.get("server_tool_use"), dict) and "web_search_requests" in tools:
        usage.web_searches = _int(tools["web_search_requests"])


_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens",
           "web_searches", "file_searches", "images", "containers")


def summed(usages: list[Usage], into: Usage) -> Usage:
    """`into`, set to the sum of `usages` (several answers billed as one: Chat's `n` on Claude); final once all are,
    estimated where one is."""
    for name in _COUNTS:
        setattr(into, name, sum(getattr(usage, name) for usage in usages))
    into.service_tier, into.inference_geo = usages[0].service_tier, usages[0].inference_geo
    into.fast = any(usage.fast for usage in usages)
    into.final = all(usage.final for usage in usages)
    into.estimated = any(usage.estimated for usage in usages)
    return into


def _input_inclusive(raw: Any, input_key: str, details_key: str, output_key: str) -> Usage:
    """OpenAI's usage shapes: the input count includes cached and cache-written tokens."""
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get(details_key) or {}
    cached = _int(details.get("cached_tokens"))
    written = _int(details.get("cache_write_tokens"))
    return Usage(
        input_tokens=max(0, _int(raw.get(input_key)) - cached - written),
        output_tokens=_int(raw.get(output_key)),
        cache_read_tokens=cached,
        cache_write_tokens=written,
    )


def openai_usage(raw: Any) -> Usage:
    """Chat Completions usage."""
    return _input_inclusive(raw, "prompt_tokens", "prompt_tokens_details", "completion_tokens")


def chat_usage(answer: dict[str, Any]) -> Usage:
    """A Chat Completions answer's (or usage chunk's) usage, with the tier that served it."""
    usage = openai_usage(answer.get("usage"))
    usage.service_tier = _tier(answer)
    return usage


def _tier(answer: dict[str, Any]) -> str:
    tier = answer.get("service_tier")
    return tier if isinstance(tier, str) else ""


def container_of(item: Any) -> str | None:
    """The container a Responses output item ran in, which OpenAI bills per session however many calls
    ran there: a code interpreter call's `container_id`, a hosted shell call's `environment.container_id`
    (the container `container_auto` made for the request, or the one it referenced); None for any other
    item, a local shell's call included."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind == "code_interpreter_call":
        return str(item.get("container_id"))
    environment = item.get("environment")
    if kind == "shell_call" and isinstance(environment, dict) and environment.get("container_id") is not None:
        return str(environment["container_id"])
    return None


def responses_usage(response: Any) -> Usage:
    """A Responses API response's usage, with the hosted tool calls its output items record, which
    the provider bills per call and its usage object does not count: each `web_search_call` a search,
    each `file_search_call` a file search, each `image_generation_call` an image, each container its
    `code_interpreter_call` and hosted `shell_call` items ran in a container (a session)."""
    if not isinstance(response, dict):
        return Usage()
    usage = _input_inclusive(response.get("usage"), "input_tokens", "input_tokens_details", "output_tokens")
    output = response.get("output")
    if isinstance(output, list):
        kinds = [item.get("type") for item in output if isinstance(item, dict)]
        usage.web_searches = kinds.count("web_search_call")
        usage.file_searches = kinds.count("file_search_call")
        usage.images = kinds.count("image_generation_call")
        usage.containers = len({container for item in output if (container := container_of(item)) is not None})
    usage.service_tier = _tier(response)
    return usage


def usage_from_body(endpoint: Endpoint, body: bytes) -> Usage:
    """Usage of a complete answer; a body that is not JSON yields zeros rather than an error."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Usage()
    if not isinstance(data, dict):
        return Usage()
    if endpoint in (Endpoint.RESPONSES, Endpoint.RESPONSES_COMPACT):
        return responses_usage(data)
    if endpoint.protocol is Protocol.ANTHROPIC:
        usage = Usage()
        merge_anthropic_usage(usage, data.get("usage"))
        return usage
    return chat_usage(data)
