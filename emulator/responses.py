"""OpenAI Responses API: POST /v1/responses (stream and not), POST /v1/responses/input_tokens and
POST /v1/responses/compact.

Shapes follow the OpenAI API reference and the official client's types (openai.types.responses). The
conversation is turned into its Chat Completions view (responses_input.py), so prompt caching
(C.1, `prompt_cache_key`), the tool rule and reply text are exactly those of chat completions.
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

import orjson

from . import conversations
from . import openai_wire as wire
from .asgi import JSON_CT, SSE_HEADERS, Call
from .caching import CachePlan, openai_prompt_blob, plan_openai
from .conversations import Conversation
from .logprobs import chat_entries, tokens_of
from .models import REASONING_TOKENS, bills_cache_writes, openai_generates
from .openai import pick_tool
from .reply import Reply, make_reply, output_schema
from .responses_input import chat_view, input_items, validate
from .responses_store import StoredResponse
from .streaming import respond_after, run_stream
from .text import reply_text, seed_for, split_chunks, split_deltas

if TYPE_CHECKING:
    from .app import Emulator

_REASONING_PREFIXES = ("gpt-5", "o1", "o3", "o4")


def _effort(model: str, body: dict[str, Any]) -> str | None:
    """The reasoning effort in force, or None for models that do not reason (or effort none)."""
    if not model.startswith(_REASONING_PREFIXES) or "-chat" in model:
        return None
    effort = (body.get("reasoning") or {}).get("effort") or "medium"
    return None if effort == "none" else effort


class _Turn:
    """Everything one request resolves to before the reply is planned."""

    def __init__(self, body: dict[str, Any], items: list[dict[str, Any]],
                 context: list[dict[str, Any]], conversation: Conversation | None = None) -> None:
        self.body = body
        self.items = items  # this request's input items
        self.context = context  # earlier turns + items
        self.conversation = conversation  # the one it belongs to (conversations.py), which it is appended to
        self.view = chat_view(body, context)


async def _resolve(emu: Emulator, call: Call, body: dict[str, Any], key: str) -> _Turn | None:
    """Input items plus the `previous_response_id` chain or the `conversation`'s items; None once a 400
    or 404 has been answered."""
    items = input_items(body.get("input"), emu.new_id)
    unknown = next((item["id"] for item in items if item.get("type") == "reasoning" and not item.get("encrypted_content")
                    and isinstance(item.get("id"), str) and not emu.state.responses.holds_item(item["id"], key)), None)
    if unknown is not None:  # a reasoning item by id alone is read from the responses stored on the account
        await wire.not_found(emu, call, f"Item with id '{unknown}' not found. Items are not persisted when `store` is set "
                             "to false. Try again with `store` set to true, or remove this item from your input.", "input")
        return None
    prev_id = body.get("previous_response_id")
    earlier: list[dict[str, Any]] = []
    cid = conversations.named(body)
    if body.get("conversation") is not None and cid is None:
        await wire.bad(emu, call, "Invalid type for 'conversation': expected a string or an object with an 'id'.",
                       "conversation", "invalid_type")
        return None
    if cid is not None:
        if prev_id:
            await wire.bad(emu, call, "Mutually exclusive parameters: Ensure you are only providing one of: "
                           "'previous_response_id' or 'conversation'.", "conversation", "mutually_exclusive_parameters")
            return None
        conversation = emu.state.conversations.get(cid, key)
        if conversation is None:
            await wire.not_found(emu, call, conversations.missing(cid), "conversation")
            return None
        return _Turn(body, items, [*conversation.items, *items], conversation)
    if prev_id:
        got = emu.state.responses.continuation(prev_id, key)
        if got is None:
            await wire.bad(emu, call, f"Previous response with id '{prev_id}' not found.",
                           "previous_response_id", "previous_response_not_found")
            return None
        earlier = got
    return _Turn(body, items, earlier + items)


async def input_tokens(emu: Emulator, call: Call) -> None:
    req = await wire.begin(emu, call, lambda body: validate(body, count_only=True), openai_generates)
    if req is None:
        return
    turn = await _resolve(emu, call, req.body, req.key)
    if turn is not None:
        n = len(openai_prompt_blob(turn.view)) // 4
        await wire.ok(emu, call, {"object": "response.input_tokens", "input_tokens": n})


async def compact(emu: Emulator, call: Call) -> None:
    """The conversation's user messages, then one opaque compaction item (OpenAI's shape; its content
    is a digest here, not a model's summary)."""
    req = await wire.begin(emu, call, lambda body: validate(body, count_only=True), openai_generates)
    if req is None:
        return
    turn = await _resolve(emu, call, req.body, req.key)
    if turn is None:
        return
    users = [{"type": "message", "id": emu.new_id("msg_"), "role": "user", "status": "completed", "content": item["content"]}
             for item in turn.context if item.get("type", "message") == "message" and item.get("role") == "user"]
    blob = openai_prompt_blob(turn.view)
    summary = base64.b64encode(blob[-96:]).decode()  # the last prompt tokens, as opaque as OpenAI's ciphertext
    n, out = len(blob) // 4, 32
    await wire.ok(emu, call, {
        "id": emu.new_id("resp_"), "object": "response.compaction", "created_at": int(time.time()),
        "output": [*users, {"type": "compaction", "id": emu.new_id("cmp_"), "encrypted_content": summary}],
        "usage": {"input_tokens": n, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n + out},
    })


async def create(emu: Emulator, call: Call) -> None:
    req = await wire.begin(emu, call, validate, openai_generates)
    if req is None:
        return
    body, key, model, stream, faults = req.body, req.key, req.model, req.stream, req.faults
    turn = await _resolve(emu, call, body, key)
    if turn is None:
        return
    cfg = emu.config
    scope = f"{key}\x00{model}\x00{body.get('prompt_cache_key') or ''}"
    plan = plan_openai(emu.state.openai_cache, openai_prompt_blob(turn.view), scope, call.start,
                       cfg.openai_cache_ttl_s, bills_cache_writes(model))
    effort = _effort(model, body)
    reasoning = REASONING_TOKENS.get(effort or "", 0)
    mt = body.get("max_output_tokens")
    budget = None if mt is None else max(0, mt - reasoning)  # reasoning counts against the cap
    natural = emu.natural_length(call)
    seed = seed_for(model, turn.view["messages"])
    reply = make_reply(seed, natural, budget, [], pick_tool(turn.view),
                       output_schema(turn.view.get("response_format")))
    resp = _Response(emu, body, model, plan, reply, effort, reasoning, seed)
    if body.get("store", True):
        emu.state.responses.put(resp.id, StoredResponse(key, resp.final, turn.items, turn.context))
    if turn.conversation is not None:  # the turn's input and output join the conversation
        turn.conversation.items += [*turn.items, *resp.final["output"]]
    ttft = cfg.ttft_seconds(plan.uncached, plan.read)
    if stream:
        headers = wire.headers(call)
        headers.extend(SSE_HEADERS)
        events, tokens = resp.events()
        await run_stream(emu, call, headers, events, tokens, faults,
                         lambda seq: resp.failed_event(seq, wire.midstream_error(faults, model)["error"]),
                         ttft, plan.commit)
        return
    headers = wire.headers(call)
    headers.append(JSON_CT)
    delay = ttft + cfg.per_output_token_ms * (reply.output_tokens + reasoning) / 1000.0
    await respond_after(emu, call, delay, 200, orjson.dumps(resp.final), headers, plan.commit)


# Hosted tools the emulator runs, once each, before the answer, when a request offers them (the provider
# bills each call: the gateway's spend counts these items).
_HOSTED = {"file_search": "file_search_call", "image_generation": "image_generation_call",
           "code_interpreter": "code_interpreter_call"}
_PIXEL = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000b49444154789c63600002000005"
    "00017a5eab3f0000000049454e44ae426082")).decode()  # a 1x1 transparent PNG


def _hosted_calls(emu: Emulator, body: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    tools = [t for t in body.get("tools") or () if isinstance(t, dict)]
    offered = [t.get("type") for t in tools]
    calls: list[dict[str, Any]] = []
    for tool, typ in _HOSTED.items():
        if tool not in offered:
            continue
        if typ == "file_search_call":
            calls.append({"id": emu.new_id("fs_"), "type": typ, "status": "completed",
                          "queries": [reply_text(seed, 4)], "results": None})
        elif typ == "code_interpreter_call":  # in the container the tool names, else a new one (`auto`)
            container = next(t.get("container") for t in tools if t.get("type") == tool)
            calls.append({"id": emu.new_id("ci_"), "type": typ, "status": "completed", "code": "print(6 * 7)",
                          "container_id": container if isinstance(container, str) else emu.new_id("cntr_"), "outputs": None})
        else:
            calls.append({"id": emu.new_id("ig_"), "type": typ, "status": "completed", "result": _PIXEL})
    calls += [_mcp_item(emu, body, tool) for tool in tools if tool.get("type") == "mcp"]
    return calls + [item for tool in tools if tool.get("type") == "shell" for item in _shell_items(emu, tool)]


def _shell_items(emu: Emulator, tool: dict[str, Any]) -> list[dict[str, Any]]:
    """A hosted shell (`environment` `container_auto`: a new container, or `container_reference`) runs one
    command, a `shell_call` naming its container and its `shell_call_output`; a local shell's calls are the client's."""
    environment: dict[str, Any] = tool["environment"] if isinstance(tool.get("environment"), dict) else {}
    if environment.get("type") not in ("container_auto", "container_reference"):
        return []
    container = environment.get("container_id") or emu.new_id("cntr_")
    call_id = emu.new_id("call_")
    return [{"id": emu.new_id("sh_"), "type": "shell_call", "call_id": call_id, "status": "completed",
             "action": {"commands": ["echo 42"], "timeout_ms": None, "max_output_length": None},
             "environment": {"type": "container_reference", "container_id": container}},
            {"id": emu.new_id("sho_"), "type": "shell_call_output", "call_id": call_id, "status": "completed",
             "output": [{"stdout": "42\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}], "max_output_length": None}]


def _mcp_item(emu: Emulator, body: dict[str, Any], tool: dict[str, Any]) -> dict[str, Any]:
    """A remote MCP server's one tool (`echo`): an `mcp_approval_request` for it unless the tool says
    `require_approval: "never"` or the input approves a request (`mcp_approval_response`), then the `mcp_call`."""
    label = tool.get("server_label") or "mcp"
    inputs = body["input"] if isinstance(body.get("input"), list) else []
    approved = next((item.get("approval_request_id") for item in inputs if isinstance(item, dict)
                     and item.get("type") == "mcp_approval_response" and item.get("approve") is True), None)
    if approved is None and tool.get("require_approval", "always") != "never":
        return {"id": emu.new_id("mcpr_"), "type": "mcp_approval_request", "server_label": label, "name": "echo",
                "arguments": '{"text": "hello"}'}
    return {"id": emu.new_id("mcp_"), "type": "mcp_call", "server_label": label, "name": "echo",
            "arguments": '{"text": "hello"}', "output": "hello", "error": None, "approval_request_id": approved}


def _usage(plan: CachePlan, out: int, reasoning: int) -> dict[str, Any]:
    return {"input_tokens": plan.total,
            "input_tokens_details": {"cached_tokens": plan.read, "cache_write_tokens": plan.write},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": plan.total + out}


def _echo_tools(tools: Any) -> list[Any]:
    out = []
    for t in tools or ():
        if t.get("type") == "function":
            t = {"type": "function", "description": None, "parameters": None, "strict": True, **t}
        out.append(t)
    return out


class _Response:
    """The planned response: the final object and the F.3 event sequence that builds it."""

    def __init__(self, emu: Emulator, body: dict[str, Any], model: str, plan: CachePlan,
                 reply: Reply, effort: str | None, reasoning: int, seed: int) -> None:
        self.id = emu.new_id("resp_")
        self.reply = reply
        self.reasoning = reasoning
        self.tokens_per_delta = emu.config.tokens_per_delta
        self.created = int(time.time())
        incomplete = reply.stop == "max"
        self.status = "incomplete" if incomplete else "completed"
        self.items: list[dict[str, Any]] = []
        self.summary = ""
        if effort is not None:
            rs: dict[str, Any] = {"id": emu.new_id("rs_"), "type": "reasoning", "summary": []}
            if (body.get("reasoning") or {}).get("summary"):
                self.summary = reply_text(seed ^ 0x5EED, 12)
                rs["summary"] = [{"type": "summary_text", "text": self.summary}]
            if "reasoning.encrypted_content" in (body.get("include") or ()):
                rs["encrypted_content"] = base64.b64encode(
                    f"emulator-reasoning:{seed}:{reasoning}".encode()).decode()
            self.items.append(rs)
        self.items += _hosted_calls(emu, body, seed)
        # include: ["message.output_text.logprobs"] fills the parts' logprobs (top_logprobs 0-20)
        wants_lp = "message.output_text.logprobs" in (body.get("include") or ())
        lp = chat_entries(reply.text, body.get("top_logprobs") or 0) if wants_lp and reply.text else []
        if reply.text or (not reply.tool_name and not self.items):
            self.items.append({
                "id": emu.new_id("msg_"), "type": "message",
                "status": "incomplete" if incomplete else "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": [],
                             "logprobs": lp}]})
        for c in reply.calls():  # one function_call item per call (several in a parallel turn)
            self.items.append({"id": emu.new_id("fc_"), "type": "function_call",
                               "status": "completed", "arguments": c.json,
                               "call_id": emu.new_id("call_"), "name": c.name})
        reasoning_cfg = body.get("reasoning") or {}
        text_cfg = body.get("text") or {}
        cid = conversations.named(body)
        self.base: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": "in_progress", "background": False, "completed_at": None, "error": None,
            "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None,
            "model": model, "output": [], "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "conversation": {"id": cid} if cid is not None else None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "prompt_cache_retention": body.get("prompt_cache_retention"),
            "reasoning": {"effort": effort, "summary": reasoning_cfg.get("summary")},
            "safety_identifier": body.get("safety_identifier"), "service_tier": wire.served_tier(body),
            "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
            "text": {"format": text_cfg.get("format") or {"type": "text"},
                     "verbosity": text_cfg.get("verbosity", "medium")},
            "tool_choice": body.get("tool_choice", "auto"), "tools": _echo_tools(body.get("tools")),
            "top_logprobs": body.get("top_logprobs", 0), "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"), "usage": None,
            "user": body.get("user"), "metadata": body.get("metadata") or {},
        }
        self.final = dict(self.base, status=self.status, output=self.items,
                          completed_at=None if incomplete else self.created,
                          incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
                          usage=_usage(plan, reply.output_tokens + reasoning, reasoning))

    # --- streaming ---------------------------------------------------------------------------

    def events(self) -> tuple[list[bytes], list[int]]:
        """F.3 order with sequence numbers, and the output tokens that pace each event."""
        ev: list[bytes] = []
        toks: list[int] = []

        def emit(typ: str, tokens: int = 0, **data: Any) -> None:
            payload = {"type": typ, "sequence_number": len(ev), **data}
            ev.append(b"event: " + typ.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n")
            toks.append(tokens)

        emit("response.created", response=self.base)
        emit("response.in_progress", response=self.base)
        for i, item in enumerate(self.items):
            typ = item["type"]
            if typ == "reasoning":
                self._reasoning_events(emit, i, item)
            elif typ == "message":
                self._message_events(emit, i, item)
            elif typ in _HOSTED.values():
                self._hosted_events(emit, i, item)
            elif typ.startswith(("mcp_", "shell_")):  # an MCP approval request or call, a hosted shell's: whole
                emit("response.output_item.added", output_index=i, item=item)
                emit("response.output_item.done", output_index=i, item=item)
            else:
                emit("response.output_item.added", output_index=i,
                     item=dict(item, status="in_progress", arguments=""))
                for frag in split_chunks(item["arguments"], 3):
                    emit("response.function_call_arguments.delta", max(1, len(frag) // 4),
                         item_id=item["id"], output_index=i, delta=frag)
                emit("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                     name=item["name"], arguments=item["arguments"])
                emit("response.output_item.done", output_index=i, item=item)
        emit(f"response.{self.status}", response=self.final)
        return ev, toks

    def _reasoning_events(self, emit: Any, i: int, item: dict[str, Any]) -> None:
        emit("response.output_item.added", output_index=i, item=dict(item, summary=[]))
        if self.summary:
            part = {"type": "summary_text", "text": ""}
            emit("response.reasoning_summary_part.added", item_id=item["id"], output_index=i,
                 summary_index=0, part=part)
            for piece in split_deltas(self.summary, 4):
                emit("response.reasoning_summary_text.delta", item_id=item["id"], output_index=i,
                     summary_index=0, delta=piece)
            emit("response.reasoning_summary_text.done", item_id=item["id"], output_index=i,
                 summary_index=0, text=self.summary)
            emit("response.reasoning_summary_part.done", item_id=item["id"], output_index=i,
                 summary_index=0, part=dict(part, text=self.summary))
        emit("response.output_item.done", self.reasoning, output_index=i, item=item)

    def _hosted_events(self, emit: Any, i: int, item: dict[str, Any]) -> None:
        """A hosted tool call: added, in progress, its own step, completed, done (as OpenAI streams them)."""
        typ = item["type"]
        emit("response.output_item.added", output_index=i, item=dict(item, status="in_progress"))
        step = {"file_search_call": "searching", "code_interpreter_call": "interpreting"}.get(typ, "generating")
        steps = ("in_progress", step, "completed")
        for step in steps:
            emit(f"response.{typ}.{step}", item_id=item["id"], output_index=i)
        emit("response.output_item.done", output_index=i, item=item)

    def _message_events(self, emit: Any, i: int, item: dict[str, Any]) -> None:
        emit("response.output_item.added", output_index=i,
             item=dict(item, status="in_progress", content=[]))
        part = item["content"][0]
        ids = {"item_id": item["id"], "output_index": i, "content_index": 0}
        emit("response.content_part.added", **ids, part=dict(part, text=""))
        text, lp = part["text"], part["logprobs"]
        k = self.tokens_per_delta
        pos = 0
        for piece in split_deltas(text, k) if text else ():
            n = len(tokens_of(piece)) if lp else 0
            emit("response.output_text.delta", k, **ids, delta=piece, logprobs=lp[pos: pos + n])
            pos += n
        emit("response.output_text.done", **ids, text=text, logprobs=lp)
        emit("response.content_part.done", **ids, part=part)
        emit("response.output_item.done", output_index=i, item=item)

    def failed_event(self, seq: int, error: dict[str, Any]) -> bytes:
        """The terminal `response.failed` a mid-stream fault sends instead of the rest (`error` as
        `midstream_error` makes it: its code, else its type, and its message)."""
        resp = dict(self.base, status="failed",
                    error={"code": error.get("code") or error.get("type"), "message": error.get("message")})
        payload = {"type": "response.failed", "sequence_number": seq, "response": resp}
        return b"event: response.failed\ndata: " + orjson.dumps(payload) + b"\n\n"
