"""A batch input file's long lines are read off the event loop, and joined once.

A batch input line may be 16 MiB (`MAX_LINE`), and a file as large as the team's upload limit (512 MiB by
default). The pass-through reads each line twice: as the upload streams (its client ids keyed to the team,
`keyed_upload`) and when the batch is created (the file read back and checked: files, account objects,
models, worst cost, `input_file_parts`). Both parsed and walked every line on the event loop every team's
requests share, whatever its size, and the read-back added each piece of a line to the line so far, copying
and searching it again: a 16 MiB line in 64 KiB pieces was about 2 GiB copied, a second of the loop. Lines of
256 KiB or more are read in the heavy-work pool now, as the team's work, and a line's pieces are joined once.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.limits.stage import LimitsStage
from sdk.offload import LARGE_BYTES, TENANT
from sdk.passthrough import bodies
from sdk.passthrough.bodies import Lines
from sdk.state import answer_ids
from tests.helpers import oai, write_policy

KEY = "sk-alpha-lines"
PRICED = 'pricing: {"gpt-4o-mini": {input: 1000, output: 2000}}\n'


def _line(cid: str, turns: int) -> bytes:
    messages = [{"role": "user", "content": f"note {i} of the day's minutes"} for i in range(turns)]
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "gpt-4o-mini", "max_tokens": 8, "user": "clerk-7", "messages": messages}})


def _where() -> tuple[str, str]:
    return threading.current_thread().name.rsplit("-", 1)[0], TENANT.get()


def test_a_large_batch_input_line_is_read_in_the_heavy_work_pool(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                 monkeypatch) -> None:
    """Keyed as it is uploaded, parsed and costed when the batch is created: each on the loop's thread
    before (uvicorn's), in the heavy-work pool as alpha's work now; a small line stays where it is."""
    big, small = _line("big", 7_000), _line("small", 1)
    assert len(big) >= LARGE_BYTES > len(small)
    keyed: list[tuple[bool, tuple[str, str]]] = []
    parsed: list[tuple[bool, tuple[str, str]]] = []
    costed: list[tuple[bool, tuple[str, str]]] = []
    walked: list[tuple[bool, tuple[str, str]]] = []  # for the audio ids it names
    keyed_line, input_file_lines, reservation = bodies.keyed_line, bodies.input_file_lines, LimitsStage.reservation
    named_audio = answer_ids.named_audio

    def recorded_keyed(line: bytes, team: str) -> bytes:
        keyed.append((len(line) >= LARGE_BYTES, _where()))
        return keyed_line(line, team)

    def recorded_parsed(lines: Any) -> Any:
        lines = list(lines)
        parsed.append((any(len(line) >= LARGE_BYTES for line in lines), _where()))
        return input_file_lines(iter(lines))

    def recorded_walk(body: Any) -> list[str]:
        walked.append((len(body.get("messages") or ()) > 1, _where()))
        return named_audio(body)

    def recorded_cost(self: LimitsStage, request: Any, *args: Any, **kwargs: Any) -> float:
        costed.append((len(request.body.get("messages") or ()) > 1, _where()))
        return reservation(self, request, *args, **kwargs)

    monkeypatch.setattr(bodies, "keyed_line", recorded_keyed)
    monkeypatch.setattr(bodies, "input_file_lines", recorded_parsed)
    monkeypatch.setattr(LimitsStage, "reservation", recorded_cost)
    monkeypatch.setattr(answer_ids, "named_audio", recorded_walk)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra=PRICED)
    with running_proxy([tmp_path]) as proxy:
        client = oai(proxy, KEY)
        source = client.files.create(file=("in.jsonl", small + b"\n" + big + b"\n"), purpose="batch")
        assert client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id
    heavy = ("slipstream-heavy", "alpha")
    for name, ran in (("keyed", keyed), ("parsed", parsed), ("costed", costed), ("walked", walked)):
        assert [where for large, where in ran if large] == [heavy], name  # before: the loop's thread
        # The upload is large, so its every line is keyed in the pool (test_an_uploads_short_lines_...).
        assert all((where != heavy) != (name == "keyed") for large, where in ran if not large), name


def test_an_uploads_short_lines_are_keyed_in_the_heavy_work_pool(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                 monkeypatch) -> None:
    """A large upload of short lines: each line was keyed on the loop where it arrived, about 40 ms for
    256 KiB of them (each names its user), and a file may be 512 MiB. An upload of 256 KiB or more is
    keyed a piece at a time in the heavy-work pool as the team's work now; a small one stays on the loop."""
    keyed: list[tuple[str, str]] = []
    keyed_line = bodies.keyed_line

    def recorded_keyed(line: bytes, team: str) -> bytes:
        keyed.append(_where())
        return keyed_line(line, team)

    monkeypatch.setattr(bodies, "keyed_line", recorded_keyed)
    many = b"".join(_line(f"q{i}", 1) + b"\n" for i in range(2_000))
    assert len(many) >= LARGE_BYTES
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url)
    with running_proxy([tmp_path]) as proxy:
        client = oai(proxy, KEY)
        client.files.create(file=("many.jsonl", many), purpose="batch")
        large = list(keyed)
        keyed.clear()
        client.files.create(file=("few.jsonl", _line("one", 1) + b"\n"), purpose="batch")
    assert len(large) >= 2_000 and set(large) == {("slipstream-heavy", "alpha")}  # before: the loop's thread
    assert keyed and all(where[0] != "slipstream-heavy" for where in keyed)  # the line and the framing's blank lines


def test_a_long_lines_pieces_are_joined_once() -> None:
    """Each piece of a line that came in many was added to the line so far, copying it all again (and the
    whole searched again for its end): the line's size squared over the piece size, on the loop."""
    copied = [0]

    class Piece(bytes):
        def __radd__(self, other: bytes) -> bytes:  # `line so far + piece`: the copy of the line so far
            copied[0] += len(other)
            return bytes(other) + bytes(self)

    line = b'{"custom_id": "long", "body": "' + b"x" * (64 * 65536) + b'"}'
    stream = line + b"\n" + b'{"custom_id": "next"}\n{"custom_id": "last"}'
    lines = Lines()
    found = [got for i in range(0, len(stream), 65536) for got in lines.feed(Piece(stream[i:i + 65536]))]
    assert [*found, *lines.end()] == [line, b'{"custom_id": "next"}', b'{"custom_id": "last"}']
    assert copied[0] == 0  # about 130 MiB re-copied for this 4 MiB line before


def test_a_line_too_long_to_read_is_skipped_and_counted_once() -> None:
    """A line past MAX_LINE is let go as it arrives (never held whole), and the lines after it are read."""
    lines = Lines()
    piece = b"x" * (1 << 20)
    found = [got for _ in range(bodies.MAX_LINE // len(piece) + 2) for got in lines.feed(piece)]
    found += lines.feed(b"x\n" + b'{"after": 1}\n')
    assert found == [b'{"after": 1}'] and lines.skipped == 1
