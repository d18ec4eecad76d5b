"""What each target model takes, by its name: the tables translation reads to send a model only what it takes.

OpenAI models (reasoning, extended cache retention, sampling at reasoning effort none) and Claude models (effort
levels, their own sampling, temperature and top_p together, mid-conversation system messages). A model a table does
not name is taken to take what most do; the fields table (fields.py) says what becomes of a field each leaves out.
"""

from __future__ import annotations

import re
from typing import Any

# OpenAI models that reason and take `reasoning_effort`: the o-series and gpt-5 (not its -chat models),
# also under a router's vendor prefix (`openai/gpt-5`). Any other Chat model answers 400 to the field
# (OpenAI: "Unsupported parameter"), the local engine too.
_REASONS = re.compile(r"^([\w.-]+/)?(o\d|gpt-5(?!.*-chat))")


# OpenAI models with extended prompt-cache retention, `prompt_cache_retention: "24h"` (OpenAI's prompt-caching
# guide: gpt-5.5, gpt-5.5-pro, gpt-5.4, gpt-5.2, gpt-5.1 and its codex and chat-latest models, gpt-5, gpt-5-codex,
# gpt-4.1); the others keep a prefix in memory only, minutes.
_LONG_RETENTION = re.compile(r"^([\w.-]+/)?(gpt-5(\.[1245])?(-codex(-max|-mini)?|-pro|-chat-latest)?|gpt-4\.1)(-\d{4}-\d{2}-\d{2})?$")


def long_retention(model: Any) -> bool:
    """Whether the OpenAI model `model` takes `prompt_cache_retention: "24h"`."""
    return bool(_LONG_RETENTION.match(str(model or "")))


def reasons(model: Any) -> bool:
    """Whether the OpenAI target model `model` reasons (and so takes reasoning_effort)."""
    return bool(_REASONS.match(str(model or "")))


# OpenAI reasoning models that reason only when asked: gpt-5.1 and later (not their codex or pro models) default to
# reasoning effort `none`, and take temperature and top_p at `none` (OpenAI's GPT-5.1/5.2 guides: "only supported
# when reasoning effort is none"; any other effort, or gpt-5, o-series, refuses them).
_SAMPLES_UNREASONED = re.compile(r"^([\w.-]+/)?gpt-5\.[1-5](-mini|-nano)?(-\d{4}-\d{2}-\d{2})?$")


def asks_effort(body: dict[str, Any]) -> bool:
    """Whether a Messages request asks an OpenAI model for reasoning effort: output_config.effort, or thinking
    enabled with a budget (adaptive thinking leaves the model's own: requests._a2o_effort)."""
    config, thinking = body.get("output_config"), body.get("thinking")
    return ((isinstance(config, dict) and config.get("effort") is not None)
            or (isinstance(thinking, dict) and thinking.get("type") == "enabled"))


def reasons_unseen(body: dict[str, Any]) -> bool:
    """Whether the model of a Chat `body` (as sent upstream) reasons without streaming it: a reasoning model, less gpt-5.1's
    family at effort none, its default (OpenAI's reasoning guide: reasoning tokens are billed as output, not returned)."""
    model, effort = body.get("model"), body.get("reasoning_effort")
    if not reasons(model):
        return False
    return effort not in (None, "none") if _SAMPLES_UNREASONED.match(str(model or "")) else effort != "none"


def takes_sampling(body: dict[str, Any]) -> bool:
    """Whether the OpenAI target model of a translated Messages `body` takes temperature and top_p: a model that
    does not reason, and one of gpt-5.1's family at effort none (sent with them), which the request does not raise."""
    model = body.get("model")
    return not reasons(model) or (bool(_SAMPLES_UNREASONED.match(str(model or ""))) and not asks_effort(body))


# Claude models that take output_config.effort, and the levels each takes (Anthropic's effort docs,
# platform.claude.com/docs/en/build-with-claude/effort): Opus 4.5 low to high; Opus and Sonnet 4.6 max as
# well; Opus 4.7 and later, the 5 models, xhigh too. The others (Sonnet 4.5, Haiku 4.5, Opus 4.1 and
# earlier, and names not listed) take none: a Chat request's reasoning_effort is dropped for them, and named.
_CLAUDE_EFFORTS = ((re.compile(r"^claude-(opus-4-[78]|opus-5|sonnet-5|fable|mythos)"), ("low", "medium", "high", "xhigh", "max")),
                   (re.compile(r"^claude-(opus|sonnet)-4-6"), ("low", "medium", "high", "max")),
                   (re.compile(r"^claude-opus-4-5"), ("low", "medium", "high")))


# Claude models whose sampling is their own (Anthropic's migration guide for Opus 4.7: "Setting temperature,
# top_p, or top_k to any non-default value ... returns a 400 error"; Opus 4.8 and Sonnet 5 the same): a Chat
# request's temperature and top_p are left out for them, and named.
_FIXED_SAMPLING = re.compile(r"^claude-(opus-4-[78]|sonnet-5)")


def fixed_sampling(model: Any) -> bool:
    """Whether the Claude model `model` refuses temperature and top_p (it samples as it does)."""
    return bool(_FIXED_SAMPLING.match(str(model or "")))


# Claude models that take temperature and top_p together: those before Opus 4.1 (Claude 3, Opus 4, Sonnet 4). Every
# later one answers both with a 400 ("`temperature` and `top_p` cannot both be specified for this model. Please use
# only one."), where OpenAI takes both: a Chat request's top_p is then left out, and named, its temperature kept.
_BOTH_SAMPLERS = re.compile(r"^claude-(instant|2|3)|^claude-(opus|sonnet)-4(-0|-2025|$)")


def both_samplers(model: Any) -> bool:
    """Whether the Claude model `model` takes temperature and top_p together."""
    return bool(_BOTH_SAMPLERS.match(str(model or "")))


# Claude models that take `role: "system"` inside `messages` (Anthropic's mid-conversation system messages:
# Fable 5, Mythos 5, Opus 4.8 and Opus 5; not Sonnet 5; the others answer 400).
_IN_PLACE_SYSTEM = re.compile(r"^claude-(opus-4-8|opus-5|fable|mythos)")


def in_place_system(model: Any) -> bool:
    """Whether the Claude model `model` takes a system message in the middle of the conversation."""
    return bool(_IN_PLACE_SYSTEM.match(str(model or "")))


def claude_efforts(model: Any) -> tuple[str, ...]:
    """The output_config.effort levels the Claude model `model` takes (none: it takes no effort)."""
    return next((levels for pattern, levels in _CLAUDE_EFFORTS if pattern.match(str(model or ""))), ())
