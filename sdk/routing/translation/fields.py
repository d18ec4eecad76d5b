"""Every top-level field of every request shape, by what it means to a target of another protocol.

One table (`FIELDS`; its Responses part in responses_fields.py, its kinds in field_types.py), read by the translators (sdk/routing/translation/requests.py,
responses_requests.py) and rendered into docs/api.md ("Fields across protocols"; the test
tests/routing/test_field_table.py walks it and checks the copy). Each field of a shape is:

- `translated`: carried over with its meaning (the translator says how; the note names the target field);
- `dropped`: it cannot change the answer (metadata, client information, storage and billing hints);
  it is left out and named in the answer's `x-slipstream-dropped-fields` header, so nothing is lost
  silently;
- `refused`: it would change the answer and the target cannot do the same: a 400 naming the field
  and the target protocol, before anything is sent.

A field sent as null is absent (as the providers read it: the official clients send a parameter given
as None as null): it is skipped, never refused, named or sent on. A field whose value is its protocol's
default (`neutral`) changes nothing either: `n: 1`,
`presence_penalty: 0`, `logprobs: false` are dropped, other values of them refused. A field that is
not in the table is refused: passing it on could fail upstream, and dropping it could silently change
what the answer means.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import orjson

from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation import context_edits, tool_search
from sdk.routing.translation.breakpoints import (
    BREAKPOINT,
    breakpoints_travel,
    in_responses_input,
    lifetimes,
    options_travel,
    takes_breakpoints,
)
from sdk.routing.translation.field_types import D, Fate, Field, R, T
from sdk.routing.translation.models import (
    both_samplers,
    claude_efforts,
    fixed_sampling,
    long_retention,
    reasons,
    takes_sampling,
)
from sdk.routing.translation.reasoning import chat_thinking, thinking_mode, unsampled
from sdk.routing.translation.responses_fields import RESPONSES_FIELDS
from sdk.types import Protocol

DROPPED_HEADER = "x-slipstream-dropped-fields"
# Messages thinking types that turn thinking off: `between_tools` too ("thinking turned off, and any short progress
# updates the model writes between tool calls come back as thinking blocks", anthropic 2.x).
THINKING_OFF = ("disabled", "between_tools")


class Shape(StrEnum):
    """A request shape and the protocol a translated request of it goes to."""

    CHAT = "Chat Completions → Anthropic Messages"
    MESSAGES = "Anthropic Messages → Chat Completions"
    RESPONSES = "Responses → Chat Completions (→ Anthropic Messages)"


# Responses `include` entries that ask for something a translated answer has not and does not miss
# (there are no reasoning items to carry encrypted content in): dropped, named as `include.ENTRY`.
# The Responses API's hosted web search tools (web_search.py: Claude's web search server tool).
WEB_SEARCH_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11")
INCLUDE_DROPPED = ("reasoning.encrypted_content", "web_search_call.action.sources", "web_search_call.results")
def retention_travels(target: str, model: Any, retention: Any) -> bool:
    """Whether a Responses request's prompt_cache_retention goes on to `target`: to a Chat target (the same field),
    `24h` only for a model with extended retention; never to Claude, whose TTLs the team policy sets."""
    return not target.startswith("Anthropic") and (retention != "24h" or long_retention(model))


def one_sampler(body: dict[str, Any]) -> bool:
    """Whether a Chat `body` for a Claude model sends temperature and top_p (neither at its default) to a model
    that takes one of the two: its top_p is left out."""
    temperature, top_p = body.get("temperature"), body.get("top_p")
    return (temperature is not None and top_p is not None and not both_samplers(body.get("model"))
            and fate(Shape.CHAT, "temperature", temperature) is Fate.TRANSLATED and fate(Shape.CHAT, "top_p", top_p) is Fate.TRANSLATED)


def effort_travels(target: str, model: Any) -> bool:
    """Whether a Responses request's reasoning effort goes on to `target`: a Claude model as its
    output_config.effort and thinking, if it takes either (reasoning.py); a Chat model as reasoning_effort, if it reasons."""
    return bool(claude_efforts(model) or thinking_mode(model)) if target.startswith("Anthropic") else reasons(model)


FIELDS: dict[Shape, dict[str, Field]] = {
    Shape.CHAT: {
        "model": Field(T, "model (the route's target model)"),
        "messages": Field(T, "system, messages (leading system/developer → system; a later one stays in its place: a "
                                 "mid-conversation `role: \"system\"` message for a model that takes one (Opus 4.8, Opus 5, "
                                 "Fable 5, Mythos 5), else a `<system-reminder>` block in the user turn, as Claude Code "
                                 "writes them; tool → tool_result blocks (call ids with characters Claude's ids do not take, such as "
                                 "Kimi's `functions.name:0`, have them replaced by `_`; a tool message's images and files in "
                                 "its tool_result, as Claude takes a tool's); images; inline PDF files → document blocks; "
                                 "`cache_control` on a part or message, and OpenAI's explicit `prompt_cache_breakpoint` on a part (the latest "
                                 "that fit Claude's four; its `ttl` dropped, named), → a breakpoint on the block made from it; empty or blank "
                                 "text, which Claude refuses, left out: a turn of nothing else too, the turns around it joining (a "
                                 "user turn last after the assistant's, which Claude would continue: refused))"),
        "max_completion_tokens": Field(T, "max_tokens (at most the Claude model's own most, e.g. Sonnet 4.5's 64000: a larger one "
                                          "is Anthropic's 400, a ceiling to OpenAI)"),
        "max_tokens": Field(T, "max_tokens (as max_completion_tokens; default when neither is sent: 8192; 4096 for Claude 3 "
                               "models, their most)"),
        "stop": Field(T, "stop_sequences (whitespace-only ones such as `\\n`, which Claude refuses, are applied by the gateway: "
                             "the answer is cut where one first appears, finish_reason stop; a stream's Claude call closed there)"),
        "stream": Field(T, "stream"),
        "stream_options": Field(T, "include_usage: the usage chunk is built from Anthropic's usage"),
        # 1 is both protocols' default for each; Claude 4.1 and later refuse the two together, so a default is not sent.
        "temperature": Field(T, "temperature (above 1: refused, Anthropic's range is 0–1; dropped for Opus 4.7, 4.8 and "
                                "Sonnet 5, which sample as they do and refuse it)", (1, 1.0)),
        "top_p": Field(T, "top_p (dropped for Opus 4.7, 4.8 and Sonnet 5, as temperature; beside a temperature, dropped for "
                          "Opus 4.1 and later models, which take one of the two: the temperature is kept)", (1, 1.0)),
        "tools": Field(T, "tools (function tools, with their `cache_control`, on the tool or its function; a strict tool's schema brought within what "
                          "Claude's strict tools take, as for response_format; custom tools (freeform text, Codex-style "
                          "agents') as tools of one string, `input` (a grammar in the description, not enforced), as from "
                          "Responses, their calls answered as custom tool calls (`custom.input` the string; a stream sends "
                          "it whole, once written) and the history's custom calls sent as calls of them; others refused)"),
        "tool_choice": Field(T, "tool_choice (auto/none/required/named, a custom tool's as its tool's; allowed_tools as only "
                                "the allowed tools, with auto or any (`required`): Claude has no such choice)"),
        "parallel_tool_calls": Field(T, "tool_choice.disable_parallel_tool_use"),
        "response_format": Field(T, "json_schema → output_config.format (structured outputs; the schema within what they "
                                    "take: objects closed, constraints they cannot enforce moved into the description); "
                                    "json_object (and json_schema on models without structured outputs) → an instruction "
                                    "and, for models before 4.6, an assistant prefill `{`, the answer validated as JSON",
                                 ({"type": "text"},)),
        # Claude reasons only when `thinking` is on: "none" is its default (reasoning.py).
        "reasoning_effort": Field(T, "thinking, with output_config.effort for a model that takes it (Opus 4.5 and later, "
                                     "Sonnet 4.6 and later: low/medium/high, xhigh where the model has it, else high; "
                                     "minimal → low, the least Claude has): adaptive thinking on Opus/Sonnet 4.6 and later, "
                                     "enabled with a budget_tokens the effort stands for (within max_tokens) on the 4.5 "
                                     "models, Opus 4.1, Opus/Sonnet 4 and Sonnet 3.7; no thinking where it would be Claude's "
                                     "400 (a prefill, a tool loop, a forced tool, max_tokens 1024 or less in enabled mode), "
                                     "temperature and a top_p below 0.95 then left out; dropped where neither is sent",
                                  ("none",)),
        "user": Field(T, "metadata.user_id"),
        "n": Field(T, "one Messages request per choice (up to 128), the others started once the first has begun answering "
                      "so they read the prompt it cached; one answer, choices indexed 0..n-1; its usage the requests' summed, as "
                      "Claude bills them (the prompt n times, mostly cache reads; OpenAI bills it once)", (1,)),
        "metadata": Field(D, "OpenAI's stored-completion tags"),
        "store": Field(D, "OpenAI's stored completions"),
        "service_tier": Field(D, "billing tier"),
        "prompt_cache_key": Field(D, "OpenAI's cache routing; Anthropic targets get breakpoints instead"),
        "prompt_cache_options": Field(D, "OpenAI's cache mode and lifetime (gpt-5.6 and later); Anthropic targets get "
                                         "breakpoints instead"),
        "prompt_cache_retention": Field(D, "OpenAI's cache retention; Claude's longest, `ttl: \"1h\"`, is the team policy's "
                                           "`prompt_cache.ttl`: the gateway's planner orders TTLs as Anthropic requires"),
        "cache_control": Field(T, "cache_control: automatic caching, a breakpoint on the last cacheable block (the "
                                  "top-level marker OpenRouter's Chat API takes for Claude)"),
        "safety_identifier": Field(T, "metadata.user_id when `user` is absent: both name the end user to the provider's "
                                      "abuse detection (beside a `user`, dropped)"),
        # OpenAI's own reference: "best effort to sample deterministically ... Determinism is not guaranteed".
        "seed": Field(D, "best-effort determinism on OpenAI's side, never guaranteed (eval harnesses send it on every "
                         "request); Anthropic has no seeded sampling"),
        "frequency_penalty": Field(R, "no counterpart", (0, 0.0)),
        "presence_penalty": Field(R, "no counterpart", (0, 0.0)),
        "logit_bias": Field(R, "no counterpart", ({},)),
        "logprobs": Field(R, "no counterpart", (False,)),
        "top_logprobs": Field(R, "no counterpart", (0,)),
        "modalities": Field(R, "text output only", (["text"],)),
        "audio": Field(R, "no audio output"),
        # OpenAI's guide files it under "Reduce latency for model responses where much of the response is known ahead
        # of time": the model checks the prediction against what it writes; tokens it rejects are billed, not written.
        "prediction": Field(D, "a predicted output (the Vercel AI SDK's, editors' rewrite of a file): it only speeds up "
                               "an answer the model writes the same without it; Claude has no such speed-up"),
        "verbosity": Field(T, "an instruction at the end of the system prompt (low: be concise; high: be thorough); Claude "
                              "has no such setting", ("medium",)),
        "web_search_options": Field(T, "Claude's web search server tool, web_search_20250305 (user_location carried; "
                                       "search_context_size dropped, named: Claude has no such setting; `max_uses` 5, the "
                                       "searches the budget holds, where OpenAI's Chat search runs one a request); its "
                                       "citations come back as url_citation annotations"),
        # openai 3.x: `block` withholds a flagged answer, `score` returns moderation results with it.
        "moderation": Field(R, "OpenAI's moderation of the input and output (`block` withholds a flagged answer, `score` "
                               "adds its results): Claude runs none, and dropping it would pass unmoderated text"),
        "functions": Field(T, "tools (deprecated functions: each a tool; the answer's first tool call back as the "
                              "message's function_call, finish_reason function_call, in a body and a stream; an "
                              "assistant's function_call and a `function` message in the history as a tool call and its "
                              "result)"),
        "function_call": Field(T, "tool_choice (auto, none, or {name} as the named tool)"),
    },
    Shape.MESSAGES: {
        "model": Field(T, "model (the route's target model)"),
        "messages": Field(T, "messages (tool_use → tool_calls (an id over OpenAI's 40 characters as `call_` and 35 hex digits of "
                                 "its SHA-256, its result's too, the same every turn), tool_result → tool messages (a result's images and documents "
                                 "follow in the user message: tool messages hold text; its `tool_reference` blocks, a client-side tool search's "
                                 "answer such as Claude Code's ToolSearch, as `Tool loaded: NAME`, the tools being sent from the start whatever "
                                 "their `defer_loading`), images (`transformations.oversized_image: \"error\"` refused: an OpenAI model scales a "
                                 "large image down), PDF documents → file parts (a `context` before them as text), text and custom-content (text blocks) documents (under their "
                                 "`title` and `context`) and search results (without citations, which Chat cannot give) → text; Claude's web search "
                                 "and web fetch in an assistant turn (server_tool_use, web_search_tool_result, web_fetch_tool_result) → "
                                 "text there: the query, the results' titles, URLs and ages, a fetched text page's text; thinking and "
                                 "redacted_thinking blocks of earlier turns left out, and `fallback` blocks (where a "
                                 "server-side fallback handed over, which Anthropic does not render into the prompt); a "
                                 "`compaction` block with its summary (compact_20260112) as Claude reads it: the summary a user "
                                 "message, the turns before it left out (its `tool_changes` applied there; a failed one left out); "
                                 "`tool_addition` / `tool_removal` blocks (the tool runner's add_tools/remove_tools, in "
                                 "system messages) applied to `tools`: the tools in effect at the end offered, the blocks "
                                 "left out (MCP references refused); a "
                                 "final assistant turn, a prefill that Claude continues and a Chat model would answer after, refused)"),
        "system": Field(T, "a system message"),
        "max_tokens": Field(T, "max_completion_tokens (at most the OpenAI model's own most, e.g. gpt-4o's 16384: a larger "
                               "one is OpenAI's 400, a ceiling to Claude); 0, Anthropic's cache warming (the prompt cached, "
                               "nothing written), as 1, OpenAI's least: the answer empty with stop_reason max_tokens as "
                               "Claude's, the one token billed in its usage; with a stream, extended thinking, a forced tool or "
                               "a format, Anthropic's 400"),
        # an empty list stops nothing; sent as `stop: []`, a reasoning model answers the parameter with a 400
        "stop_sequences": Field(T, "stop; for a reasoning model (o-series, gpt-5), which takes none, and beyond OpenAI's 4, "
                                   "applied by the gateway: the answer is cut where one first appears, stop_reason "
                                   "stop_sequence naming it, as Claude's (a stream's upstream call closed there; a body's model writes on past "
                                   "it, billed)", ([],)),
        "stream": Field(T, "stream (with stream_options.include_usage, so usage stays exact)"),
        "temperature": Field(T, "temperature (dropped for a reasoning model, o-series and gpt-5, which samples as it does "
                                "and refuses it; gpt-5.1 to 5.5 take it at reasoning effort none, which is then sent: dropped "
                                "only when thinking or output_config.effort asks for reasoning)"),
        "top_p": Field(T, "top_p (dropped for a reasoning model, as temperature)"),
        "tools": Field(T, "function tools (strict unless the schema has optional inputs, which OpenAI's strict mode "
                          "refuses; `input_examples` at the end of the description; a name over OpenAI's 64 characters, which Claude's 128 allow, as its first 55, `_` and 8 "
                          "hex digits of its SHA-256, in the history and tool_choice too, the answer's calls given the "
                          "client's name back; Anthropic's tool search (regex, BM25) left out, named as tools.TYPE, its deferred "
                          "tools offered from the start and the history's searches left out; the Anthropic-defined tools the client runs "
                          "as functions of the name it declares, with Anthropic's published input schema: the memory tool "
                          "(memory_20250818, the anthropic SDK's BetaAbstractMemoryTool), its commands, the memory protocol Anthropic "
                          "adds to the system prompt in its description; bash (bash_20250124: command, restart); the text editor "
                          "(text_editor_20250728 and _20250429: view, create, str_replace, insert; text_editor_20250124: undo_edit too; "
                          "20250728's max_characters in the description); other Anthropic-defined tools refused: server tools, "
                          "computer use, whose screenshots only a model trained for it acts on, and other versions)"),
        "tool_choice": Field(T, "tool_choice and parallel_tool_calls (auto/none with no tools: left out, OpenAI refuses them)"),
        "metadata": Field(T, "metadata.user_id → user (as every end-user id, the team's 37-character digest of it, "
                             "so Claude Code's ~150-character ids fit OpenAI's 64); nothing else in it changes the answer"),
        "thinking": Field(T, "reasoning_effort for a model that reasons (o-series, gpt-5): enabled by its budget_tokens "
                             "(up to 4096: low, up to 16384: medium, more: high), adaptive the model's own; dropped for "
                             "other models, which have no reasoning to turn on (the answer has no thinking blocks); "
                             "between_tools is thinking off (its progress notes between tool calls have no Chat place)",
                          ({"type": "disabled"}, {"type": "between_tools"})),
        "output_config": Field(T, "format → response_format json_schema (strict unless the schema has optional properties, which "
                                  "OpenAI's strict mode refuses); effort → reasoning_effort (max → xhigh) for a "
                                  "model that reasons, dropped (named output_config.effort) for others; task_budget (a whole task's token "
                                  "budget, which Claude is told of as it goes) refused"),
        # anthropic 2.x sends it as output_config.format, calling it deprecated; clients written for the beta send it.
        "output_format": Field(T, "output_config.format's name in the structured-outputs beta (structured-outputs-2025-11-13): "
                                  "as output_config.format (beside one, the client's 400, as the anthropic SDK's)"),
        "diagnostics": Field(T, "not sent: the answer's `diagnostics` says `cache_miss_reason: unavailable` for a named "
                                "`previous_message_id` (an OpenAI target cannot compare prompts; Anthropic's `null` would "
                                "say no divergence was found), `null` for the first turn's opt-in"),
        "cache_control": Field(D, "Anthropic's automatic caching; OpenAI targets get prompt_cache_key, and a `ttl: \"1h\"` "
                                  "here or on a block `prompt_cache_retention: \"24h\"` where the model has extended "
                                  "retention (gpt-4.1, gpt-5, gpt-5.1 to 5.5; OpenAI's in-memory retention lasts minutes). "
                                  "For gpt-5.6 and later, a block's marker on a system, user or tool-result block is the "
                                  "`prompt_cache_breakpoint` of the part made from it (`ttl: \"1h\"` as `12h`; a tool result's "
                                  "on its last image or document, which follow the tool text: where the result ends); on a tool or "
                                  "an assistant block, which OpenAI takes none on, dropped and named"),
        "service_tier": Field(D, "billing tier"),
        "inference_geo": Field(D, "where Anthropic runs it"),
        "speed": Field(D, "Anthropic's fast mode: how fast the answer comes, not what it says"),
        # Zed, pi and OpenClaw send it with every Fable 5 request (server-side-fallback beta), pi with Opus 5's too.
        "fallbacks": Field(D, "Anthropic's retry on other Claude models when the requested one's safety classifiers "
                              "decline (`stop_reason: refusal`): an OpenAI target answers under its own provider's "
                              "policy, and the route's later targets are the gateway's fallbacks"),
        "fallback_credit_token": Field(D, "the cache-write credit of a retry after a Claude refusal: billing only (a retry "
                                          "that appends the refused partial answer ends in an assistant turn, refused as a "
                                          "prefill)"),
        "top_k": Field(R, "no counterpart"),
        "container": Field(R, "Anthropic's code-execution container"),
        "mcp_servers": Field(R, "Anthropic's MCP connector"),
        "context_management": Field(R, "Anthropic's context editing: clear_tool_uses_20250919 applied as Claude applies it "
                                       "(past its `trigger`, 100,000 input tokens by default counted leaning high, or tool "
                                       "uses: results older than the `keep` most recent tool uses, not of `exclude_tools`, sent "
                                       "as `[Tool result cleared from context]`, with `clear_tool_inputs` their inputs as "
                                       "`{}`, unless fewer tokens than `clear_at_least`), the answer's `applied_edits` counting "
                                       "it; dropped where no edit acts (clear_thinking_*: a Chat target never gets earlier "
                                       "turns' thinking). compact_20260112 past its trigger, and other edits, refused"),
        "compaction": Field(T, "a compaction request (`{type: \"summarize\"}`, the conversation summarized into one "
                               "`compaction` block): the conversation, then a user message asking for the summary (its "
                               "`instructions`, else the gateway's, as for Codex's compaction), tool_choice none; the text "
                               "back as the one block, with no signature, stop_reason `compaction`; ignored by a token count"),
        "thread": Field(R, "Anthropic's server-held conversation state (a Thread: `create` keeps it under the answer's id, "
                           "`continue` sends only the new turn), which an OpenAI target does not hold: refused as Anthropic "
                           "refuses a request Threads cannot serve (`error.details.error_code: thread_unsupported_request`), "
                           "on which the anthropic SDK's threads and tool runner send the whole conversation without it"),
        # The anthropic SDK's beta `billing_policy`: bill_to "self" is the default; "user_profile" bills the customer
        # behind the anthropic-user-profile-id header, and Anthropic refuses the request rather than bill the caller.
        "billing_policy": Field(R, "which organization Anthropic bills: `bill_to: \"user_profile\"` (the customer behind "
                                   "the `anthropic-user-profile-id` header, whose Anthropic organization an OpenAI target "
                                   "cannot bill) refused, as Anthropic refuses what it cannot bill to that customer",
                                ({"type": "billing_policy", "bill_to": "self"}, {"type": "billing_policy"}, {"bill_to": "self"})),
    },
    Shape.RESPONSES: RESPONSES_FIELDS,
}


def fate(shape: Shape, key: str, value: Any) -> Fate:
    """What becomes of `key: value` in a request of `shape`; a key not in the table is refused."""
    field = FIELDS[shape].get(key)
    if field is None:
        return Fate.REFUSED
    if field.fate is not Fate.DROPPED and any(value == n and type(value) is type(n) for n in field.neutral):
        return Fate.DROPPED
    return field.fate


def check(shape: Shape, body: dict[str, Any], target: str, edits: context_edits.Edits = context_edits.edited) -> list[str]:
    """The fields of `body` that are dropped, in order; raises the 400 for the first refused one (`edits`: Memo's)."""
    dropped = []
    for key, value in body.items():
        if value is None:  # null is absent, in OpenAI's APIs and Anthropic's alike: nothing to translate or drop
            continue
        if shape is Shape.MESSAGES and key == "context_management":  # applied, or dropped where no edit acts (context_edits.py)
            why = context_edits.refused(value, body)
            if why:
                raise refuse(why, target)
            if not edits(body).applied:
                dropped.append(key)
            continue
        if shape is Shape.MESSAGES and key == "thread":
            raise ThreadRefused(target)
        kind = fate(shape, key, value)
        if kind is Fate.REFUSED:
            why = FIELDS[shape][key].note if key in FIELDS[shape] else "not a field this gateway knows"
            raise TranslationRefused(f"{key!r} cannot be translated for {_article(target)} {target} target ({why}); "
                                     "send it to a target of its own protocol")
        if kind is Fate.DROPPED:
            dropped.append(key)
        elif shape is Shape.RESPONSES and key == "include":
            dropped += _include(value, target)
        elif shape is Shape.RESPONSES and key == "max_tool_calls":
            dropped += _built_in_limit(body, target)
        elif shape is Shape.RESPONSES and key == "reasoning" and isinstance(value, dict):
            if value.get("summary") or value.get("generate_summary"):
                dropped.append("reasoning.summary")
            if value.get("effort") is not None and not effort_travels(target, body.get("model")):
                dropped.append("reasoning.effort")
        elif shape in (Shape.RESPONSES, Shape.MESSAGES) and key == "tools":
            dropped += tool_search.dropped(value)  # a search the provider would run: the deferred tools go from the start
        elif shape is Shape.CHAT and key == "safety_identifier" and body.get("user"):
            dropped.append(key)  # the end user Claude is told of is the `user`
        elif shape is Shape.RESPONSES and not _cache_setting_travels(key, value, target, body.get("model")):
            dropped.append(key)
        elif shape is Shape.RESPONSES and key == "input" and not breakpoints_travel(target, body.get("model")) and in_responses_input(value):
            dropped.append(BREAKPOINT)
    return dropped + _nested(shape, body) + _unreasoned(shape, body) + _effortless(shape, body) + _unsampled(shape, body, dropped)


class ThreadRefused(TranslationRefused):
    """A Messages request's `thread` for a target that holds no conversation, refused in Anthropic's words for a request
    Threads cannot serve: the anthropic SDK's thread (`continue_unthreaded`, its tool runner's) reads the error code and
    sends the turn again with the whole conversation and no `thread`, where any other 400 ended the run."""

    def __init__(self, target: str) -> None:
        super().__init__(f"'thread' cannot be translated for {_article(target)} {target} target ({FIELDS[Shape.MESSAGES]['thread'].note}); "
                         "send the full conversation without `thread`")

    def body(self, protocol: Protocol) -> bytes:
        if protocol is not Protocol.ANTHROPIC:
            return super().body(protocol)
        return orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": self.message,
                                                        "details": {"error_code": "thread_unsupported_request"}}})


def _cache_setting_travels(key: str, value: Any, target: str, model: Any) -> bool:
    """Whether a Responses request's cache setting `key` goes on to `target` (other fields: not this rule's)."""
    if key == "prompt_cache_retention":
        return retention_travels(target, model, value)
    return key != "prompt_cache_options" or options_travel(target, model)


def _unreasoned(shape: Shape, body: dict[str, Any]) -> list[str]:
    """A Messages request's reasoning settings, which an OpenAI model that does not reason has no use
    for (and would refuse): left out, and named."""
    if shape is not Shape.MESSAGES or reasons(body.get("model")):
        return []
    thinking, config = body.get("thinking"), body.get("output_config")
    out = ["thinking"] if isinstance(thinking, dict) and thinking.get("type") not in THINKING_OFF else []
    return out + (["output_config.effort"] if isinstance(config, dict) and config.get("effort") is not None else [])


def _effortless(shape: Shape, body: dict[str, Any]) -> list[str]:
    """A Chat request's reasoning_effort, which a Claude model without effort would refuse and which is not sent as
    thinking (reasoning.py): left out, and named."""
    effort = body.get("reasoning_effort") if shape is Shape.CHAT else None
    return ["reasoning_effort"] if (isinstance(effort, str) and effort != "none" and not claude_efforts(body.get("model"))
                                    and chat_thinking(body) is None) else []


def _unsampled(shape: Shape, body: dict[str, Any], dropped: list[str]) -> list[str]:
    """A request's temperature and top_p, which a model with its own sampling refuses (a Claude one for a Chat
    request, a reasoning OpenAI one for a Messages request), and a Chat request's top_p beside a temperature for a
    Claude model that takes one of the two: left out, and named."""
    model = body.get("model")
    if shape is Shape.CHAT and not fixed_sampling(model) and chat_thinking(body) is not None:
        return unsampled(body)  # thinking takes no temperature, a top_p of 0.95 or more only (reasoning.py): no pair left
    if shape is Shape.CHAT and not fixed_sampling(model) and one_sampler(body):
        return ["top_p"]
    if not (fixed_sampling(model) if shape is Shape.CHAT else shape is Shape.MESSAGES and not takes_sampling(body)):
        return []
    return [key for key in ("temperature", "top_p") if body.get(key) is not None and key not in dropped]


def _nested(shape: Shape, body: dict[str, Any]) -> list[str]:
    """Fields inside the conversation that the other protocol has no place for and that are left out,
    named like top-level ones: Chat's participant `name` (a tool message's is its function's, which the
    call id carries), the `ttl` of an explicit prompt-cache breakpoint (breakpoints.py), and Claude's
    block-level `cache_control` (an OpenAI target caches by prefix)."""
    messages = body.get("messages")
    messages = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
    if shape is Shape.CHAT:
        search = body.get("web_search_options")
        sized = ["web_search_options.search_context_size"] if isinstance(search, dict) and search.get("search_context_size") else []
        named = ["messages.name"] if any(m.get("name") and m.get("role") != "tool" for m in messages) else []
        return named + sized + ([f"{BREAKPOINT}.ttl"] if lifetimes(messages) else [])
    if shape is Shape.MESSAGES:
        system, tools = body.get("system"), body.get("tools")
        carried = takes_breakpoints(body.get("model"))  # markers on system, user and tool-result blocks travel (breakpoints.py)
        items = [*(system if isinstance(system, list) and not carried else ()), *(tools if isinstance(tools, list) else ())]
        for message in messages:
            if carried and message.get("role") != "assistant":
                continue
            content = message.get("content")
            for block in content if isinstance(content, list) else ():
                inner = block.get("content") if isinstance(block, dict) else None  # a tool_result's blocks
                items += [block, *(inner if isinstance(inner, list) else ())]
        if any(isinstance(item, dict) and item.get("cache_control") for item in items):
            return ["cache_control"]
    return []


def _built_in_limit(body: dict[str, Any], target: str) -> list[str]:
    """A Responses request's `max_tool_calls` ("the maximum number of total calls to built-in tools", openai 3.x), named
    dropped where it offers none but function, custom and namespace tools (less a provider-run tool search, left out:
    tool_search.py); refused beside a built-in tool, whose calls the target would not limit."""
    tools = tool_search.offered_tools(body)
    built_in = [t.get("type") for t in tools if isinstance(t, dict) and t.get("type") not in ("function", "custom", "namespace")] if isinstance(tools, list) else []
    if built_in and target.startswith("Anthropic") and all(kind in WEB_SEARCH_TOOLS for kind in built_in):
        return []  # Claude's web search tool's max_uses (web_search.py), 0 offering it none
    if built_in:
        raise refuse(f"'max_tool_calls' beside the built-in tool {built_in[0]!r} (the target would not limit its calls)", target)
    return ["max_tool_calls"]


def _include(entries: Any, target: str) -> list[str]:
    if not isinstance(entries, list):
        raise TranslationRefused("include: a list is required")
    for entry in entries:
        if entry not in INCLUDE_DROPPED:
            raise TranslationRefused(f"include {entry!r} cannot be translated for {_article(target)} {target} target "
                                     "(a translated answer has nothing to include); send it to a target of its own protocol")
    return [f"include.{entry}" for entry in entries]


def refuse(what: str, target: str) -> TranslationRefused:
    """The 400 for a part of a request (`what`, naming where it is) that `target` cannot take the same."""
    return TranslationRefused(f"{what} cannot be translated for {_article(target)} {target} target; send it to a target of its own protocol")


def _article(target: str) -> str:
    return "an" if target[:1] in "AEIOU" else "a"


def table_markdown() -> str:
    """FIELDS as the Markdown tables docs/api.md holds (tests/routing/test_field_table.py compares them)."""
    out = []
    for shape, fields in FIELDS.items():
        out += [f"**{shape}**", "", "| field | fate | how / why |", "|---|---|---|"]
        for key, field in fields.items():
            neutral = field.neutral
            extra = f" (dropped when {' or '.join(f'`{_show(n)}`' for n in neutral)})" if neutral and field.fate is not Fate.DROPPED else ""
            out.append(f"| `{key}` | {field.fate}{extra} | {field.note} |")
        out.append("")
    return "\n".join(out)


def mark_dropped(headers: dict[str, str], dropped: list[str]) -> None:
    """Name `dropped` in an answer's `x-slipstream-dropped-fields` (joining what a translation before named)."""
    if dropped:
        named = [f for f in headers.get(DROPPED_HEADER, "").split(",") if f]
        headers[DROPPED_HEADER] = ",".join(dict.fromkeys([*named, *dropped]))


def _show(value: Any) -> str:
    return orjson.dumps(value).decode()
