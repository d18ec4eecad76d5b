"""How many pages a PDF a request carries has: what the provider bills it for, counted from its bytes.

Anthropic bills a PDF document page by page (each page's text and the page as an image: about 1,500 to
3,000 tokens a page, its PDF support guide), and OpenAI's file inputs put each page's text and an image
of it in the model's context too (its file inputs guide): a flat cost per document let a team hold, and
be charged when it left early, about 1% of a 100-page document. The count is cheap and bounded: the
base64 is decoded (bounded by the body limit), and page objects are counted with one regular
expression (`/Type /Page`, not `/Pages`; names written with `#xx` escapes too), or the page tree's
`/Count`, whichever is more. Object streams (PDF 1.5+, where most writers put the page tree) are
inflated, within a bound, and counted the same way. A PDF whose pages cannot be counted so counts a
bound a crafted file cannot undercut (high for an honest one, which always names its pages and writes
its object streams in Flate): a page per `FALLBACK_PAGE_BYTES` when no page is found, and as many as
its object streams could hold expanded `MAX_EXPANSION` times when one cannot be read (another filter,
broken, past the inflate bound).
"""

from __future__ import annotations

import math
import re
import zlib

from sdk.file_text import decoded

FALLBACK_PAGE_BYTES = 16  # less than the smallest a page object can be written in: the bound when no page is found
MAX_EXPANSION = 1_500  # the most a compressed stream may expand (Flate 1,032:1, LZW about 1,300:1): an unread object stream's bound
INFLATE_FACTOR = 32  # object streams are inflated to at most this many times the PDF's size (and INFLATE_MAX)
INFLATE_MAX = 64 * 1024 * 1024
_WHITE = rb"(?:[\x00\t\n\f\r ]++|%[^\r\n]*+)*+"  # whitespace and comments between tokens (possessive: linear)
_END = rb"(?=[\x00\t\n\f\r ()<>\[\]{}/%]|$)"  # where a name ends


def _name(word: str) -> bytes:
    """A PDF name's characters, each also as its `#xx` escape (`/P#61ge` is `/Page`)."""
    parts = []
    for char in word:
        hex_ = f"{ord(char):02x}"
        parts.append(b"(?:" + re.escape(char.encode()) + b"|#" + b"".join(f"[{d}{d.upper()}]".encode() for d in hex_) + b")")
    return b"".join(parts)


_PAGE = re.compile(rb"/" + _name("Type") + _WHITE + rb"/" + _name("Page") + _END)
_OBJECT_STREAM = re.compile(rb"/" + _name("Type") + _WHITE + rb"/" + _name("ObjStm") + _END)
_COUNT = re.compile(rb"/" + _name("Count") + _WHITE + rb"(\d{1,12})")
_STREAM = re.compile(rb"stream\r?\n")


def is_pdf(value: str, media_type: object = None) -> bool:
    """Whether `value` (base64, or a data URL) holds a PDF: said so by its media type or data URL, or
    starting with `%PDF` (base64 `JVBER`)."""
    if value.startswith("data:"):
        return "application/pdf" in value[:64].partition(",")[0]
    return media_type == "application/pdf" or value.startswith("JVBER")


def pdf_pages(value: str) -> int:
    """The pages of the PDF in `value` (base64, or a data URL), as the module says: at least 1."""
    value, pdf = decoded(value)
    size = max(len(pdf), len(value) * 3 // 4)
    bound = max(1, math.ceil(size / FALLBACK_PAGE_BYTES))
    unread = math.ceil(size * MAX_EXPANSION / FALLBACK_PAGE_BYTES)  # an object stream not read may hold this many
    texts = [pdf]
    budget = min(INFLATE_MAX, INFLATE_FACTOR * len(pdf))
    for found in _OBJECT_STREAM.finditer(pdf):
        start = _STREAM.search(pdf, found.end())
        end = pdf.find(b"endstream", start.end()) if start is not None else -1
        if start is None or budget <= 0:
            return unread
        inflater = zlib.decompressobj()
        try:  # writers compress object streams with Flate; one in another filter (or none) is not read here
            text = inflater.decompress(pdf[start.end(): end if end >= 0 else len(pdf)], budget)
        except zlib.error:
            return unread
        if inflater.unconsumed_tail:
            return unread  # past the bound
        budget -= len(text)
        texts.append(text)
    pages = count = 0
    for text in texts:
        pages += len(_PAGE.findall(text))
        count = max([count, *(int(n) for n in _COUNT.findall(text))])
    found_pages = max(pages, count)
    return min(found_pages, unread) if found_pages else bound  # a /Count that lies high harms its sender only
