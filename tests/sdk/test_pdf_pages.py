"""A PDF's pages, counted from its bytes: what the provider bills a PDF for (sdk/pdf_pages.py)."""

from __future__ import annotations

import base64
import binascii
import math

from sdk.pdf_pages import FALLBACK_PAGE_BYTES, MAX_EXPANSION, is_pdf, pdf_pages
from tests.helpers import blank_pdf


def _b64(pdf: bytes) -> str:
    return base64.b64encode(pdf).decode()


def test_pages_are_counted_in_the_file_and_in_its_object_streams() -> None:
    for pages in (1, 7, 100):
        assert pdf_pages(_b64(blank_pdf(pages))) == pages  # /Pages, the tree's root, is no page
        assert pdf_pages(_b64(blank_pdf(pages, object_stream=True))) == pages
        assert pdf_pages("data:application/pdf;base64," + _b64(blank_pdf(pages, object_stream=True))) == pages


def test_pages_a_file_hides_are_bounded_by_its_size() -> None:
    escaped = blank_pdf(40).replace(b"/Type /Page /", b"/Type /P#61ge /").replace(b"/Count 40", b"/Count 1")
    assert pdf_pages(_b64(escaped)) == 40  # a name's #xx escapes are the same name to a reader
    # an object stream this count cannot read: as many pages as it could hold, expanded as far as a filter may
    hidden = blank_pdf(100, object_stream=True, filter_=b"/ASCIIHexDecode", encode=binascii.hexlify)
    assert pdf_pages(_b64(hidden)) == math.ceil(len(hidden) * MAX_EXPANSION / FALLBACK_PAGE_BYTES)
    empty = b"%PDF-1.7\n% no page named\n"  # no page found: a page per FALLBACK_PAGE_BYTES
    assert pdf_pages(_b64(empty)) == math.ceil(len(empty) / FALLBACK_PAGE_BYTES)


def test_only_pdfs_are_read_as_pdfs() -> None:
    assert is_pdf(_b64(blank_pdf(1)))
    assert is_pdf("data:application/pdf;base64,AAAA") and is_pdf("AAAA", "application/pdf")
    assert not is_pdf("data:image/png;base64," + _b64(b"\x89PNG")) and not is_pdf("iVBORw0KGgo", "image/png")
