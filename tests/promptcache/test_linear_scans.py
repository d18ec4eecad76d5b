"""Every pattern that reads client text is linear, and what one request may scan is bounded.

The old request-id pattern backtracked quadratically (`req-req-…`: ~13 s on 16 KB, on the event
loop); the property test below checks the linear rewrite finds exactly what it found, on inputs
short enough for the old one to finish.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sdk.promptcache.volatility import MAX_SCAN_CHARS, VolatilityDetector, _pattern_kind, _RequestId
from tests.helpers import cpu_seconds

OLD_REQUEST_ID = re.compile(
    r"\b(?:req|request|session|sess|trace|span|run|conv|conversation|msg|call|correlation)[ _-]?(?:id)?\s*[:=#]?\s*[\"']?"
    r"[A-Za-z0-9_-]*\d[A-Za-z0-9_-]{5,}", re.I)
PIECES = ["req", "request", "session", "trace", "run", "conv", "msg", "id", "ID", "_", "-", " ", ":", "=", "#", "'", '"',
          "1", "42", "a", "b9", "x", "."]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14).map("".join))
def test_request_id_finds_what_the_old_pattern_found(line):
    assert _RequestId().search(line) == bool(OLD_REQUEST_ID.search(line)), line


def test_request_id_examples():
    for line in ("request_id: 8f3a91c2d4", "session-7Gh2kq9d", "trace=abc123xyz", "req-abc123456", "Run ID #x9abcdef"):
        assert _RequestId().search(line), line
    for line in ("request handling is fast", "run the tests 3 times", "call me at 5", "req-req-req"):
        assert not _RequestId().search(line), line


def test_adversarial_lines_take_milliseconds():
    for atom in ("req-", "req", "request_id ", "1:", "Monday", "turn ", "a1-"):
        line = atom * (16384 // len(atom))
        # CPU seconds, which other processes do not inflate; the old pattern spent ~13 s here
        assert cpu_seconds(_pattern_kind, line)[0] < 0.5, atom
        assert cpu_seconds(_RequestId().search, line)[0] < 0.5, atom


def test_huge_texts_are_scanned_in_a_bounded_prefix():
    text = "Today is 2026-11-22 10:00 UTC\n" + ("plain line of prose\n" * 300_000) + "request_id: 8f3a91c2d4e5"  # ~6 MB
    detector = VolatilityDetector()
    took, findings = cpu_seconds(detector.scan, "system", text, 1)
    assert took < 3.0, took  # CPU seconds
    assert [f.kind for f in findings] == ["timestamp"]  # the id past MAX_SCAN_CHARS is never reported or moved
    assert "\n".join(detector.lines(text)) == text  # the unscanned tail is kept whole, so a move rebuilds the text
    assert len(detector.lines(text)) < MAX_SCAN_CHARS
