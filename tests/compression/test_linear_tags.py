"""Document tags are found in one linear pass, exactly where the old lazy regex found them."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.compression.documents import _tagged
from tests.helpers import cpu_seconds

OLD = re.compile(r"<(document|context)\b[^>]*>(.*?)</\1\s*>", re.DOTALL | re.IGNORECASE)
PIECES = ["<document>", "</document>", "<context id=1>", "</context>", "<DOCUMENT>", "</Document >", "text ", "<", ">", "\n"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=12).map("".join))
def test_same_spans_as_the_lazy_regex(text):
    assert _tagged(text) == [m.span(2) for m in OLD.finditer(text)]


def test_unclosed_tags_take_milliseconds():
    text = "<document>" * 20_000  # the lazy regex rescans the rest of the text from every one (minutes)
    took, spans = cpu_seconds(_tagged, text)
    assert spans == []
    assert took < 2.0  # CPU seconds, which other processes do not inflate; the old regex takes minutes
