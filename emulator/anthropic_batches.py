"""Anthropic Message Batches: POST /v1/messages/batches, GET /v1/messages/batches,
GET /v1/messages/batches/{id}, POST /v1/messages/batches/{id}/cancel,
GET /v1/messages/batches/{id}/results (JSONL), DELETE /v1/messages/batches/{id}.
Each request's `params` runs through the emulator's own /v1/messages handler."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from . import anthropic_wire as wire
from . import batch_runner
from .asgi import Call
from .batch_runner import BatchJob, LineResult
from .owned import owned

if TYPE_CHECKING:
    from .app import Emulator

_KIND = ("type", "message_batch")
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _ts(delta_s: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _validate(body: dict[str, Any]) -> str | None:
    reqs = body.get("requests")
    if not isinstance(reqs, list) or not reqs:
        return "requests: List should have at least 1 item after validation"
    seen: set[str] = set()
    for i, r in enumerate(reqs):
        if not isinstance(r, dict):
            return f"requests.{i}: Input should be a valid dictionary"
        cid = r.get("custom_id")
        if not isinstance(cid, str) or not _CUSTOM_ID.match(cid):
            return f"requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if cid in seen:
            return f"Duplicate custom_id in batch: {cid}"
        seen.add(cid)
        if not isinstance(r.get("params"), dict):
            return f"requests.{i}.params: Field required"
        if r["params"].get("stream"):
            return f"requests.{i}.params.stream: streaming is not supported in message batches"
    return None


async def create(emu: Emulator, call: Call) -> None:
    pre = await wire.preamble(emu, call)
    if pre is None:
        return
    body, key = pre
    handled, _ = await wire.pre_faults(emu, call, None, False)
    if handled:
        return
    err = _validate(body)
    if err:
        await wire.error(emu, call, 400, err)
        return
    reqs = [(r["custom_id"], r["params"]) for r in body["requests"]]
    bid = emu.new_id("msgbatch_")
    counts = {"processing": len(reqs), "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    obj: dict[str, Any] = {
        "id": bid, "type": "message_batch", "processing_status": "in_progress",
        "request_counts": counts, "ended_at": None, "created_at": _ts(), "expires_at": _ts(86_400),
        "archived_at": None, "cancel_initiated_at": None, "results_url": None}
    job = BatchJob(key, obj)
    emu.state.batches.entries[bid] = job
    # results_url is absolute, and the SDK follows it: point it back at this emulator.
    host = call.headers.get("host", "127.0.0.1")
    results_url = f"http://{host}/v1/messages/batches/{bid}/results"
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01",
               "content-type": "application/json"}

    def on_result(r: LineResult) -> None:
        counts["processing"] -= 1
        counts["canceled" if not r.status else "succeeded" if r.status < 400 else "errored"] += 1

    def on_end() -> None:
        obj.update(processing_status="ended", ended_at=_ts(), results_url=results_url)

    batch_runner.start(emu, job, "/v1/messages", headers, reqs, lambda: None, on_result, on_end)
    await wire.ok(emu, call, obj)


async def _stored(emu: Emulator, call: Call) -> BatchJob | None:
    async def missing(bid: str) -> None:
        await wire.error(emu, call, 404, f"message_batch: {bid} not found")

    return await owned(emu, call, wire.admit, lambda bid, key: emu.state.batches.get(bid, key, _KIND), missing)


async def retrieve(emu: Emulator, call: Call) -> None:
    job = await _stored(emu, call)
    if job is not None:
        await wire.ok(emu, call, job.obj)


async def cancel(emu: Emulator, call: Call) -> None:
    job = await _stored(emu, call)
    if job is None:
        return
    if job.obj["processing_status"] == "in_progress":
        job.cancel_requested = True
        job.obj.update(processing_status="canceling", cancel_initiated_at=_ts())
    await wire.ok(emu, call, job.obj)


async def delete(emu: Emulator, call: Call) -> None:
    job = await _stored(emu, call)
    if job is None:
        return
    if job.obj["processing_status"] != "ended":
        await wire.error(emu, call, 400, "Batch is still processing; cancel it and wait until it "
                         "has ended before deleting it.")
        return
    del emu.state.batches.entries[job.obj["id"]]
    await wire.ok(emu, call, {"id": job.obj["id"], "type": "message_batch_deleted"})


def _result(r: LineResult) -> dict[str, Any]:
    if not r.status:
        return {"type": "canceled"}
    if r.status < 400:
        return {"type": "succeeded", "message": r.body}
    return {"type": "errored", "error": r.body}


async def results(emu: Emulator, call: Call) -> None:
    job = await _stored(emu, call)
    if job is None:
        return
    if job.obj["processing_status"] != "ended":
        await wire.error(emu, call, 404, f"No batch results available for message batch {job.obj['id']}: "
                         "the batch is still processing.")
        return
    lines = [orjson.dumps({"custom_id": r.custom_id, "result": _result(r)}) for r in job.results]
    emu.count_status(200)
    h = wire.headers(call)
    h.append((b"content-type", b"application/binary"))
    await call.respond(200, b"\n".join(lines) + b"\n", h)


async def list_batches(emu: Emulator, call: Call) -> None:
    """Newest first; `limit` (1-1000, default 20), `after_id` / `before_id` cursors."""
    key = await wire.admit(emu, call)
    if key is None:
        return
    rows = [j.obj for j in reversed(emu.state.batches.entries.values())
            if j.key == key and j.obj.get(_KIND[0]) == _KIND[1]]
    await wire.answer_page(emu, call, rows)
