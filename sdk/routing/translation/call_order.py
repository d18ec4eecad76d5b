"""A Chat stream's tool calls, one after another.

Chat keys every `tool_calls[]` delta by its call's index, so an OpenAI-compatible upstream may interleave two calls'
argument fragments (OpenAI's own API sends one call after another). Claude's stream and the Responses stream hold one
block or item open at a time, and clients act on its end (an agent runs a tool at its tool_use block's stop, at its
function_call item's `output_item.done`), so the translators (streams.OpenAIToAnthropic,
responses_streams.ChatToResponses) take the deltas through `CallOrder`: a call whose deltas come while the open call's
arguments are not yet whole JSON is held, and given once they are (or at the stream's end) as one delta with its id,
name and arguments so far. Calls one after another pass as they come."""

from __future__ import annotations

from typing import Any

import orjson


class CallOrder:
    def __init__(self) -> None:
        self.current: int | None = None  # the index of the call being given
        self.arguments = ""  # its arguments so far
        self.given: set[int] = set()  # indexes of the calls given so far
        self.held: dict[int, dict[str, Any]] = {}  # calls not yet given (their first delta, arguments so far), in arrival order

    def feed(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        """The deltas to translate now for one `tool_calls[]` delta, in order."""
        index = call.get("index", 0)
        fragment = (call.get("function") or {}).get("arguments") or ""
        if index in self.given:  # the open call (or, past its whole JSON, an earlier one: passed on as it came)
            if index == self.current:
                self.arguments += fragment
            return [call, *self._release()] if self.held else [call]
        held = self.held.get(index)
        if held is None:
            self.held[index] = {**call, "function": {**(call.get("function") or {}), "arguments": fragment}}
        else:
            for key in ("id", "type"):  # as a later delta may bring them (none of OpenAI's do)
                if not held.get(key) and call.get(key):
                    held[key] = call[key]
            function, name = held["function"], (call.get("function") or {}).get("name")
            if not function.get("name") and name:
                function["name"] = name
            function["arguments"] += fragment
        return self._release()

    def flush(self) -> list[dict[str, Any]]:
        """The calls still held, at the stream's end."""
        return self._release(everything=True)

    def _release(self, everything: bool = False) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while self.held and (everything or self.current is None or _whole(self.arguments)):
            index = next(iter(self.held))
            call = self.held.pop(index)
            self.current, self.arguments = index, call["function"]["arguments"]
            self.given.add(index)
            out.append(call)
        return out


def _whole(arguments: str) -> bool:
    """Whether a call's arguments so far are a whole JSON value (nothing more can follow)."""
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return False
    return True
