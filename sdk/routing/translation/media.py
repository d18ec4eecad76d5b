"""Images and documents between the dialects: Claude's image and document blocks (base64, URL and text
sources) and Chat's image_url and file parts (data URLs, URLs)."""

from __future__ import annotations

from typing import Any

from sdk.routing.translation.fields import refuse


def image_url(source: dict[str, Any], where: str) -> str:
    if source.get("type") == "base64":
        return f"data:{source['media_type']};base64,{source['data']}"
    if source.get("type") == "url":
        return source["url"]
    raise refuse(f"{where}: an image from a {source.get('type')!r} source", "OpenAI")


def image_source(url: str) -> dict[str, Any]:
    inline = data_url(url)
    if inline is not None:  # `image/jpg` (a file extension) is a JPEG to OpenAI; Claude names it only `image/jpeg`
        return {"type": "base64", "media_type": "image/jpeg" if inline[0] == "image/jpg" else inline[0], "data": inline[1]}
    return {"type": "url", "url": url}


def data_url(url: Any) -> tuple[str, str] | None:
    """(media type, base64 data) of a `data:` URL; None for any other URL."""
    if not isinstance(url, str) or not url.startswith("data:"):
        return None
    header, _, data = url.partition(",")
    return header[5:].split(";")[0], data


def o2a_document(file: dict[str, Any], where: str) -> dict[str, Any]:
    """A Chat `file` part given inline (a PDF, as OpenAI takes them) as a Claude document block."""
    if isinstance(file.get("file_url"), str):  # a Responses input_file by URL (responses_requests._part)
        return {"type": "document", "source": {"type": "url", "url": file["file_url"]}}
    inline = data_url(file.get("file_data"))
    if inline is None:
        raise refuse(f"{where}: a file given by file_id", "Anthropic")
    if inline[0] != "application/pdf":
        raise refuse(f"{where}: a {inline[0]!r} file", "Anthropic")
    return {"type": "document", "source": {"type": "base64", "media_type": inline[0], "data": inline[1]}}


def a2o_document(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A Claude document block as a Chat part: a PDF as a `file` part (named by its title), plain text as text."""
    source = block.get("source") or {}
    if (block.get("citations") or {}).get("enabled"):
        raise refuse(f"{where}: a document with citations", "OpenAI")
    if source.get("type") == "text":
        return {"type": "text", "text": source["data"]}
    if source.get("type") == "base64" and source.get("media_type") == "application/pdf":
        return {"type": "file", "file": {"filename": block.get("title") or "document.pdf",
                                         "file_data": f"data:application/pdf;base64,{source['data']}"}}
    raise refuse(f"{where}: a document from a {source.get('type')!r} source", "OpenAI")
