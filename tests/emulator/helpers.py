"""Small builders shared by the emulator tests."""

from __future__ import annotations

from typing import Any

import httpx

from emulator.text import count_tokens, reply_text

ANTHROPIC_HEADERS = {"x-api-key": "sk-test-emulator", "anthropic-version": "2023-06-01",
                     "content-type": "application/json"}
OPENAI_HEADERS = {"authorization": "Bearer sk-test-emulator", "content-type": "application/json"}


def text_of(tokens: int, seed: int) -> str:
    """A text of exactly `tokens` tokens (emulator tokenizer), different per seed."""
    t = reply_text(seed, tokens)
    assert count_tokens(t) == tokens
    return t


def blocks(n: int, tokens: int, marked: tuple[int, ...] = (), seed: int = 0) -> list[dict[str, Any]]:
    """`n` text blocks of `tokens` tokens; 1-based positions in `marked` get a cache_control."""
    out: list[dict[str, Any]] = []
    for i in range(1, n + 1):
        b: dict[str, Any] = {"type": "text", "text": text_of(tokens, seed * 1000 + i)}
        if i in marked:
            b["cache_control"] = {"type": "ephemeral"}
        out.append(b)
    return out


def sse_events(raw: str) -> list[tuple[str | None, str]]:
    """Parse an SSE body into (event name or None, data) pairs."""
    out = []
    for frame in raw.split("\n\n"):
        if not frame.strip():
            continue
        name = None
        data = []
        for line in frame.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((name, "\n".join(data)))
    return out


# One shared client: building an httpx client (SSL context) costs ~50 ms.
HTTP = httpx.Client(timeout=10)


def post(url: str, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    return HTTP.post(url + path, json=body, headers=headers)
