"""Deterministic log-probabilities for the emulator's replies (`logprobs` / `top_logprobs`).

Each token gets a logprob in [-2.5, 0) from a hash of (token, position); its `top_logprobs`
list starts with the token itself and continues with other vocabulary words at lower values,
so the chosen token is always the most likely one, as with greedy decoding.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .text import encoding, vocabulary


def tokens_of(text: str) -> list[str]:
    enc = encoding()
    return [enc.decode([t]) for t in enc.encode_ordinary(text)]


def _lp(token: str, pos: int) -> float:
    h = hashlib.blake2b(f"{pos}\x00{token}".encode(), digest_size=2).digest()
    return -round((int.from_bytes(h, "little") % 2500) / 1000.0 + 0.0001, 4)


def chat_entries(text: str, top: int, start: int = 0) -> list[dict[str, Any]]:
    """Chat Completions `logprobs.content` entries for `text` (positions from `start`)."""
    vocab = vocabulary()
    out = []
    for i, tok in enumerate(tokens_of(text), start):
        lp = _lp(tok, i)
        alts = [{"token": tok, "logprob": lp, "bytes": list(tok.encode())}]
        for j in range(1, top):
            alt = " " + vocab[(i * 7 + j) % len(vocab)]
            if alt == tok:
                alt = " " + vocab[(i * 7 + j + 1) % len(vocab)]
            alts.append({"token": alt, "logprob": round(lp - j * 0.75, 4), "bytes": list(alt.encode())})
        out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": alts[:top]})
    return out


def completion_logprobs(text: str, top: int, offset: int) -> dict[str, Any]:
    """Legacy completions `logprobs` object (tokens, token_logprobs, top_logprobs, text_offset)."""
    entries = chat_entries(text, max(1, top))
    offsets, pos = [], offset
    for e in entries:
        offsets.append(pos)
        pos += len(e["token"])
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"][:top]}
                             for e in entries] if top else None,
            "text_offset": offsets}
