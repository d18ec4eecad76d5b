"""Fault specs, parsing and the queue of faults injected through the control endpoint.

Spec syntax (one string, several faults joined with ';'):

    429[:retry_after=S][,retry_after_ms=MS]   rate-limit error with retry-after headers
    529 | overloaded                          Anthropic overloaded_error (OpenAI paths: 503)
    500 | 503 | 4xx/5xx                       any provider-shaped error status
    reset                                     close the TCP connection without a response
    stall:ms=N                                wait N ms before the first byte
    disconnect_after:events=N                 stream: send N events, then drop the connection
    midstream_error:events=N[,type=T]         stream: after N events send a provider error event

Example: `stall:ms=200;midstream_error:events=3`.
"""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass, field
from typing import Any


class FaultSpecError(ValueError):
    """Raised for an unparseable fault spec."""


@dataclass(slots=True)
class FaultSet:
    """The combined effect of one or more parsed faults on a single request."""

    status: int = 0  # error status to answer with (0: none)
    retry_after: float | None = None
    retry_after_ms: float | None = None
    reset: bool = False
    stall_ms: float = 0.0
    disconnect_after: int = -1  # events before dropping the stream (-1: none)
    midstream_after: int = -1  # events before the error event (-1: none)
    midstream_type: str = "overloaded_error"
    spec: str = ""

    @property
    def stream_only(self) -> bool:
        """True when every part of the set only means something for a streaming response."""
        return (
            (self.disconnect_after >= 0 or self.midstream_after >= 0)
            and not self.status
            and not self.reset
            and not self.stall_ms
        )

    def for_request(self, stream: bool) -> FaultSet:
        """Drop stream-only parts when the request is not streaming."""
        if stream:
            return self
        return FaultSet(
            status=self.status,
            retry_after=self.retry_after,
            retry_after_ms=self.retry_after_ms,
            reset=self.reset,
            stall_ms=self.stall_ms,
            spec=self.spec,
        )

    @property
    def active(self) -> bool:
        return bool(
            self.status
            or self.reset
            or self.stall_ms
            or self.disconnect_after >= 0
            or self.midstream_after >= 0
        )


def _params(raw: str, spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        if "=" not in item:
            raise FaultSpecError(f"bad fault parameter {item!r} in {spec!r} (expected key=value)")
        k, v = item.split("=", 1)
        out[k.strip().replace("-", "_")] = v.strip()
    return out


def _num(params: dict[str, str], key: str, spec: str) -> float:
    try:
        return float(params[key])
    except KeyError:
        raise FaultSpecError(f"fault {spec!r} needs {key}=N") from None
    except ValueError:
        raise FaultSpecError(f"fault {spec!r}: {key} must be a number") from None


def parse_fault(spec: str) -> FaultSet:
    """Parse a spec string into a FaultSet; raises FaultSpecError with a clear message."""
    fs = FaultSet(spec=spec)
    parts = [p.strip() for p in spec.split(";") if p.strip()]
    if not parts:
        raise FaultSpecError("empty fault spec")
    for part in parts:
        name, _, raw = part.partition(":")
        name = name.strip().lower()
        params = _params(raw, part)
        if name == "overloaded":
            name = "529"
        if name.isdigit():
            code = int(name)
            if not 400 <= code <= 599:
                raise FaultSpecError(f"fault status must be 4xx/5xx, got {code}")
            fs.status = code
            if "retry_after" in params:
                fs.retry_after = _num(params, "retry_after", part)
            if "retry_after_ms" in params:
                fs.retry_after_ms = _num(params, "retry_after_ms", part)
            if code == 429 and fs.retry_after is None and fs.retry_after_ms is None:
                fs.retry_after = 1.0
        elif name == "reset":
            fs.reset = True
        elif name == "stall":
            fs.stall_ms += _num(params, "ms", part)
        elif name == "disconnect_after":
            fs.disconnect_after = int(_num(params, "events", part))
        elif name == "midstream_error":
            fs.midstream_after = int(_num(params, "events", part))
            fs.midstream_type = params.get("type", "overloaded_error")
        else:
            raise FaultSpecError(
                f"unknown fault {name!r}; expected a status code, reset, stall, "
                "disconnect_after or midstream_error"
            )
    return fs


@dataclass(slots=True)
class FaultRule:
    """A queued fault applied to the next `remaining` matching requests."""

    faults: FaultSet
    remaining: int
    model: str | None = None  # glob
    path: str | None = None  # glob on the request path (query excluded)

    def matches(self, path: str, model: str | None, stream: bool) -> bool:
        if self.path is not None and not fnmatch.fnmatchcase(path, self.path):
            return False
        if self.model is not None and (model is None or not fnmatch.fnmatchcase(model, self.model)):
            return False
        return stream or not self.faults.stream_only

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.faults.spec,
            "remaining": self.remaining,
            "match": {"model": self.model, "path": self.path},
        }


@dataclass
class FaultQueue:
    """Thread-safe FIFO of fault rules (tests add rules from another thread)."""

    rules: list[FaultRule] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: Any) -> FaultRule:
        if not isinstance(body, dict) or not isinstance(body.get("fault"), str):
            raise FaultSpecError('body must be {"fault": "<spec>", "count": N, "match": {...}}')
        count = body.get("count", 1)
        if not isinstance(count, int) or count < 1:
            raise FaultSpecError("count must be a positive integer")
        match = body.get("match") or {}
        if not isinstance(match, dict):
            raise FaultSpecError("match must be an object")
        rule = FaultRule(parse_fault(body["fault"]), count, match.get("model"), match.get("path"))
        with self._lock:
            self.rules.append(rule)
        return rule

    def take(self, path: str, model: str | None, stream: bool) -> FaultSet | None:
        """Consume one use of the first matching rule."""
        if not self.rules:  # fast path without the lock
            return None
        with self._lock:
            for i, rule in enumerate(self.rules):
                if rule.matches(path, model, stream):
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        del self.rules[i]
                    return rule.faults
        return None

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def to_json(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.to_json() for r in self.rules]
