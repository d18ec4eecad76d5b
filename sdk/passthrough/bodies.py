"""What the pass-through reads in the bodies it forwards: the models a request names, the ids an
answer lists, the provider URLs it carries, and the usage to charge.

Only small JSON objects are parsed whole (a create's request, an object or a list page); content
downloads, batch results and completions stream through and are scanned line by line as they pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from sdk.errors import InvalidRequestError
from sdk.types import Usage
from sdk.usage import merge_anthropic_usage, openai_usage, responses_usage

MAX_LINE = 16 << 20  # a results line or an SSE event longer than this is passed on but not read


def json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise InvalidRequestError(f"{what}: the body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise InvalidRequestError(f"{what}: the body must be a JSON object")
    return parsed


def requested_models(action_kind: str, body: dict[str, Any]) -> list[str]:
    """The models a completion (`""`) or a message batch (`message_batch`) request runs."""
    if action_kind == "message_batch":
        requests = body.get("requests")
        if not isinstance(requests, list):
            return [""]
        return [_model(r.get("params") if isinstance(r, dict) else None) for r in requests]
    return [_model(body)]


def input_file_models(lines: Iterator[bytes]) -> list[str]:
    """The models an OpenAI batch input file's lines run (`body.model` of each JSON line)."""
    models = []
    for raw in lines:
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # the provider fails the batch on it (invalid_json_line); nothing runs
        models.append(_model(line.get("body") if isinstance(line, dict) else None))
    return models


def _model(body: Any) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else ""


def rewrite_results_url(obj: dict[str, Any], origin: str) -> None:
    """A message batch's `results_url` names the provider; the client must come back through the
    gateway (with its team key) instead, so it is pointed at `origin`."""
    if obj.get("results_url") and isinstance(obj.get("id"), str):
        obj["results_url"] = f"{origin}/v1/messages/batches/{obj['id']}/results"


class Lines:
    """Complete lines out of a byte stream cut anywhere; an over-long line is skipped, not held."""

    def __init__(self) -> None:
        self._tail = b""
        self._skipping = False

    def feed(self, chunk: bytes) -> list[bytes]:
        parts = (self._tail + chunk).split(b"\n")
        self._tail = parts.pop()
        if self._skipping and parts:
            parts, self._skipping = parts[1:], False  # the rest of a line too long to read
        if len(self._tail) > MAX_LINE:
            self._tail, self._skipping = b"", True
        return parts

    def end(self) -> list[bytes]:
        tail, self._tail = self._tail, b""
        return [tail] if tail and not self._skipping else []


@dataclass(slots=True)
class Tally:
    """Usage by model, read from what passed: a completion (one JSON body, or SSE events) or batch
    results (OpenAI output file lines, Anthropic results lines: `whole=False`)."""

    whole: bool  # one JSON body (read at the end, up to MAX_LINE) rather than lines
    by_model: dict[str, Usage] = field(default_factory=dict)
    lines: Lines = field(default_factory=Lines)
    _body: list[bytes] = field(default_factory=list)
    _size: int = 0

    def feed(self, chunk: bytes) -> None:
        if self.whole:
            self._size += len(chunk)
            if self._size <= MAX_LINE:
                self._body.append(chunk)
            return
        for line in self.lines.feed(chunk):
            self._line(line)

    def end(self) -> None:
        if self.whole:
            self._line(b"".join(self._body) if self._size <= MAX_LINE else b"")
            return
        for line in self.lines.end():
            self._line(line)

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if not line.startswith(b"{") or b'"usage"' not in line:
            return
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError:
            return
        if isinstance(parsed, dict):
            self.read(parsed)

    def read(self, obj: dict[str, Any]) -> None:
        """One answer (a completion, its usage chunk, a results line): add its usage."""
        result = obj.get("result")
        response = obj.get("response")
        if isinstance(result, dict):  # Anthropic results line: {custom_id, result: {type, message}}
            message = result.get("message") if result.get("type") == "succeeded" else None
            if isinstance(message, dict):
                usage = Usage()
                merge_anthropic_usage(usage, message.get("usage"))
                self._add(_model(message), usage)
        elif isinstance(response, dict):  # OpenAI batch output line: {custom_id, response: {status_code, body}}
            body = response.get("body")
            if isinstance(body, dict) and isinstance(body.get("usage"), dict):
                raw = body["usage"]
                self._add(_model(body), responses_usage(raw) if "input_tokens" in raw else openai_usage(raw))
        elif isinstance(obj.get("usage"), dict):  # a completion, or a stream's usage chunk
            self._add(_model(obj), openai_usage(obj["usage"]))

    def _add(self, model: str, usage: Usage) -> None:
        total = self.by_model.setdefault(model, Usage())
        total.input_tokens += usage.input_tokens
        total.output_tokens += usage.output_tokens
        total.cache_read_tokens += usage.cache_read_tokens
        total.cache_write_tokens += usage.cache_write_tokens
