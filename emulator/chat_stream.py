"""Chat Completions choices: the non-streaming message and the streamed chunk sequence (C.5),
with `n > 1` choices interleaved as the real API sends them and per-delta logprobs."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import orjson

from .logprobs import tokens_of
from .reply import Reply
from .text import split_chunks, split_deltas

AUDIO_DATA = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA="  # an empty 8 kHz WAV
AUDIO_EXPIRES_AT = 4102444800  # 2100-01-01: the emulator keeps no clock for audio
FINISH = {"end": "stop", "max": "length", "stop_sequence": "stop", "tool": "tool_calls"}


@dataclass(slots=True)
class Choice:
    index: int
    reply: Reply
    call_ids: list[str]  # one per tool call of the reply (Reply.calls); empty when the reply is text
    logprobs: list[dict[str, Any]] | None  # `logprobs.content` entries, when asked for
    refusal: str | None = None  # a structured-output refusal: in place of the content
    audio_id: str = ""  # audio output (`modalities: ["text", "audio"]`): the id a later turn names it by
    named: bool = False  # the request named the function to call (tool_choice {type: function})
    interleave: bool = False  # stream a parallel turn's calls interleaved, fragment by fragment (parallel.py)

    def finish(self) -> str:
        """The choice's finish_reason. A call of the function the request named ends `stop`, as OpenAI's do
        (`tool_calls` for a call the model chose or `required` forced: vllm-project/vllm#25054's captures)."""
        return "stop" if self.named and self.reply.stop == "tool" else FINISH[self.reply.stop]

    def message(self) -> dict[str, Any]:
        r = self.reply
        msg: dict[str, Any] = {"role": "assistant", "content": None if self.refusal else r.text or None,
                               "refusal": self.refusal, "annotations": []}
        if r.tool_name:
            msg["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.json}}
                                 for cid, c in zip(self.call_ids, r.calls(), strict=True)]
        if self.audio_id:  # the spoken answer: its text is the transcript, not the content
            msg["content"], msg["audio"] = None, self.audio()
        lp = None if self.logprobs is None else {"content": self.logprobs, "refusal": None}
        return {"index": self.index, "message": msg, "logprobs": lp,
                "finish_reason": self.finish()}

    def audio(self) -> dict[str, Any]:
        return {"id": self.audio_id, "data": AUDIO_DATA, "expires_at": AUDIO_EXPIRES_AT, "transcript": self.reply.text}

    def deltas(self, tokens_per_delta: int) -> list[tuple[dict[str, Any], Any, str | None, int]]:
        """(delta, logprobs, finish_reason, output tokens) per chunk of this choice."""
        r = self.reply
        out: list[tuple[dict[str, Any], Any, str | None, int]] = []
        if self.audio_id:  # one audio delta (OpenAI sends the id first, then data and transcript pieces)
            out.append(({"role": "assistant", "content": None, "refusal": None, "audio": self.audio()}, None, None,
                        max(1, r.output_tokens)))
        elif self.refusal:
            out.append(({"role": "assistant", "content": None, "refusal": ""}, None, None, 0))
            out += [({"refusal": piece}, None, None, tokens_per_delta) for piece in split_deltas(self.refusal, tokens_per_delta)]
        elif r.tool_name:
            # OpenAI streams parallel calls one after another: a call's first delta has its index, id and name
            # (the first also the role), later ones only the index and argument fragments
            per_call: list[list[tuple[dict[str, Any], Any, str | None, int]]] = []
            for j, (cid, c) in enumerate(zip(self.call_ids, r.calls(), strict=True)):
                head: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None} if j == 0 else {}
                rows: list[tuple[dict[str, Any], Any, str | None, int]] = [(dict(head, tool_calls=[{"index": j, "id": cid, "type": "function",
                                                 "function": {"name": c.name, "arguments": ""}}]), None, None, 0)]
                rows += [({"tool_calls": [{"index": j, "function": {"arguments": frag}}]}, None, None, max(1, len(frag) // 4))
                         for frag in split_chunks(c.json, 3)]
                per_call.append(rows)
            if self.interleave:  # round-robin: every call's head, then the calls' fragments in turn
                out += [row for step in zip_longest(*per_call) for row in step if row is not None]
            else:
                out += [row for rows in per_call for row in rows]
        else:
            out.append(({"role": "assistant", "content": "", "refusal": None}, None, None, 0))
            pos = 0
            for piece in split_deltas(r.text, tokens_per_delta) if r.text else ():
                n = len(tokens_of(piece)) if self.logprobs is not None else tokens_per_delta
                lp = None
                if self.logprobs is not None:
                    lp = {"content": self.logprobs[pos: pos + n], "refusal": None}
                    pos += n
                out.append(({"content": piece}, lp, None, tokens_per_delta))
        out.append(({}, None, self.finish(), 0))
        return out


def chunks(head: dict[str, Any], choices: list[Choice], usage: dict[str, Any] | None,
           tokens_per_delta: int) -> tuple[list[bytes], list[int]]:
    """SSE events (choices round-robin, then the usage chunk when asked for, then [DONE]) and the
    output tokens that pace each one."""
    base = dict(head)
    if usage is not None:
        base["usage"] = None  # every chunk but the last carries usage: null
    per_choice = [c.deltas(tokens_per_delta) for c in choices]
    ev: list[bytes] = []
    toks: list[int] = []
    for step in zip_longest(*per_choice):
        paced = False  # choices are generated in parallel: one step costs one delta's time
        for c, row in zip(choices, step, strict=True):
            if row is None:
                continue
            delta, lp, finish, n = row
            base["choices"] = [{"index": c.index, "delta": delta, "logprobs": lp,
                                "finish_reason": finish}]  # `base` is ours: reuse it per chunk
            ev.append(b"data: " + orjson.dumps(base) + b"\n\n")
            toks.append(0 if paced else n)
            paced = paced or n > 0
    if usage is not None:
        ev.append(b"data: " + orjson.dumps(dict(base, choices=[], usage=usage)) + b"\n\n")
        toks.append(0)
    ev.append(b"data: [DONE]\n\n")
    toks.append(0)
    return ev, toks
