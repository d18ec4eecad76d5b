"""Chat stop strings Claude refuses, applied by the gateway instead.

Claude answers a whitespace-only stop sequence (`"\\n"`, which completion-style Chat clients send to
get one line) with a 400 ("each stop sequence must contain non-whitespace"), where OpenAI's APIs take
it. Such a stop is not sent: the gateway cuts the answer where one first appears, as OpenAI would have
stopped there (`finish_reason: "stop"`, nothing after it: neither text nor tool calls). An empty stop
string stops nothing and is left out.
The other way, a Messages request's stop sequences an OpenAI model would refuse (any, to a reasoning model, which
takes none; more than OpenAI's 4) are the gateway's too, all of them (OpenAI does not say which of its own ended an
answer): the answer is cut where one first appears and ends `stop_reason: "stop_sequence"`, naming it, as Claude's
(`openai_stops`).

A stream ends at the stop, as the provider's own would: the client gets the answer's end at once and the upstream
call is closed there (streams.translated_events), so the model stops writing, and being billed, past it; the usage is
the gateway's count of what the model wrote up to the cut (the input its message_start said, the text counted as
sdk/stream_tally.py counts a stream the client left), charged marked `estimated`. A body is known only once the model
has finished: it is cut, and its usage is the upstream's, all the model wrote and billed.

An OpenAI reasoning model writes, and bills as output, reasoning it does not stream (OpenAI's reasoning guide). What a
cut stream of one wrote is not known, only bounded by the output limit it was sent, and that is what its charge is at
least (`cut_bound`): a team cannot spend past its budget by having its streams cut. (Claude's thinking, billed whole
where streamed summarized, is not asked for by a translated Chat request, which sends no `thinking`.)
"""

from __future__ import annotations

from typing import Any

from sdk.routing.translation.models import reasons, reasons_unseen


def split_stops(stop: Any) -> tuple[list[str], tuple[str, ...]]:
    """A Chat `stop` (a string or a list) as (Claude's stop_sequences, the stops the gateway applies)."""
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    return [s for s in stops if s.strip()], tuple(s for s in stops if s and not s.strip())


def _first(text: str, stops: tuple[str, ...]) -> int:
    """Where the first of `stops` starts in `text`, or -1."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found, default=-1)


def _which(text: str, at: int, stops: tuple[str, ...]) -> str:
    """The stop that starts at `at` in `text` (the longest, where several do)."""
    return max((s for s in stops if text.startswith(s, at)), key=len)


class StopCutter:
    """Cuts streamed text at the first of `stops`, holding back a tail that may be the start of one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.held = ""
        self.hit = False  # a stop appeared: nothing after it is sent
        self.matched: str | None = None  # the stop that appeared

    def feed(self, text: str) -> str:
        """What of `text` can be sent now."""
        if self.hit or not self.stops:
            return "" if self.hit else text
        text, self.held = self.held + text, ""
        at = _first(text, self.stops)
        if at >= 0:
            self.hit, self.matched = True, _which(text, at, self.stops)
            return text[:at]
        tail = max((n for s in self.stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - tail:] if tail else ""
        return text[:len(text) - tail]

    def flush(self) -> str:
        """The held tail, once the text it might have continued has ended."""
        held, self.held = self.held, ""
        return held


def stopped(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """`text` up to the first of `stops`, and the stop that appeared there (None: none did)."""
    at = _first(text, stops) if stops else -1
    return (text[:at], _which(text, at, stops)) if at >= 0 else (text, None)


def cut(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the first of `stops`, and whether one appeared."""
    text, matched = stopped(text, stops)
    return text, matched is not None


# OpenAI's Chat Completions take at most 4 stop sequences (Claude takes more), and its reasoning models none
# ("Unsupported parameter: 'stop' is not supported with this model.").
OPENAI_MAX_STOPS = 4


def openai_stops(stops: Any, model: Any) -> tuple[Any, tuple[str, ...]]:
    """A Messages request's stop_sequences for the OpenAI model `model`: (the `stop` it is sent, None for none; the stops
    the gateway applies). Those the model would refuse are all the gateway's."""
    if not isinstance(stops, list) or not stops:
        return stops or None, ()
    if reasons(model) or len(stops) > OPENAI_MAX_STOPS:
        return None, tuple(s for s in stops if isinstance(s, str) and s)
    return stops, ()


def cut_bound(body: dict[str, Any]) -> int:
    """What a stream cut at a stop the gateway applies is charged for output at least: the output limit the upstream
    Chat `body` was sent where its model reasons unseen (models.reasons_unseen), else 0."""
    limit = body.get("max_completion_tokens")
    return limit if isinstance(limit, int) and reasons_unseen(body) else 0
