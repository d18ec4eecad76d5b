"""The model catalogue: GET /v1/models and GET /v1/models/{id} in OpenAI's shape, or Anthropic's
when the request carries `anthropic-version`, and which model names each API accepts (an
unknown model is the provider's 404, as on the real APIs)."""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING, Any

from . import anthropic_wire, openai_wire

if TYPE_CHECKING:
    from .app import Emulator
    from .asgi import Call

OPENAI_CREATED = 1_700_000_000
# Hidden reasoning per effort (output tokens billed as reasoning_tokens) for reasoning models: Responses and Chat.
REASONING_TOKENS = {"minimal": 4, "low": 8, "medium": 16, "high": 32, "xhigh": 64}
OPENAI_MODELS = ("gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-4.1", "gpt-4.1-mini", "gpt-4o",
                 "gpt-4o-mini", "o3", "o4-mini", "gpt-3.5-turbo-instruct", "davinci-002",
                 "text-embedding-3-small", "text-embedding-3-large", "text-embedding-ada-002")
# Embedding models and their native dimensions; only text-embedding-3-* accept `dimensions`.
EMBEDDING_MODELS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072,
                    "text-embedding-ada-002": 1536}
# (id, display name, created_at), newest first as the real list is ordered.
ANTHROPIC_MODELS = (
    ("claude-opus-5", "Claude Opus 5", "2026-06-01T00:00:00Z"),
    ("claude-sonnet-5", "Claude Sonnet 5", "2026-06-01T00:00:00Z"),
    ("claude-sonnet-4-6", "Claude Sonnet 4.6", "2026-02-17T00:00:00Z"),
    ("claude-opus-4-1", "Claude Opus 4.1", "2025-08-05T00:00:00Z"),
    ("claude-sonnet-4-5", "Claude Sonnet 4.5", "2025-09-29T00:00:00Z"),
    ("claude-haiku-4-5", "Claude Haiku 4.5", "2025-10-01T00:00:00Z"),
)
# Families the emulator serves beyond the listed ids (dated snapshots, fine-tunes, test names).
_OPENAI_FAMILIES = ("gpt-", "o1", "o3", "o4", "chatgpt-", "ft:gpt-", "codex-", "davinci-",
                    "babbage-")


# The most tokens a Claude model writes (Anthropic's models overview); a larger max_tokens is a 400.
# Models not listed take any max_tokens here.
_ANTHROPIC_OUTPUT = ((re.compile(r"^claude-(opus-4-[678]|sonnet-4-6)"), 128000), (re.compile(r"^claude-opus-4(-0|-1|-2025|$)"), 32000),
                     (re.compile(r"^claude-(sonnet-4|opus-4-5|haiku-4-5|3-7-sonnet)"), 64000),
                     (re.compile(r"^claude-3-5-(sonnet|haiku)"), 8192), (re.compile(r"^claude-3-(haiku|opus|sonnet)"), 4096))


# Context windows in tokens (the providers' model pages): a prompt over its model's is the provider's 400
# (Anthropic: "prompt is too long: N tokens > M maximum"; OpenAI: code context_length_exceeded).
# EmulatorConfig.context_windows (model glob → tokens) comes first, so tests need no 200k-token prompt.
_CONTEXT_WINDOWS = (("claude-*", 200_000), ("gpt-4.1*", 1_047_576), ("gpt-4o*", 128_000), ("gpt-5*", 400_000),
                    ("o[134]*", 200_000), ("gpt-3.5-turbo*", 16_385))


# OpenAI models that bill prompt-cache writes and report them (gpt-5.6 and later, reference C.2).
_BILLS_WRITES = re.compile(r"^gpt-(5\.([6-9]|[1-9]\d)|([6-9]|[1-9]\d)(\.\d+)?)(?![\d.])")


def bills_cache_writes(model: str) -> bool:
    return bool(_BILLS_WRITES.match(model))


def context_window(model: str, overrides: dict[str, int]) -> int | None:
    """The most input tokens `model` takes (None: not limited here)."""
    rows = (*overrides.items(), *_CONTEXT_WINDOWS)
    return next((n for glob, n in rows if fnmatch.fnmatchcase(model, glob)), None)


def anthropic_max_output(model: str) -> int | None:
    return next((n for pattern, n in _ANTHROPIC_OUTPUT if pattern.match(model)), None)


def openai_generates(model: str) -> bool:
    """A text model on the OpenAI side (chat, responses, completions)."""
    return model.startswith(_OPENAI_FAMILIES)


def anthropic_generates(model: str) -> bool:
    return model.startswith("claude-")


def _openai_entry(mid: str) -> dict[str, Any]:
    return {"id": mid, "object": "model", "created": OPENAI_CREATED,
            "owned_by": "system" if mid.startswith(("text-", "davinci", "babbage")) else "openai"}


def _anthropic_entry(row: tuple[str, str, str]) -> dict[str, Any]:
    return {"type": "model", "id": row[0], "display_name": row[1], "created_at": row[2]}


def _anthropic_row(mid: str) -> tuple[str, str, str] | None:
    for row in ANTHROPIC_MODELS:
        if row[0] == mid:
            return row
    if anthropic_generates(mid):  # a dated or unlisted claude-* id
        return (mid, mid.replace("-", " ").title(), "2025-01-01T00:00:00Z")
    return None


async def list_models(emu: Emulator, call: Call) -> None:
    if "anthropic-version" in call.headers:
        await _anthropic_list(emu, call)
        return
    if await openai_wire.admit(emu, call) is not None:
        tuned = [{"id": m, "object": "model", "created": OPENAI_CREATED, "owned_by": m.split(":")[2]}
                 for m in emu.config.openai_fine_tunes]  # owned by the organisation that trained it
        await openai_wire.ok(emu, call, {"object": "list",
                                         "data": [_openai_entry(m) for m in OPENAI_MODELS] + tuned})


async def retrieve_model(emu: Emulator, call: Call) -> None:
    mid = call.params[0]
    if "anthropic-version" in call.headers:
        if await anthropic_wire.authenticate(emu, call) is None:
            return
        handled, _ = await anthropic_wire.pre_faults(emu, call, mid, False)
        if handled:
            return
        row = _anthropic_row(mid)
        if row is None:
            await anthropic_wire.error(emu, call, 404, f"model: {mid}")
        else:
            await anthropic_wire.ok(emu, call, _anthropic_entry(row))
        return
    if await openai_wire.authenticate(emu, call) is None:
        return
    handled, _ = await openai_wire.pre_faults(emu, call, mid, False)
    if handled:
        return
    if mid in OPENAI_MODELS or openai_generates(mid):
        await openai_wire.ok(emu, call, _openai_entry(mid))
    else:
        await openai_wire.error(emu, call, 404, openai_wire.model_missing(mid))


async def _anthropic_list(emu: Emulator, call: Call) -> None:
    """Anthropic's page: `limit` (1-1000, default 20), `after_id` / `before_id` cursors."""
    if await anthropic_wire.admit(emu, call) is None:
        return
    await anthropic_wire.answer_page(emu, call, [_anthropic_entry(r) for r in ANTHROPIC_MODELS])
