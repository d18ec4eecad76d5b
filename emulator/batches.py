"""OpenAI Batch API: POST /v1/batches, GET /v1/batches, GET /v1/batches/{id},
POST /v1/batches/{id}/cancel. The input is a `purpose: batch` JSONL file of
`{custom_id, method: POST, url, body}` lines; each line runs through the emulator's own handler
for `url`, and the answers land in an output file (2xx) and an error file (the rest)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from . import batch_runner
from . import openai_wire as wire
from .asgi import Call
from .batch_runner import BatchJob, LineResult
from .files import missing
from .owned import owned

if TYPE_CHECKING:
    from .app import Emulator

_KIND = ("object", "batch")
ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions")


def _now() -> int:
    return int(time.time())


def _lines(content: bytes, endpoint: str) -> list[tuple[str, dict[str, Any]]] | list[dict[str, Any]]:
    """The requests, or the batch's validation errors (`{code, message, line}`) if any."""
    reqs: list[tuple[str, dict[str, Any]]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            errors.append({"code": "invalid_json_line", "line": n, "param": None,
                           "message": "This line is not parseable as valid JSON."})
            continue
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str) \
                or not isinstance(line.get("body"), dict):
            errors.append({"code": "invalid_request", "line": n, "param": None,
                           "message": "Each line needs a string 'custom_id' and an object 'body'."})
        elif line.get("url") != endpoint or line.get("method", "POST") != "POST":
            errors.append({"code": "mismatched_endpoint", "line": n, "param": "url",
                           "message": f"The line's url must be POST {endpoint}, the batch endpoint."})
        elif line["custom_id"] in seen:
            errors.append({"code": "duplicate_custom_id", "line": n, "param": "custom_id",
                           "message": f"The custom_id for this request is a duplicate of another request: {line['custom_id']}"})
        elif line["body"].get("stream"):
            errors.append({"code": "invalid_request", "line": n, "param": "body.stream",
                           "message": "Streaming is not supported in batches."})
        else:
            seen.add(line["custom_id"])
            reqs.append((line["custom_id"], line["body"]))
    if not reqs and not errors:
        errors.append({"code": "empty_file", "line": None, "param": None,
                       "message": "The batch input file is empty."})
    return errors or reqs


async def create(emu: Emulator, call: Call) -> None:
    key = await wire.admit(emu, call)
    if key is None:
        return
    body = await wire.json_body(emu, call)
    if body is None:
        return
    endpoint, window, fid = body.get("endpoint"), body.get("completion_window"), body.get("input_file_id")
    if endpoint not in ENDPOINTS:
        await wire.bad(emu, call, f"Invalid value: '{endpoint}'. Supported values are: "
                       + ", ".join(f"'{e}'" for e in ENDPOINTS) + ".", "endpoint", "invalid_value")
        return
    if window != "24h":
        await wire.bad(emu, call, f"Invalid value: '{window}'. Supported values are: '24h'.",
                       "completion_window", "invalid_value")
        return
    f = emu.state.files.get(fid, key) if isinstance(fid, str) else None
    if f is None:
        await wire.error(emu, call, 404, missing(str(fid)))
        return
    if f.obj["purpose"] != "batch":
        await wire.bad(emu, call, f"File {fid} has purpose '{f.obj['purpose']}'; batches need "
                       "purpose 'batch'.", "input_file_id", "invalid_value")
        return
    bid = emu.new_id("batch_")
    obj: dict[str, Any] = {
        "id": bid, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": fid,
        "completion_window": window, "status": "validating", "output_file_id": None,
        "error_file_id": None, "created_at": _now(), "in_progress_at": None,
        "expires_at": _now() + 86_400, "finalizing_at": None, "completed_at": None,
        "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": body.get("metadata")}
    job = BatchJob(key, obj)
    emu.state.batches.entries[bid] = job
    reqs = _lines(f.content, endpoint)
    if reqs and isinstance(reqs[0], dict):
        obj.update(status="failed", failed_at=_now(), errors={"object": "list", "data": reqs})
    else:
        _start(emu, job, endpoint, reqs)  # type: ignore[arg-type]
    await wire.ok(emu, call, obj)


def _start(emu: Emulator, job: BatchJob, endpoint: str,
           reqs: list[tuple[str, dict[str, Any]]]) -> None:
    obj = job.obj
    obj["request_counts"]["total"] = len(reqs)
    headers = {"authorization": f"Bearer {job.key}", "content-type": "application/json"}

    def on_start() -> None:
        obj.update(status="in_progress", in_progress_at=_now())

    def on_result(r: LineResult) -> None:
        if r.status:
            obj["request_counts"]["completed" if r.status < 400 else "failed"] += 1

    def on_end() -> None:
        out: list[bytes] = []
        err: list[bytes] = []
        for r in job.results:
            if not r.status:
                continue
            line = {"id": emu.new_id("batch_req_"), "custom_id": r.custom_id, "error": None,
                    "response": {"status_code": r.status, "request_id": emu.new_id("req_"),
                                 "body": r.body}}
            (out if r.status < 400 else err).append(orjson.dumps(line))
        files = emu.state.files
        if out:
            obj["output_file_id"] = files.add(emu, job.key, f"{obj['id']}_output.jsonl",
                                              "batch_output", b"\n".join(out) + b"\n")["id"]
        if err:
            obj["error_file_id"] = files.add(emu, job.key, f"{obj['id']}_error.jsonl",
                                             "batch_output", b"\n".join(err) + b"\n")["id"]
        if job.cancel_requested:
            obj.update(status="cancelled", cancelled_at=_now())
        else:
            obj.update(status="completed", finalizing_at=_now(), completed_at=_now())

    batch_runner.start(emu, job, endpoint, headers, reqs, on_start, on_result, on_end)


async def _stored(emu: Emulator, call: Call) -> BatchJob | None:
    async def missing(bid: str) -> None:
        await wire.not_found(emu, call, f"No batch found with id '{bid}'.")

    return await owned(emu, call, wire.admit, lambda bid, key: emu.state.batches.get(bid, key, _KIND), missing)


async def retrieve(emu: Emulator, call: Call) -> None:
    job = await _stored(emu, call)
    if job is not None:
        await wire.ok(emu, call, job.obj)


async def cancel(emu: Emulator, call: Call) -> None:
    job = await _stored(emu, call)
    if job is None:
        return
    if job.obj["status"] not in ("validating", "in_progress"):
        await wire.bad(emu, call, f"Cannot cancel a batch with status '{job.obj['status']}'.")
        return
    job.cancel_requested = True
    job.obj.update(status="cancelling", cancelling_at=_now())
    await wire.ok(emu, call, job.obj)


async def list_batches(emu: Emulator, call: Call) -> None:
    """Newest first; `limit` (1-100, default 20) and the `after` cursor."""
    key = await wire.admit(emu, call)
    if key is None:
        return
    rows = [j.obj for j in reversed(emu.state.batches.entries.values())
            if j.key == key and j.obj.get(_KIND[0]) == _KIND[1]]
    await wire.answer_page(emu, call, rows)
