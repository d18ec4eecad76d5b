"""A large pass-through answer is read for its usage off the event loop.

Through the proxy with the official client, the emulator upstream. A legacy completion's answer is
read whole for its usage, and batch results line by line; both were parsed on the event loop every
team's requests share, whatever their size (up to MAX_LINE, 16 MiB): a completion with logprobs, or
echoing its prompt, is megabytes (70 ms of the loop for 3.5 MB). A body or line of 256 KiB or more is
read in the heavy-work pool now, as the team's work; a small one stays where it is.
"""

from __future__ import annotations

from pathlib import Path

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.offload import LARGE_BYTES
from sdk.passthrough import bodies
from tests.helpers import oai, running_where, write_policy

KEY = "sk-alpha-completion-read"


def test_a_large_completion_answer_is_read_in_the_heavy_work_pool(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch) -> None:
    read: list[tuple[bool, tuple[str, str]]] = []
    line = bodies.Tally._line

    def recorded(self: bodies.Tally, raw: bytes) -> None:
        read.append((len(raw) >= LARGE_BYTES, running_where()))
        line(self, raw)

    monkeypatch.setattr(bodies.Tally, "_line", recorded)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url)
    prompt = "the minutes of the meeting, read back in full. " * 6_000  # about 290 KB, echoed in the answer
    with running_proxy([tmp_path]) as proxy:
        client = oai(proxy, KEY)
        large = client.completions.create(model="gpt-3.5-turbo-instruct", prompt=prompt, echo=True, max_tokens=8)
        small = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hi.", max_tokens=8)
    assert large.usage and small.usage and len(large.choices[0].text) > len(prompt)
    assert read[0] == (True, ("slipstream-heavy", "alpha"))  # before: the event loop's thread
    assert len(read) == 2 and not read[1][0] and read[1][1][0] != "slipstream-heavy"
