"""Ids a provider hands a team in an answer and reads back by id in a later request.

Chat Completions' audio output: an answer's `choices[].message.audio.id` (streamed as a choice's
`delta.audio.id`) is how a later turn refers to that audio. An assistant message sent back as
`{"role": "assistant", "audio": {"id": "audio_…"}}` has OpenAI read the audio (its transcript is the
turn's context) from what it keeps for the account (its audio guide, multi-turn conversations), and
every team sharing the provider key shares that account: the id went upstream as sent, so a team
that had another team's audio id continued from the other team's spoken answer. Each audio id the
gateway answers a team with is recorded as the team's (sdk/state/ownership.py, kind `audio`) before
the client can see it (a batch's output file as it passes through the gateway too:
sdk/passthrough/bodies.py:tallied), and a request naming one the team was not answered with gets the 404 the other
id checks give, another team's and a made-up id alike, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from sdk.errors import InvalidRequestError, NotFoundError
from sdk.offload import off_loop_if_large
from sdk.sse import event_data, events_of
from sdk.state.ownership import MAX_NAMED_FILES, Ownership
from sdk.streams import close_after
from sdk.types import Answer, Endpoint, LLMRequest, LLMResponse

AUDIO = "audio"  # the ownership records' kind
MISSING_AUDIO = "Audio with id '{}' not found."
_MARK = b'"audio"'


def named_audio(body: Any) -> list[str]:
    """The audio ids a Chat Completions body's messages name (`messages[].audio.id`), once each."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return []
    return list(dict.fromkeys(audio["id"] for message in messages if isinstance(message, dict)
                              and isinstance(audio := message.get("audio"), dict) and isinstance(audio.get("id"), str)))


def _named(bodies: list[Any]) -> list[str]:
    return list(dict.fromkeys(audio_id for body in bodies for audio_id in named_audio(body)))


def answered_audio(data: Any) -> list[str]:
    """The audio ids of a Chat Completions answer or chunk (`choices[].message.audio.id`, `.delta.audio.id`)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    return [audio["id"] for choice in choices if isinstance(choice, dict)
            for part in (choice.get("message"), choice.get("delta")) if isinstance(part, dict)
            and isinstance(audio := part.get("audio"), dict) and isinstance(audio.get("id"), str)] \
        if isinstance(choices, list) else []


async def check_audio(ownership: Ownership, team: str, bodies: list[Any], size: int = 0) -> None:
    """Refuse (404, nothing sent) bodies naming an audio id the gateway did not answer `team` with; `size`
    is their bytes, and large ones are walked in the heavy-work pool (as `Ownership.check_files` does)."""
    named = await off_loop_if_large(size, _named, bodies)
    if not named:
        return
    if len(named) > MAX_NAMED_FILES:  # each is a lookup in the store every team shares
        raise InvalidRequestError(f"the request names {len(named)} distinct audio ids; at most {MAX_NAMED_FILES} are checked")
    owned = await ownership.owned(team, AUDIO, named)
    missing = next((audio_id for audio_id in named if audio_id not in owned), None)
    if missing is not None:
        raise NotFoundError(MISSING_AUDIO.format(missing))


def may_answer_audio(request: LLMRequest) -> bool:
    """Only a Chat request asking for audio output (`audio`, with `modalities`) is answered with audio."""
    return request.endpoint is Endpoint.CHAT_COMPLETIONS and request.body.get("audio") is not None


async def recorded(ownership: Ownership, team: str, answer: Answer) -> Answer:
    """`answer` with the audio ids in it recorded as `team`'s before the client sees them: a whole
    answer now, a stream's chunk before it is handed on."""
    if isinstance(answer, LLMResponse):
        if answer.status == 200 and _MARK in answer.body:
            data = await off_loop_if_large(len(answer.body), orjson.loads, answer.body)
            await ownership.own(team, AUDIO, answered_audio(data))
        return answer
    answer.events = _recorded_events(ownership, team, answer.events)
    return answer


async def _recorded_events(ownership: Ownership, team: str, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    recorded: set[str] = set()  # a choice's audio deltas may each repeat its id: one write per id
    try:
        async for item in events:
            if _MARK in item:  # an audio delta
                for event in events_of(item):
                    try:
                        ids = [i for i in answered_audio(orjson.loads(event_data(event))) if i not in recorded]
                    except orjson.JSONDecodeError:  # [DONE], an error event: no audio in it
                        continue
                    if ids:
                        await ownership.own(team, AUDIO, ids)
                        recorded.update(ids)
            yield item
    finally:
        await close_after(events)
