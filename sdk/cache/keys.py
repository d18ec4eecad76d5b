"""Canonical request hashing: the exact key, the partition key, and the text the semantic tier embeds.

The partition is everything that must be identical for two requests to share an answer: team,
protocol, model and the route's targets that answer it, Anthropic betas, system prompt and tools, generation parameters, and every turn before the latest
user message. Only that latest user message is compared by meaning. Hashes are over canonical JSON
(sorted keys, `cache_control` markers removed) so byte-different but equivalent requests match.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import orjson

from sdk.types import LLMRequest

# Fields that change neither the answer's meaning nor its content: transport, tracing, storage.
# `slipstream` is this stage's own per-request metadata (stripped before the request goes upstream).
# `service_tier` is in the key: the answer reports the tier that served it (and is billed by).
NOT_IN_KEY = frozenset({"stream", "stream_options", "metadata", "user", "store", "slipstream"})
_CONTENT_FIELDS = frozenset({"model", "messages", "system", "tools"})
_ENTRY_KEY = re.compile(r"[0-9a-f]{64}")  # an exact key: a SHA-256 in lowercase hex (`_digest`)


@dataclass(frozen=True, slots=True)
class CacheKeys:
    exact: str  # hash of the whole canonical request, team included
    partition: str  # hash of everything but the latest user turn, team included
    query: str | None  # the latest user turn's text; None when it is not plain text (tool results, images)
    user_turns: int
    sampled: bool  # temperature > 0, or left to the provider's default (1.0 on both providers)


def is_entry_key(key: str) -> bool:
    """Whether `key` can name an entry at all (an answer's `x-slipstream-cache-key`). Anything else names
    none: an invalidation by it is refused, not shared with the other replicas through Redis."""
    return _ENTRY_KEY.fullmatch(key) is not None


def _is_marker(key: str, value: Any) -> bool:
    """An Anthropic breakpoint, `cache_control: {"type": "ephemeral", ...}`; not a key of that name in a
    tool's schema or input (a web agent's tool may take a `cache_control` header)."""
    return key == "cache_control" and (value is None or (isinstance(value, dict) and value.get("type") == "ephemeral"))


def _strip(value: Any) -> Any:
    """Drop prompt-caching markers (they steer the provider's cache, not the answer), and write a
    content list of one plain text block as the string it is equivalent to on both providers."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not _is_marker(k, v)}
    if isinstance(value, list):
        items = [_strip(v) for v in value]
        if len(items) == 1 and isinstance(items[0], dict) and items[0].keys() == {"type", "text"} and items[0]["type"] == "text":
            return items[0]["text"]
        return items
    return value


def _digest(*parts: Any) -> str:
    return hashlib.sha256(orjson.dumps(list(parts), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)).hexdigest()


def _text_of(content: Any) -> str | None:
    """Plain text of a message's content, or None when it holds anything but text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                return None
            texts.append(block["text"])
        return "\n".join(texts)
    return None


def _split_messages(body: dict[str, Any]) -> tuple[list[Any], list[Any], Any]:
    """(system messages, earlier turns, latest message). OpenAI carries its system prompt in messages."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [], [], None
    lead = 0  # only the leading system/developer messages are "the system prompt"; later ones are turns
    while lead < len(messages) and isinstance(messages[lead], dict) and messages[lead].get("role") in ("system", "developer"):
        lead += 1
    system, turns = messages[:lead], messages[lead:]
    if not turns:
        return system, [], None
    return system, turns[:-1], turns[-1]


def fetches_media(value: Any) -> bool:
    """Whether `value` (a request's messages) gives an image or document by URL, which the provider
    fetches when asked: the same URL may serve other bytes later (a webcam's latest.jpg), and a key
    holds the URL, not what it served. Inline media (base64, a `data:` URL) is its own content."""
    if isinstance(value, list):
        return any(fetches_media(v) for v in value)
    if not isinstance(value, dict):
        return False
    source = value.get("source")  # Anthropic's image and document blocks
    if isinstance(source, dict) and source.get("type") == "url":
        return True
    image = value.get("image_url") if value.get("type") == "image_url" else None  # Chat's image part
    url = image.get("url") if isinstance(image, dict) else image
    if isinstance(url, str) and not url.startswith("data:"):
        return True
    return any(fetches_media(v) for v in value.values() if isinstance(v, (list, dict)))


def is_sampled(body: dict[str, Any]) -> bool:
    temperature = body.get("temperature")
    return not isinstance(temperature, (int, float)) or temperature > 0


def cache_keys(team: str, request: LLMRequest, answered_by: Any = None) -> CacheKeys:
    """`answered_by`: who the team's policy has answer the request's model (its route's targets), so an
    entry of a name the policy has since moved to another target is not served."""
    body = _strip(request.body)
    system_msgs, earlier, latest = _split_messages(body)
    params = {k: v for k, v in body.items() if k not in NOT_IN_KEY and k not in _CONTENT_FIELDS}
    # Betas turn on behaviour the body does not show (interleaved thinking, token-efficient tools): a set.
    betas = sorted({b.strip() for b in request.forward_headers.get("anthropic-beta", "").split(",") if b.strip()})
    prefix = (team, str(request.protocol), request.model, _digest(answered_by, betas),
              _digest(body.get("system"), system_msgs, body.get("tools")), _digest(params))
    # The latest turn's fields besides its content (its role, Chat's participant `name`) must match too:
    # the semantic tier compares the content's text only.
    beside = {k: v for k, v in latest.items() if k != "content"} if isinstance(latest, dict) else None
    partition = _digest(*prefix, _digest(earlier), beside)
    exact = _digest(*prefix, _digest(earlier), latest)
    query = None
    if isinstance(latest, dict) and latest.get("role") == "user":
        text = _text_of(latest.get("content"))
        query = text.strip() if text and text.strip() else None
    user_turns = sum(1 for m in [*earlier, latest] if isinstance(m, dict) and m.get("role") == "user")
    return CacheKeys(exact=exact, partition=partition, query=query, user_turns=user_turns, sampled=is_sampled(body))
