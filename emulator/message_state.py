"""What Anthropic holds for an account (here: per API key) under the id of an answer, and reads when a later
request names that id: a Thread's conversation (the message-threads beta) and a cache-diagnostics prompt.

- `thread: {type: "continue", previous_message_id}` follows the conversation held under that id. Each answer
  can be continued once: a second `continue` from it is a 400 with `error.details.error_code:
  thread_already_continued` (an unknown id: the 404 `thread_not_found`); the SDK's threads replay the
  conversation under a new Thread on either.
- `diagnostics: {previous_message_id}` has the answer say why the prompt cache could not reuse the prefix of
  the request that id answered (`diagnostics.cache_miss_reason`; null when it could, or when the id is null,
  the first turn opting in): `previous_message_not_found` for an id no opted-in request was answered with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .caching import count_input_tokens

if TYPE_CHECKING:
    from .app import Emulator


def continued(emu: Emulator, key: str, thread: dict[str, Any]) -> list[dict[str, Any]] | str:
    """The conversation a `continue` turn follows (now continued), or the error code that refuses the turn."""
    previous = (key, str(thread.get("previous_message_id")))
    held = emu.state.threads.get(previous)
    if held is None:
        return "thread_not_found"
    if previous in emu.state.threads_continued:
        return "thread_already_continued"
    emu.state.threads_continued.add(previous)
    return held


def diagnosed(emu: Emulator, key: str, body: dict[str, Any], message_id: str) -> dict[str, Any] | None:
    """The answer's `diagnostics` for a request that asked for them (None: it did not), its prompt kept under
    `message_id` for a later request to be compared with."""
    asked = body.get("diagnostics")
    if not isinstance(asked, dict):
        return None
    prompt = {part: body.get(part) for part in ("model", "system", "tools")}
    messages = body.get("messages") or []
    emu.state.prompts[(key, message_id)] = (prompt, messages, count_input_tokens(body))
    previous = asked.get("previous_message_id")
    if previous is None:
        return {"cache_miss_reason": None}
    before = emu.state.prompts.get((key, str(previous)))
    if before is None:
        return {"cache_miss_reason": {"type": "previous_message_not_found"}}
    was, had, tokens = before
    changed = next((f"{part}_changed" for part in prompt if prompt[part] != was[part]), None)
    if changed is None and messages[: len(had)] != had:
        changed = "messages_changed"
    return {"cache_miss_reason": changed and {"type": changed, "cache_missed_input_tokens": tokens}}
