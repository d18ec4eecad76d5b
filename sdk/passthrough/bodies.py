"""What the pass-through reads in the bodies it forwards: the models a request names, the ids an
answer lists, the provider URLs it carries, the usage to charge, and the client `prompt_cache_key`s and
end-user ids it namespaces to the team (as the pipeline does, sdk/promptcache/keys.py).

Only small JSON objects are parsed whole (a create's request, an object or a list page, at most
MAX_OBJECT); content downloads, batch results and completions stream through and are scanned line by
line as they pass, and so are uploads (a batch input file's lines are keyed to the team on their way
up; one already uploaded is read back from the provider, `input_file_parts`, to check its models
and cost a part at a time). Bodies are bounded by the team's limit as they are read (`whole`, `bounded`).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from sdk.errors import InvalidRequestError, NotFoundError, RequestTooLargeError, SlipstreamError
from sdk.offload import is_large, off_loop, off_loop_if_large
from sdk.promptcache.keys import scoped_ids
from sdk.providers.base import HTTPProvider, UsageReads, without_asked_usage
from sdk.providers.upstream import UpstreamResponse, upstream_for_running_loop
from sdk.sse import account_limit_event, may_name_an_account_limit, split_event_batches
from sdk.state.answer_ids import answered_audio
from sdk.state.ownership import MISSING_FILE
from sdk.types import Protocol, Usage
from sdk.usage import merge_anthropic_usage, openai_usage, responses_usage

MAX_LINE = 16 << 20  # a results line or an SSE event longer than this is passed on but not read
MAX_OBJECT = 32 << 20  # an object or list answer read whole to check and rewrite it


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


def input_file_lines(lines: Iterator[bytes]) -> list[tuple[str, dict[str, Any]]]:
    """The requests an OpenAI batch input file's lines run: (`url`, `body`) of each JSON line. A line
    that is not JSON is refused (400), not skipped as one the provider would fail the batch on: the
    provider's reader may cut or parse lines otherwise (a bare CR ends a line for Python's
    `splitlines` and universal newlines, and the emulator's; Python's `json` takes `NaN`), and would
    run requests the gateway never saw: another team's files and responses, models outside the
    team's routes, a cost outside its budget."""
    found = []
    for raw in lines:
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise InvalidRequestError("a line of the batch input file is not valid JSON (one JSON object a line, each ended "
                                      "by \\n): the gateway checks what every line runs before it creates the batch") from None
        body = line.get("body") if isinstance(line, dict) else None
        url = line.get("url") if isinstance(line, dict) else None
        found.append((url if isinstance(url, str) else "", body if isinstance(body, dict) else {}))
    return found


def keyed_params(body: dict[str, Any], team: str) -> bool:
    """Namespace to `team` the client ids (`scoped_ids`: a prompt_cache_key, the end user's
    metadata.user_id) of each request of a message batch create (`requests[].params`), in place;
    whether any changed."""
    requests = body.get("requests")
    params = [r.get("params") for r in requests if isinstance(r, dict)] if isinstance(requests, list) else []
    return sum(_keyed(p, team, Protocol.ANTHROPIC) for p in params) > 0


def keyed_body(body: Any, team: str) -> bool:
    """Namespace to `team` an OpenAI request body's client ids (`scoped_ids`: a prompt_cache_key, the
    end user's `user` and `safety_identifier`), in place; whether any changed."""
    return _keyed(body, team, Protocol.OPENAI)


def _keyed(body: Any, team: str, protocol: Protocol) -> bool:
    changes = scoped_ids(body, team, protocol) if isinstance(body, dict) else {}
    if changes:
        body.update(changes)
    return bool(changes)


# Names whose presence makes a batch input line worth parsing (a JSON escape could spell any of them).
_SCOPED_NAMES = (b"prompt_cache_key", b'"user"', b"safety_identifier", b"\\u")


def keyed_line(line: bytes, team: str) -> bytes:
    """A batch input line (`{custom_id, method, url, body}`, with its line ending) with its body's
    client ids namespaced to `team` (`keyed_body`); any other line unchanged."""
    if not any(name in line for name in _SCOPED_NAMES):
        return line
    try:
        parsed = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    if not isinstance(parsed, dict) or not keyed_body(parsed.get("body"), team):
        return line
    return orjson.dumps(parsed) + line[len(line.rstrip()):]  # the line's own ending (a CR before a boundary)


async def keyed_upload(chunks: AsyncIterable[bytes], team: str, length: int | None = 0) -> AsyncIterator[bytes]:
    """An upload as it streams, each JSON line through `keyed_line`: a batch input file's client keys
    are namespaced on their way to the provider, whatever the multipart framing around them. Only a
    line that opens a JSON object is held until it is whole (up to MAX_LINE: a longer one passes
    unread, and a batch whose input file has one is refused when it is created); every other byte
    goes on as it comes.

    An upload of 256 KiB or more (its declared `length`, None when it declares none, or the bytes
    seen so far) is read a piece at a time in the heavy-work pool, as the team's work: a piece of
    short lines is Python work in proportion to its bytes (about 40 ms for 256 KiB of short
    lines that name a user), and a file may be as large as the team's upload limit."""
    keys = _UploadKeys(team)
    seen, large = 0, length is None or is_large(length)
    async for chunk in chunks:
        seen += len(chunk)
        out = await off_loop(keys.feed, chunk) if large or is_large(seen) else keys.feed(chunk)
        if out:
            yield out
    tail = await off_loop(keys.end) if large or is_large(seen) else keys.end()
    if tail:
        yield tail


class _UploadKeys:
    """`keyed_upload`'s reading of an upload so far: the start of a JSON line, held until it is whole."""

    def __init__(self, team: str) -> None:
        self._team = team
        self._pending: list[bytes] = []
        self._size = 0
        self._passing = False  # inside a line that is not held: its bytes go on as they come

    def feed(self, chunk: bytes) -> bytes:
        """What of the upload goes on once `chunk` has come."""
        out: list[bytes] = []
        start, end = 0, len(chunk)
        while start < end:  # a piece at a time, by position: the rest of the chunk is never copied
            cut = chunk.find(b"\n", start) + 1
            piece, start = chunk[start:cut or end], cut or end
            if self._passing or (not self._pending and piece.lstrip()[:1] not in (b"{", b"")):
                out.append(piece)
                self._passing = not cut
                continue
            self._pending.append(piece)
            self._size += len(piece)
            if cut:
                out.append(keyed_line(b"".join(self._pending), self._team))
                self._pending, self._size = [], 0
            elif self._size > MAX_LINE:
                out.append(b"".join(self._pending))
                self._pending, self._size, self._passing = [], 0, True
        return b"".join(out)

    def end(self) -> bytes:
        """The upload's unfinished last line, keyed."""
        whole, self._pending, self._size = b"".join(self._pending), [], 0
        return keyed_line(whole, self._team) if whole else b""


def _model(body: Any) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else ""


def rewrite_results_url(obj: dict[str, Any], origin: str) -> None:
    """A message batch's `results_url` names the provider; the client must come back through the
    gateway (with its team key) instead, so it is pointed at `origin`."""
    if obj.get("results_url") and isinstance(obj.get("id"), str):
        obj["results_url"] = f"{origin}/v1/messages/batches/{obj['id']}/results"


class Lines:
    """Complete lines out of a byte stream cut anywhere; an over-long line is skipped, not held. The
    pieces of an unfinished line wait as they came and are joined once its end arrives; only each new
    piece is searched. (Added to the line so far, a 16 MiB line in 64 KiB pieces was about 2 GiB
    copied and searched again on the loop every team shares.)"""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []  # the unfinished line
        self._size = 0
        self._skipping = False  # inside a line too long to read: its pieces are let go
        self.skipped = 0  # lines too long to read

    def feed(self, chunk: bytes) -> list[bytes]:
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self._hold(chunk)
            return []
        parts = chunk[:cut].split(b"\n")
        if self._skipping:
            parts, self._skipping = parts[1:], False  # the rest of a line too long to read
        elif self._pieces:
            parts[0] = b"".join([*self._pieces, parts[0]])
        self._pieces, self._size = [], 0
        self._hold(chunk[cut + 1:])
        return parts

    def _hold(self, piece: bytes) -> None:
        if self._skipping or not piece:
            return
        self._pieces.append(piece)
        self._size += len(piece)
        if self._size > MAX_LINE:
            self._pieces, self._size, self._skipping = [], 0, True
            self.skipped += 1

    @property
    def held(self) -> int:
        """The bytes of the unfinished line."""
        return self._size

    def end(self) -> list[bytes]:
        tail, self._pieces, self._size = b"".join(self._pieces), [], 0
        return [tail] if tail and not self._skipping else []


@dataclass(slots=True)
class Tally:
    """Usage by model, read from what passed: a completion (one JSON body, or SSE events) or batch
    results (OpenAI output file lines, Anthropic results lines: `whole=False`)."""

    whole: bool  # one JSON body (read at the end, up to MAX_LINE) rather than lines
    by_model: dict[str, Usage] = field(default_factory=dict)
    audio: list[str] = field(default_factory=list)  # audio ids in OpenAI batch output lines, not yet recorded
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

    def reads(self, incoming: int | None) -> int:
        """The bytes `feed` reads for `incoming` more (None: `end`): the line it may complete, or the whole
        body at its end (what may be parsed, up to MAX_LINE)."""
        if self.whole:
            return 0 if incoming is not None or self._size > MAX_LINE else self._size
        return self.lines.held + (incoming or 0)

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
            if isinstance(body, dict):
                self.audio.extend(answered_audio(body))  # a spoken answer's id, named by a later turn
            if isinstance(body, dict) and isinstance(body.get("usage"), dict):
                raw = body["usage"]
                self._add(_model(body), responses_usage(body) if "input_tokens" in raw else openai_usage(raw))
        elif isinstance(obj.get("usage"), dict):  # a completion, or a stream's usage chunk
            self._add(_model(obj), openai_usage(obj["usage"]))

    def _add(self, model: str, usage: Usage) -> None:
        total = self.by_model.setdefault(model, Usage())
        total.input_tokens += usage.input_tokens
        total.output_tokens += usage.output_tokens
        total.cache_read_tokens += usage.cache_read_tokens
        total.cache_write_tokens += usage.cache_write_tokens
        total.cache_write_1h_tokens += usage.cache_write_1h_tokens
        total.web_searches += usage.web_searches
        total.file_searches += usage.file_searches
        total.images += usage.images
        total.containers += usage.containers


async def read_object(response: UpstreamResponse) -> dict[str, Any]:
    chunks, size = [], 0
    async for chunk in response.iter_chunks():
        size += len(chunk)
        if size > MAX_OBJECT:
            response.abort()
            raise SlipstreamError(f"the provider's answer is over {MAX_OBJECT} bytes, more than an object or a list page", status=502)
        chunks.append(chunk)
    try:
        data = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError:
        raise SlipstreamError("the provider's answer is not the JSON object it should be", status=502) from None
    if not isinstance(data, dict):
        raise SlipstreamError("the provider's answer is not the JSON object it should be", status=502)
    return data


def batch_params(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The Messages requests a message batch create runs (each request's `params`)."""
    requests = request.get("requests")
    return [r["params"] for r in requests if isinstance(r, dict) and isinstance(r.get("params"), dict)] if isinstance(requests, list) else []


async def input_file_parts(provider: HTTPProvider, file_id: str, limit: int) -> AsyncGenerator[tuple[list[tuple[str, dict[str, Any]]], int], None]:
    """The requests a batch input file runs, (`url`, `body`) per line, read from the provider (the
    file went up streamed) a part at a time as it arrives, each with its size in bytes: the caller
    checks a part and lets it go (a file may be as large as the team's upload limit, 512 MiB by
    default, and held whole its lines took gigabytes of the process every team shares). A line too
    long to read could hide a model or a cost: refused."""
    url = f"{provider.base_url}/files/{file_id}/content"
    client = provider.client or upstream_for_running_loop()
    response = await client.request("GET", url, provider.dialect.auth(provider.keys.keys[provider.keys.order()[0]]), b"",
                                    provider.timeouts, 0)
    if response.status != 200:
        response.abort()
        if response.status == 404:
            raise NotFoundError(MISSING_FILE.format(file_id))
        raise SlipstreamError(f"could not read the batch input file to check its models (the provider answered {response.status})",
                              status=502)
    lines, size = Lines(), 0
    try:
        async for chunk in response.iter_chunks():
            size += len(chunk)
            if size > limit:
                raise RequestTooLargeError(f"the batch input file is over this team's limit of {limit} bytes")
            whole = lines.feed(chunk)
            if lines.skipped:
                raise InvalidRequestError(f"a line of batch input file {file_id} is over {MAX_LINE} bytes, too long for the "
                                          "gateway to check the model and cost it runs")
            yield await _parsed_lines(whole)
    except BaseException:
        response.abort()
        raise
    yield await _parsed_lines(lines.end())


async def _parsed_lines(lines: list[bytes]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """`input_file_lines` of `lines`, and their bytes: lines of 256 KiB or more (one may be 16 MiB) parsed
    in the heavy-work pool as the team's work, not on the loop every team's requests share."""
    size = sum(len(line) for line in lines)
    return await off_loop_if_large(size, input_file_lines, iter(lines)), size


async def tallied(response: UpstreamResponse, tally: Tally | None,
                  record: Callable[[list[str]], Awaitable[None]] | None = None) -> AsyncIterator[bytes]:
    """The answer's chunks, tallied as they pass; the audio ids its lines carry are handed to `record`
    (the team's ownership records) before the chunk that completed them goes on, so a client can name
    them in a later turn (the last line, without a newline, is read once the body has ended: recorded
    before the answer completes). A line or body of 256 KiB or more is read in the heavy-work pool, as
    the team's work (a completion's answer is parsed whole: one with logprobs, or echoing a large
    prompt, is megabytes, 70 ms for 3.5 MB)."""
    async for chunk in response.iter_chunks():
        if tally is not None:
            await off_loop_if_large(tally.reads(len(chunk)), tally.feed, chunk)
            if tally.audio and record is not None:
                await record(tally.audio)
                tally.audio = []
        yield chunk
    if tally is not None:
        await off_loop_if_large(tally.reads(None), tally.end)
        if tally.audio and record is not None:
            await record(tally.audio)
            tally.audio = []


_FINISH = re.compile(rb'"finish_reason":\s*"')  # a choice's finish (a string cannot hold an unescaped quote)


@dataclass(slots=True)
class _CompletionUsage:
    """A completion stream as its read-on watches it: a choice has finished, and the usage chunk the client
    asked for (`stream_options.include_usage`, which follows the finish chunks) has not come yet."""

    tally: Tally
    asked: bool
    finished: bool = False

    @property
    def awaiting_usage(self) -> bool:
        return self.asked and self.finished and not self.tally.by_model

    def observe(self, event: bytes, now: float) -> None:
        self.finished = self.finished or _FINISH.search(event) is not None
        self.tally.feed(event)


async def completion_events(response: UpstreamResponse, tally: Tally, usage_coming: bool, usage_asked: bool,
                            shared_account: str | None) -> AsyncIterator[bytes]:
    """A streamed completion's events, tallied as they pass. Its usage chunk (`usage_coming`: asked for by
    the client, or by the gateway, `usage_asked`, and then taken out of what the client reads, as for a Chat
    stream: sdk/providers/base.py:without_asked_usage) follows the finish: a client that leaves between
    the two had the upstream closed and was charged its worst case; the stream is read on to the usage
    (sdk/providers/base.py:UsageReads, bounded), which is charged. `shared_account`: the provider's name
    where other teams share its account (`account_limit_event`)."""
    watched = _CompletionUsage(tally, usage_coming)
    reads = UsageReads(split_event_batches(response.iter_chunks()), watched)
    drained = False
    try:
        while (batch := await reads.next()) is not None:
            now = time.perf_counter()
            for event in batch:
                await off_loop_if_large(len(event), watched.observe, event, now)
            if usage_asked and not (batch := without_asked_usage(batch)):
                continue
            if shared_account is not None:
                batch = [account_limit_event(event, shared_account) if may_name_an_account_limit(event) else event for event in batch]
            yield batch[0] if len(batch) == 1 else b"".join(batch)
        drained = True
        tally.end()
    finally:
        if not drained:
            await reads.left()


async def once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def whole(body: bytes | AsyncIterable[bytes], limit: int, need: Callable[[int], None] | None = None) -> bytes:
    """The body read whole, within `limit`; `need(size)` is told its size as its bytes arrive, before
    they are held (the process's body budget, sdk/door/bodies.py: it raises the refusal)."""
    if isinstance(body, bytes):
        if len(body) > limit:
            raise RequestTooLargeError(f"request body of {len(body)} bytes is over this team's limit of {limit} bytes")
        if need is not None:
            need(len(body))
        return body
    pieces, size = [], 0
    async for piece in bounded(body, limit):
        size += len(piece)
        if need is not None:
            need(size)
        pieces.append(piece)
    return b"".join(pieces)


async def bounded(body: AsyncIterable[bytes], limit: int) -> AsyncIterator[bytes]:
    size = 0
    async for piece in body:
        size += len(piece)
        if size > limit:
            raise RequestTooLargeError(f"upload is over this team's limit of {limit} bytes")
        yield piece
