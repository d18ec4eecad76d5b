"""OpenAI Files: POST /v1/files (multipart), GET /v1/files, GET /v1/files/{id},
GET /v1/files/{id}/content, DELETE /v1/files/{id}. Files are kept in memory, per API key; batch
input and output files live here."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import TYPE_CHECKING, Any

from . import openai_wire as wire
from .asgi import Call
from .owned import owned

if TYPE_CHECKING:
    from .app import Emulator

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")


@dataclass(slots=True)
class StoredFile:
    key: str
    obj: dict[str, Any]
    content: bytes


@dataclass
class FileStore:
    entries: dict[str, StoredFile] = field(default_factory=dict)

    def add(self, emu: Emulator, key: str, filename: str, purpose: str, content: bytes) -> dict[str, Any]:
        fid = emu.new_id("file-")
        obj = {"id": fid, "object": "file", "bytes": len(content), "created_at": int(time.time()),
               "filename": filename, "purpose": purpose, "status": "processed",
               "expires_at": None, "status_details": None}
        self.entries[fid] = StoredFile(key, obj, content)
        return obj

    def get(self, fid: str, key: str) -> StoredFile | None:
        f = self.entries.get(fid)
        return f if f is not None and f.key == key else None

    def clear(self) -> None:
        self.entries.clear()


def missing(fid: str) -> dict[str, Any]:
    return wire.err_obj(f"No such File object: {fid}", param="id")


def _multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]] | None:
    """name -> (filename, bytes) of a multipart/form-data body, or None if it is not one."""
    if not content_type.startswith("multipart/form-data"):
        return None
    msg = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not msg.is_multipart():
        return None
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


async def upload(emu: Emulator, call: Call) -> None:
    key = await wire.admit(emu, call)
    if key is None:
        return
    fields = _multipart(call.headers.get("content-type", ""), call.body)
    if fields is None:
        await wire.bad(emu, call, "Invalid content type: expected multipart/form-data with 'file' "
                       "and 'purpose' fields.")
        return
    purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace")
    if "file" not in fields:
        await wire.bad(emu, call, "Missing required parameter: 'file'.", "file",
                       "missing_required_parameter")
        return
    if purpose not in PURPOSES:
        await wire.bad(emu, call, f"Invalid value: '{purpose}'. Supported values are: "
                       + ", ".join(f"'{p}'" for p in PURPOSES) + ".", "purpose", "invalid_value")
        return
    filename, content = fields["file"]
    await wire.ok(emu, call, emu.state.files.add(emu, key, filename or "upload", purpose, content))


async def list_files(emu: Emulator, call: Call) -> None:
    """`purpose` filter, `order` (desc default), `limit` (1-10000), `after` cursor."""
    key = await wire.admit(emu, call)
    if key is None:
        return
    q = call.query()
    files = [f.obj for f in emu.state.files.entries.values()
             if f.key == key and q.get("purpose") in (None, f.obj["purpose"])]
    if q.get("order", "desc") == "desc":
        files.reverse()
    await wire.answer_page(emu, call, files, 10_000, 10_000)


async def _stored(emu: Emulator, call: Call) -> StoredFile | None:
    async def absent(fid: str) -> None:
        await wire.error(emu, call, 404, missing(fid))

    return await owned(emu, call, wire.admit, emu.state.files.get, absent)


async def retrieve(emu: Emulator, call: Call) -> None:
    f = await _stored(emu, call)
    if f is not None:
        await wire.ok(emu, call, f.obj)


async def content(emu: Emulator, call: Call) -> None:
    f = await _stored(emu, call)
    if f is not None:
        status, body = 200, f.content
        h = wire.headers(call)
        h.append((b"content-type", b"application/octet-stream"))
        span = byte_range(call.headers.get("range"), len(body))
        if span is not None:  # part of the file, as a client resuming a download asks for it
            start, end = span
            status, body = 206, body[start:end + 1]
            h.append((b"content-range", f"bytes {start}-{end}/{len(f.content)}".encode()))
        emu.count_status(status)
        await call.respond(status, body, h)


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The first and last byte of a single `Range: bytes=…` (RFC 9110 §14.1.2: `a-b`, `a-`, `-suffix`)
    within a body of `size` bytes; None where there is none to honour (the whole body is sent)."""
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None or size == 0:
        return None
    first, last = match.groups()
    if not first:
        return (max(0, size - int(last)), size - 1) if last else None
    start, end = int(first), min(int(last), size - 1) if last else size - 1
    return (start, end) if start <= end else None


async def delete(emu: Emulator, call: Call) -> None:
    f = await _stored(emu, call)
    if f is not None:
        del emu.state.files.entries[f.obj["id"]]
        await wire.ok(emu, call, {"id": f.obj["id"], "object": "file", "deleted": True})
