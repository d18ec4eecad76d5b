"""The access log: one structured line per request that reached a team's pipeline, when it ends.

Off by default. `SLIPSTREAM_ACCESS_LOG=text|json` (what `slipstream serve --access-log` sets, so
every worker inherits it) turns it on for both doors, the proxy and the drop-in SDK, on standard
error through the `slipstream.access` logger (which does not propagate: an application's root
logging never turns it on by accident). Lines carry ids, names, counts and times, never keys or
prompt text: team, key id (a hash prefix), request id (also the `x-slipstream-request-id` header),
endpoint, requested model, route, status, cache status, prompt-cache read against expected,
tokens, TTFT, total time, upstream attempts, and `usage=estimated` when no usage came back and the
tokens were counted by the gateway (sdk/estimate.py).

A line is formatted where the request ends and written by a logging thread (the standard library's
QueueHandler/QueueListener): a write to a standard error that nobody reads fast enough (a full pipe to
a log shipper) would otherwise block the event loop and every request on it. The lines waiting are
bounded (`MAX_QUEUED`, each team its share past it: sdk/shares.py); a line with no place is dropped
and counted (`slipstream_access_log_dropped_total{team}`). Unbounded, a standard error nobody drained
grew the process every team shares by every team's lines until it ran out of memory, and under a
plain bound one team's traffic would take every place. `flush()` waits for the lines queued so far;
it also runs at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import time
from logging.handlers import QueueHandler, QueueListener
from typing import Any

import orjson

from sdk.observability.metrics import ACCESS_LOG_DROPPED
from sdk.pipeline import RequestContext
from sdk.shares import FairShares
from sdk.types import Usage

ENV = "SLIPSTREAM_ACCESS_LOG"
MODES = ("off", "text", "json")
log = logging.getLogger("slipstream.access")
log.propagate = False
MAX_QUEUED = 50_000  # lines waiting for the writing thread (a few hundred bytes each); past it, each team its share
_configured = False
_writer: QueueListener | None = None


class _Lines(queue.Queue[logging.LogRecord | None]):
    """The lines waiting for the writing thread: bounded, each team its share past the bound (a line's
    team is its record's `team`, set by `record` and `record_passthrough`). None is the writer's stop."""

    def __init__(self) -> None:
        super().__init__()
        self.shares = FairShares(MAX_QUEUED)

    def put(self, item: logging.LogRecord | None, block: bool = True, timeout: float | None = None) -> None:
        with self.not_full:  # Queue.put for an unbounded queue, but a line may be refused its place
            if item is not None and not self.shares.take(_team(item)):
                ACCESS_LOG_DROPPED.labels(_team(item)).inc()
                return
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def _get(self) -> logging.LogRecord | None:
        item = super()._get()
        if item is not None:
            self.shares.give_back(_team(item))
        return item


def _team(line: logging.LogRecord) -> str:
    return str(getattr(line, "team", ""))


_lines = _Lines()


class _JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return orjson.dumps({"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), **record.msg}).decode()  # type: ignore[dict-item]


class _TextFormatter(logging.Formatter):
    """logfmt: key=value pairs, values with spaces quoted."""

    def format(self, record: logging.LogRecord) -> str:
        pairs = (f"{k}={_text(v)}" for k, v in record.msg.items())  # type: ignore[union-attr]
        return f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} " + " ".join(pairs)


def _text(value: Any) -> str:
    """A logfmt value: quoted, with its quotes and backslashes escaped, when it has a space, a quote,
    a backslash or an '='; a client's value (the model name) cannot end the quotes and add fields."""
    text = "-" if value is None or value == "" else str(value)
    return orjson.dumps(text).decode() if any(c in text for c in ' "\\=') or not text.isprintable() else text


def configure(mode: str | None = None) -> None:
    """Turn the access log on (`text`, `json`) or off; None reads `SLIPSTREAM_ACCESS_LOG`."""
    global _configured, _writer, _lines
    mode = (mode or os.environ.get(ENV) or "off").lower()
    if mode not in MODES:
        raise ValueError(f"access log mode must be one of {', '.join(MODES)}, not {mode!r}")
    for handler in list(log.handlers):
        log.removeHandler(handler)
    if _writer is not None:
        _writer.stop()  # writes what was queued before the switch
        _writer = None
    _lines = _Lines()  # bounded by the current MAX_QUEUED
    if mode == "off":
        log.setLevel(logging.WARNING)
    else:
        queued = QueueHandler(_lines)
        queued.setFormatter(_JSONFormatter() if mode == "json" else _TextFormatter())  # formats in the caller's thread
        log.addHandler(queued)
        _writer = QueueListener(_lines, logging.StreamHandler(sys.stderr))
        _writer.start()
        log.setLevel(logging.INFO)
    _configured = True


def flush() -> None:
    """Wait until every line logged so far is written."""
    if _writer is not None:
        _lines.join()


def _forget_in_child() -> None:
    """A forked child has the handler but not the writing thread: it configures itself again on its
    first line (a prefork server, an application forking after its first request)."""
    global _configured, _writer, _lines
    for handler in list(log.handlers):
        log.removeHandler(handler)
    _configured, _writer, _lines = False, None, _Lines()


atexit.register(flush)
os.register_at_fork(after_in_child=_forget_in_child)


def record(ctx: RequestContext, status: int | str, usage: Usage | None = None) -> None:
    """Log the request `ctx` that ended with `status` (an HTTP status, `stream_error` or `cancelled`)."""
    if not _configured:
        configure()
    if not log.isEnabledFor(logging.INFO):
        return
    timings, usage = ctx.timings, usage or Usage()
    first = timings.first_token
    log.info({
        "request_id": ctx.request_id,
        "team": ctx.team,
        "key_id": ctx.key_id,
        "endpoint": str(ctx.request.endpoint),
        "model": ctx.request.model,
        "route": ctx.route,
        "status": status,
        "cache": ctx.cache_status,
        "prompt_cache_read": usage.cache_read_tokens,
        "prompt_cache_expected": ctx.prompt_cache.expected_read,
        "input_tokens": usage.total_input_tokens,
        "output_tokens": usage.output_tokens,
        "ttft_ms": round((first - timings.start) * 1000, 1) if first is not None else None,
        "total_ms": round((time.perf_counter() - timings.start) * 1000, 1),
        "attempts": ctx.attempts,
        **({"usage": "estimated"} if ctx.usage_estimated else {}),  # tokens counted by the gateway, not reported
    }, extra={"team": ctx.team})


def record_passthrough(team: str, key_id: str, request_id: str, endpoint: str, model: str, route: str,
                       status: int | str, usage: Usage | None, started: float, estimated: bool = False) -> None:
    """Log a pass-through request (sdk/passthrough/): the same fields, those that apply to it;
    `endpoint` is its family (`passthrough:files`, ...), `started` its `time.perf_counter()` start,
    `estimated` when the tokens were counted by the gateway."""
    if not _configured:
        configure()
    if not log.isEnabledFor(logging.INFO):
        return
    usage = usage or Usage()
    log.info({
        "request_id": request_id, "team": team, "key_id": key_id, "endpoint": endpoint, "model": model,
        "route": route, "status": status, "input_tokens": usage.total_input_tokens, "output_tokens": usage.output_tokens,
        "total_ms": round((time.perf_counter() - started) * 1000, 1),
        **({"usage": "estimated"} if estimated else {}),
    }, extra={"team": team})
