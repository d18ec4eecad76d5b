"""Images and documents between the dialects: Claude's image and document blocks (base64, URL and text
sources) and Chat's image_url and file parts (data URLs, URLs)."""

from __future__ import annotations

import base64
import re
from typing import Any

from sdk.routing.translation.fields import refuse

# Files whose content is text (plain text, Markdown, CSV, JSON, XML, YAML, code): OpenAI's Responses API takes them
# as input_file and gives the model their text ("Non-PDF document and text files: the API extracts text only");
# Claude reads text as a document with a text source, and a Chat model as a text part (Chat takes files as PDFs only).
_TEXTUAL = re.compile(r"^(text/[\w.+-]+|application/(json|xml|(x-)?yaml|toml|sql|(x-)?(java|type)script|x-(sh|python)|[\w.-]+\+(json|xml)))$")


def image_url(source: dict[str, Any], where: str) -> str:
    if source.get("type") == "base64":
        return f"data:{source['media_type']};base64,{source['data']}"
    if source.get("type") == "url":
        url: str = source["url"]  # as the client sent it (a Messages url source's url is a string)
        return url
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


def textual(file_data: Any) -> bool:
    """Whether an inline file (a data URL) holds text."""
    inline = data_url(file_data)
    return inline is not None and bool(_TEXTUAL.match(inline[0].lower()))


def file_text(file_data: Any, where: str, target: str) -> str | None:
    """The text of an inline file whose content is text (UTF-8), or None for any other file."""
    inline = data_url(file_data)
    if inline is None or not textual(file_data):
        return None
    try:
        return base64.b64decode(inline[1]).decode("utf-8")
    except UnicodeDecodeError:
        raise refuse(f"{where}: a {inline[0]!r} file that is not UTF-8 text", target) from None


def o2a_document(file: dict[str, Any], where: str) -> dict[str, Any]:
    """A Chat `file` part given inline (a PDF, as OpenAI takes them; a text file, as a Responses input_file) as a
    Claude document block: a PDF's, or a text source named by its file name."""
    if isinstance(file.get("file_url"), str):  # a Responses input_file by URL (responses_requests._part)
        return {"type": "document", "source": {"type": "url", "url": file["file_url"]}}
    text = file_text(file.get("file_data"), where, "Anthropic")
    if text is not None:
        titled = {"title": file["filename"]} if isinstance(file.get("filename"), str) and file["filename"] else {}
        return {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}, **titled}
    inline = data_url(file.get("file_data"))
    if inline is None:
        raise refuse(f"{where}: a file given by file_id", "Anthropic")
    if inline[0] != "application/pdf":
        raise refuse(f"{where}: a {inline[0]!r} file", "Anthropic")
    return {"type": "document", "source": {"type": "base64", "media_type": inline[0], "data": inline[1]}}


def a2o_document(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A Claude document block as Chat parts: a PDF as a `file` part (named by its title), plain text
    as text, and a custom-content document (`source.type: content`, the client's own chunks) as its
    text blocks' text, one after another. Its `title` and `context` are given to Claude with the document
    (Anthropic's citations guide, platform.claude.com/docs/en/build-with-claude/citations; the Vercel AI SDK's
    anthropic provider sends a file's name as the title): they lead a text document's text, as a search
    result's title leads its own, and a PDF's context is a text part before the file (its title, the file's name)."""
    source = block.get("source") or {}
    if (block.get("citations") or {}).get("enabled"):
        raise refuse(f"{where}: a document with citations", "OpenAI")
    context = block.get("context") if isinstance(block.get("context"), str) and block["context"] else None
    if source.get("type") == "text":
        return [_headed(block, context, source["data"])]
    if source.get("type") == "content":
        chunks = source.get("content")
        if isinstance(chunks, str):
            return [_headed(block, context, chunks)]
        if isinstance(chunks, list) and all(isinstance(c, dict) and c.get("type") == "text" for c in chunks):
            return [_headed(block, context, "\n\n".join(str(c.get("text", "")) for c in chunks))]
        raise refuse(f"{where}: a custom-content document with blocks other than text", "OpenAI")
    if source.get("type") == "base64" and source.get("media_type") == "application/pdf":
        file = {"type": "file", "file": {"filename": block.get("title") or "document.pdf",
                                         "file_data": f"data:application/pdf;base64,{source['data']}"}}
        return [{"type": "text", "text": context}, file] if context else [file]
    raise refuse(f"{where}: a document from a {source.get('type')!r} source", "OpenAI")


def _headed(block: dict[str, Any], context: str | None, text: Any) -> dict[str, Any]:
    """A text document's text as a text part, under its title and context where it has them."""
    header = "\n".join(value for value in (block.get("title"), context) if isinstance(value, str) and value)
    return {"type": "text", "text": f"{header}\n\n{text}" if header else text}
