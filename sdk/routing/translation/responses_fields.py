"""The Responses shape's part of the field table (fields.FIELDS[Shape.RESPONSES]): what becomes of each top-level field
of a Responses request sent to a Chat Completions target, or on through Chat to Anthropic Messages. fields.py reads it
and renders it into docs/api.md with the other shapes'."""

from __future__ import annotations

from sdk.routing.translation.field_types import D, Field, R, T

RESPONSES_FIELDS: dict[str, Field] = {
    "model": Field(T, "model (the route's target model)"),
    "input": Field(T, "messages (message, function_call (a call_id over Chat's 40 characters shortened as for Messages), "
                          "function_call_output (its images and files in Claude's tool_result, in the output's order; "
                          "for a Chat model they follow in a user message: tool messages hold text), custom_tool_call and its output as a function call of "
                          "`input` and its result, inline input_file → file part (a text file, .txt, .md, .json, code: a document with a "
                          "text source for Claude, its text for a Chat model, which takes PDFs only); an input_file by file_url → a document from that URL "
                          "for Claude (a Chat target takes files inline only: refused); a part's `prompt_cache_breakpoint` → "
                          "a breakpoint for Claude, as from Chat Completions, and as it is for a Chat model that takes it "
                          "(gpt-5.6 and later; elsewhere dropped, named); a client-run tool search's tool_search_call and tool_search_output as "
                          "a call of the function `tool_search` and its result naming the tools it loaded, which are offered "
                          "from then on; shell_call and apply_patch_call and their outputs as calls of their functions and results "
                          "(a shell's stdout, stderr and exit code; a patch's status and output); additional_tools items' tools offered from the start; a compaction_trigger (Codex's compaction: "
                          "last, as OpenAI requires) as a last user message asking for a summary, tool_choice none, the "
                          "answer one compaction item holding it; such a compaction item later as a user message with the "
                          "summary (one OpenAI encrypted: refused); configuration_update items' reasoning effort and text format as the "
                          "request's (the last of each); a web_search_call as assistant text (its query, the sources listed); a "
                          "provider-run tool search's items, and reasoning items, left out)"),
    "instructions": Field(T, "a system message"),
    "previous_response_id": Field(T, "the stored conversation, expanded into messages"),
    "tools": Field(T, "function tools; custom tools (Codex's apply_patch) as functions of one string, `input` (a grammar "
                          "in the description, not enforced), their calls answered as custom_tool_call items; a namespace's "
                          "tools (openai 3.x, Codex's collaboration and MCP app tools) as tools named `NAMESPACE__NAME`, "
                          "the history's calls of them too, their calls answered with the tool's name and `namespace`; web_search "
                          "(and web_search_preview) to Claude as its web search server tool, as Chat's "
                          "web_search_options; the built-in tools the client runs as functions of their names, their calls answered as "
                          "their own items (tool_search run by the client, Codex's for its MCP tools: tool_search_call; shell in a "
                          "local environment, the Agents SDK's ShellTool: shell_call; apply_patch: apply_patch_call, a V4A diff "
                          "described to the model); tool_search run by the provider left out, named as "
                          "tools.tool_search, its deferred tools offered from the start; other built-in tools, and web "
                          "search to a Chat target, refused"),
    "tool_choice": Field(T, "tool_choice (a custom tool's as its function's; allowed_tools as Chat's, which a Claude "
                            "target gets as only the allowed tools)"),
    "parallel_tool_calls": Field(T, "parallel_tool_calls"),
    "text": Field(T, "format → response_format (json_object, json_schema); verbosity → verbosity (for a Chat model "
                     "without it, as for Claude, an instruction in the system prompt)"),
    "reasoning": Field(T, "effort → reasoning_effort (dropped, named reasoning.effort, for a Chat model that does not "
                          "reason and a Claude model without effort, which refuse it); summary dropped (a translated answer has no reasoning items "
                          "to summarize), named as reasoning.summary"),
    "max_output_tokens": Field(T, "max_completion_tokens (for an Anthropic target, at most the Claude model's own most)"),
    "stream": Field(T, "stream (the events are built from Chat chunks)"),
    "temperature": Field(T, "temperature"),
    "top_p": Field(T, "top_p"),
    "user": Field(T, "user"),
    "safety_identifier": Field(T, "safety_identifier (for an Anthropic target, metadata.user_id as from Chat Completions)"),
    "prompt_cache_key": Field(T, "prompt_cache_key (an Anthropic target gets breakpoints instead)"),
    "include": Field(T, "entries that ask for something a translated answer has not (reasoning.encrypted_content) "
                        "are dropped and named as include.ENTRY; others refused", ([],)),
    "store": Field(D, "Slipstream's response store keeps the response"),
    "metadata": Field(D, "tags stored with the response"),
    "client_metadata": Field(D, "information about the client"),
    "service_tier": Field(D, "billing tier"),
    "truncation": Field(T, "`auto` applied by the gateway: where the target answers that the prompt is over its context "
                           "window (its 400 names the window and the prompt's tokens), the oldest items are dropped, in whole "
                           "turns (the opening system and developer messages kept), and the request sent again, at most 3 "
                           "times; a last turn that does not fit alone is the target's overflow", ("disabled",)),
    "stream_options": Field(D, "obfuscation padding of stream events"),
    "prompt_cache_options": Field(T, "prompt_cache_options for a Chat target whose model takes it (gpt-5.6 and later); "
                                     "elsewhere dropped, named (Claude has no cache mode); its comparison_response_id, which "
                                     "Chat's has not, never sent: the response's `prompt_cache_diagnostics` is `unavailable` "
                                     "(a translated target has no earlier response to compare with)"),
    "prompt_cache_retention": Field(T, "prompt_cache_retention for a Chat target (`24h` where the model has extended "
                                       "retention: gpt-4.1, gpt-5, gpt-5.1 to 5.5; elsewhere dropped, named); dropped "
                                       "for an Anthropic target, as from Chat Completions"),
    "context_management": Field(D, "OpenAI's server-side compaction past a token threshold: the target is sent "
                                   "the conversation as it is, and one past its window is the Responses API's "
                                   "`context_length_exceeded`, on which clients compact"),
    "image": Field(D, "how OpenAI compresses images held in context; the target reads them as it does"),
    "access_programs": Field(D, "which of OpenAI's Cyber access programs (usage-policy tiers for security work) the "
                                "request falls under; the target answers under its own provider's policy"),
    "background_options": Field(D, "a background run's completion window and priority hint: without `background: "
                                   "true`, which is refused, they change nothing"),
    "moderation": Field(R, "OpenAI's moderation of the input and output (`block` withholds a flagged answer, `score` "
                           "adds its results): a translated target runs none, and dropping it would pass "
                           "unmoderated text"),
    "background": Field(R, "background runs exist only on OpenAI", (False,)),
    "max_tool_calls": Field(T, "a limit on built-in tools' calls only: with none but function, custom and namespace "
                               "tools (whose calls it does not limit) it changes nothing, and is dropped, named; beside "
                               "web search to Claude, the web search server tool's `max_uses` (0: no search offered); "
                               "beside another built-in tool, which the target runs or has the client run without it, refused"),
    "top_logprobs": Field(R, "no counterpart", (0,)),
    "prompt": Field(R, "OpenAI's stored prompt templates"),
    "conversation": Field(R, "OpenAI's conversation objects"),
}
