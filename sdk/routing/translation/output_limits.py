"""How many tokens a translated request asks for: each protocol's limit sized for the other's models.

Both protocols take the client's limit as a ceiling, but each provider answers a limit above its
model's own most with a 400, and clients size their limit for the model they think they call:
Claude Code asks 32000 on every turn, a Chat client configured for gpt-5 or o3 100000 or more. A
limit above the target model's most is that most (the answer is the same: the model never writes
more); a model not listed gets the limit as asked.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from sdk.errors import InvalidRequestError

# OpenAI requests without a limit must still give Anthropic one: 8192, which every Claude model from
# 3.5 on takes; Claude 3 (and older) models take at most 4096 (more is Anthropic's 400).
DEFAULT_MAX_TOKENS = 8192
_SMALL_OUTPUT = re.compile(r"^claude-(instant|2|3-(haiku|opus|sonnet))")


def default_max_tokens(model: Any) -> int:
    return 4096 if _SMALL_OUTPUT.match(str(model or "")) else DEFAULT_MAX_TOKENS


# The most tokens an OpenAI model writes (OpenAI's model pages). Claude takes max_tokens as a ceiling
# and clients size it for Claude (Claude Code asks 32000 or more on every turn); OpenAI answers a larger
# one with a 400 ("max_tokens is too large"), so a Messages limit above the model's own is its own.
_OPENAI_OUTPUT = ((re.compile(r"^gpt-4o-2024-05-13"), 4096), (re.compile(r"^(gpt-4o|chatgpt-4o)"), 16384),
                  (re.compile(r"^gpt-4\.1"), 32768), (re.compile(r"^(gpt-4-turbo|gpt-3\.5-turbo)"), 4096),
                  (re.compile(r"^gpt-4(-\d|$)"), 8192), (re.compile(r"^o[134](-|$)"), 100000), (re.compile(r"^gpt-5(\.\d+)?-chat"), 16384),
                  (re.compile(r"^gpt-5"), 128000))


def openai_output_limit(model: Any, asked: Any) -> Any:
    """`asked` (a Messages max_tokens), or the OpenAI model's own most if it is smaller."""
    return _limited(_OPENAI_OUTPUT, model, asked)


# The most tokens a Claude model writes (Anthropic's models overview, platform.claude.com/docs/en/about-claude/
# models/overview; a larger max_tokens is Anthropic's 400 "max_tokens: N > M, which is the maximum allowed
# number of output tokens for MODEL"). Models not listed (newer ones) get the limit as asked.
_CLAUDE_OUTPUT = ((re.compile(r"^claude-(opus-4-[678]|sonnet-4-6)"), 128000), (re.compile(r"^claude-opus-4(-0|-1|-2025|$)"), 32000),
                  (re.compile(r"^claude-(sonnet-4|opus-4-5|haiku-4-5|3-7-sonnet)"), 64000),
                  (re.compile(r"^claude-3-5-(sonnet|haiku)"), 8192), (re.compile(r"^claude-3-(haiku|opus|sonnet)"), 4096))


def claude_output_limit(model: Any, asked: Any) -> Any:
    """`asked` (a Chat max_completion_tokens / max_tokens), or the Claude model's own most if it is smaller."""
    return _limited(_CLAUDE_OUTPUT, model, asked)


def _limited(table: tuple[tuple[re.Pattern[str], int], ...], model: Any, asked: Any) -> Any:
    most = next((n for pattern, n in table if pattern.match(str(model or ""))), None)
    return most if most is not None and isinstance(asked, int) and asked > most else asked


# Anthropic's cache pre-warming: `max_tokens: 0` reads the prompt into the cache and writes nothing (content [],
# stop_reason max_tokens). OpenAI caches every prompt it reads but takes no limit under 1, so the warming goes with
# OpenAI's least limit and the one token it lets the model write is billed (in usage), and left out of the answer.
WARMING_LIMIT = 1


def warming(body: dict[str, Any]) -> bool:
    """Whether a Messages `body` only warms the prompt cache (`max_tokens: 0`). What Anthropic refuses beside it (a
    stream, extended thinking, a forced tool, a JSON format) is its 400, word for word, before anything is sent."""
    limit, thinking, choice, config = body.get("max_tokens"), body.get("thinking"), body.get("tool_choice"), body.get("output_config")
    if type(limit) is not int or limit != 0:
        return False
    refused = ("stream=true" if body.get("stream") else
               "extended thinking" if isinstance(thinking, dict) and thinking.get("type") == "enabled" else
               "tool_choice of type 'any' or 'tool'" if isinstance(choice, dict) and choice.get("type") in ("any", "tool") else
               "output_config.format" if (isinstance(config, dict) and config.get("format") is not None)
               or body.get("output_format") is not None else None)  # (the beta's name of it: output_modes.beta_format)
    if refused:
        raise InvalidRequestError(f"max_tokens: 0 is not supported with {refused}")
    return True


def warmed(message: bytes) -> bytes:
    """A translated Anthropic message as a warming's answer: nothing written, stopped by its limit (usage as billed)."""
    return orjson.dumps({**orjson.loads(message), "content": [], "stop_reason": "max_tokens", "stop_sequence": None})
