"""The tokens audio in a request is billed as: a Chat Completions `input_audio` part's clip by its
duration, and an earlier spoken answer named by its audio id.

OpenAI bills audio as tokens by its length (its Realtime cost guide, developers.openai.com/api/docs/guides/realtime-costs,
and the audio models' pages price audio tokens apart). The rate commonly given for the gpt-4o audio models is
10 tokens a second of user audio and 20 of assistant audio (1 per 100 ms and 1 per 50 ms; OpenAI's developer
forum, community.openai.com/t/971012); the API reference does not state it, so a budget's hold counts the
higher, `TOKENS_PER_SECOND` (20), leaning high.

A clip's duration is read from a WAV header (its sample rate and frame size, the data being the bytes after the
header at most), a few hundred bytes decoded; anything else (MP3, whose frames may each change bitrate; a header
that cannot be read) is counted by its size at the lowest bitrate a format the API takes can have (MPEG-2.5 layer
III's 8 kbit/s, `WORST_BYTES_PER_SECOND`) in a hold, and at 128 kbit/s, a common one, in an estimate.

An assistant message naming an earlier answer's audio (`{"role": "assistant", "audio": {"id"}}`) has OpenAI read
that audio again as input. Its length is not in the request: a hold counts the most audio one answer can carry,
`ANSWER_WORST` (16,384 tokens: the gpt-4o audio models' output limit, OpenAI's model pages), an estimate 1,000.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct

TOKENS_PER_SECOND = 20
WORST_BYTES_PER_SECOND = 1_000  # 8 kbit/s: the lowest MP3 bitrate (MPEG-2.5 layer III)
TYPICAL_BYTES_PER_SECOND = 16_000  # 128 kbit/s
# A header's byte rate is believed up to 48 kHz stereo 32-bit (a crafted rate far above it would make a long
# clip read as short; a real file above it is counted as longer than it is: leaning high)
MAX_WAV_BYTES_PER_SECOND = 48_000 * 2 * 4
ANSWER_WORST = 16_384
ANSWER_TYPICAL = 1_000
_HEAD_CHARS = 4 * 1024  # of base64: the WAV header and the chunks before `fmt ` (a LIST chunk, say)


def clip_tokens(data: str, worst: bool) -> int:
    """The tokens a base64 audio clip `data` is billed as: by its duration where a WAV header says it, else
    by its size at the lowest (`worst`) or a typical bitrate."""
    size = len(data) * 3 // 4  # its decoded bytes, without decoding them
    seconds = _wav_seconds(data, size)
    if seconds is None:
        seconds = size / (WORST_BYTES_PER_SECOND if worst else TYPICAL_BYTES_PER_SECOND)
    return math.ceil(seconds * TOKENS_PER_SECOND)


def _wav_seconds(data: str, size: int) -> float | None:
    """The duration a WAV clip's `fmt ` chunk gives its bytes (all of them counted as samples), or None."""
    head_chars = min(len(data), _HEAD_CHARS) // 4 * 4
    try:
        head = base64.b64decode(data[:head_chars], validate=False)
    except (binascii.Error, ValueError):
        return None
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    at = 12
    while at + 8 <= len(head):
        kind, length = head[at:at + 4], struct.unpack_from("<I", head, at + 4)[0]
        if kind == b"fmt " and at + 24 <= len(head):
            channels, rate = struct.unpack_from("<HI", head, at + 10)
            block = struct.unpack_from("<H", head, at + 20)[0]
            per_second = rate * max(block, 1) if channels else 0
            if per_second <= 0:
                return None
            # never longer than its size at the lowest bitrate (a header claiming 1 Hz), nor shorter than at MAX
            return size / min(max(per_second, WORST_BYTES_PER_SECOND), MAX_WAV_BYTES_PER_SECOND)
        at += 8 + length + (length & 1)
    return None
