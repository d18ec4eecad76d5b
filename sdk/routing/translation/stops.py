"""Chat stop strings Claude refuses, applied by the gateway instead.

Claude answers a whitespace-only stop sequence (`"\\n"`, which completion-style Chat clients send to
get one line) with a 400 ("each stop sequence must contain non-whitespace"), where OpenAI's APIs take
it. Such a stop is not sent: the gateway cuts the answer where one first appears, as OpenAI would have
stopped there (`finish_reason: "stop"`, nothing after it: neither text nor tool calls). An empty stop
string stops nothing and is left out. The usage stays the upstream's: what Claude wrote and billed.
A Messages request's stop sequences an OpenAI model would refuse are refused before anything is sent
(`refuse_openai_stops`, which fields.check runs).
"""

from __future__ import annotations

from typing import Any

from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation.models import reasons


def split_stops(stop: Any) -> tuple[list[str], tuple[str, ...]]:
    """A Chat `stop` (a string or a list) as (Claude's stop_sequences, the stops the gateway applies)."""
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    return [s for s in stops if s.strip()], tuple(s for s in stops if s and not s.strip())


def _first(text: str, stops: tuple[str, ...]) -> int:
    """Where the first of `stops` starts in `text`, or -1."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found, default=-1)


class StopCutter:
    """Cuts streamed text at the first of `stops`, holding back a tail that may be the start of one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.held = ""
        self.hit = False  # a stop appeared: nothing after it is sent

    def feed(self, text: str) -> str:
        """What of `text` can be sent now."""
        if self.hit or not self.stops:
            return "" if self.hit else text
        text, self.held = self.held + text, ""
        at = _first(text, self.stops)
        if at >= 0:
            self.hit = True
            return text[:at]
        tail = max((n for s in self.stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - tail:] if tail else ""
        return text[:len(text) - tail]

    def flush(self) -> str:
        """The held tail, once the text it might have continued has ended."""
        held, self.held = self.held, ""
        return held


def cut(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the first of `stops`, and whether one appeared."""
    at = _first(text, stops) if stops else -1
    return (text[:at], True) if at >= 0 else (text, False)


# OpenAI's Chat Completions take at most 4 stop sequences (Claude takes more), and its reasoning models none
# ("Unsupported parameter: 'stop' is not supported with this model.").
OPENAI_MAX_STOPS = 4


def refuse_openai_stops(stops: Any, model: Any) -> None:
    """Refuses, before anything is sent, the stop sequences an OpenAI model would answer with a 400."""
    if not stops:
        return
    if reasons(model):
        raise TranslationRefused(f"'stop_sequences' cannot be translated for an OpenAI target ({model} is a reasoning "
                                 "model, which takes no stop sequences); send it to a target of its own protocol")
    if isinstance(stops, list) and len(stops) > OPENAI_MAX_STOPS:
        raise TranslationRefused(f"'stop_sequences' cannot be translated for an OpenAI target (OpenAI takes at most "
                                 f"{OPENAI_MAX_STOPS} stop sequences, {len(stops)} were sent); send it to a target of its own protocol")
