"""Prompt-cache benchmark against the emulator (not a test).

Workload: several agentic conversations with tools, a shared document, a system prompt that starts
with a timestamp and a request id, tool schemas whose key order changes on every call (a Go-map
client), and tool loops, one of which adds more than 20 blocks in a single turn. Modes:
  as-written  the client's requests unchanged (prompt_cache off)
  litellm     client-side markers on the system prompt and the last message (what LiteLLM's
              cache_control_injection_points / enable_anthropic_prompt_caching inject)
  advice      Slipstream with reorder off: canonical JSON + placement, busters reported only
  slipstream  Slipstream with `prompt_cache: {reorder: true}`
"Possible" is the ideal under the provider's rules: for each request, the longest prefix (tokens) it
shares with any earlier request once the busters are out of the prefix, counted when it reaches the
model minimum. Run: .venv/bin/python bench/prompt_cache.py [--scale 0.1] [--conversations 6]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from sdk.policy import load_policy
from sdk.promptcache import stats
from sdk.promptcache.blocks import anthropic_layout
from sdk.providers.upstream import close_upstream_for_running_loop
from sdk.runtime import TeamRuntime
from sdk.types import Endpoint, LLMRequest, LLMStream
from tests.helpers import write_policy

MODEL = "claude-sonnet-4-6"
PRICE = 3.0  # $/MTok base input, Sonnet 4.6 (A.10): read 0.1x, 5m write 1.25x
INSTRUCTIONS = "You are the build agent of ACME. Use the tools to inspect and fix the repository.\n" + (
    "Always explain the change, run the tests, and keep diffs minimal. " * 120)
DOCUMENT = "ACME engineering handbook. " + "Section: builds are hermetic and reproducible; caches are keyed by inputs. " * 250


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    tools = []
    for name in ("read_file", "write_file", "run_tests", "grep", "list_dir"):
        props = {f"{name}_arg_{i}": {"type": "string", "description": f"argument {i} of {name} " * 6} for i in range(12)}
        keys = list(props)
        rng.shuffle(keys)  # the client's map iteration order differs on every call
        schema = {"properties": {k: props[k] for k in keys}, "type": "object", "required": sorted(props)[:2]}
        tools.append({"name": name, "description": f"{name} tool", "input_schema": schema})
    return tools


def _system(step: int) -> str:
    stamp = f"2026-05-01T10:{step // 60 % 60:02d}:{step % 60:02d}Z"
    return f"Current time: {stamp}\nRequest id: req_{uuid.uuid4().hex[:16]}\n{INSTRUCTIONS}"


def _conversation_turns(conv: int) -> list[int]:
    """Tool calls per turn; conversation 0 has one long tool loop (> 20 blocks in one turn)."""
    return [1, 2, 12, 1, 3] if conv == 0 else [1, 2, 1, 3, 1]


def workload(conversations: int, seed: int = 7) -> list[list[dict[str, Any]]]:
    """Per conversation, the request bodies in order (each turn: a request per tool step)."""
    rng = random.Random(seed)
    step = 0
    out = []
    for conv in range(conversations):
        messages: list[dict[str, Any]] = [{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": DOCUMENT}},
            {"type": "text", "text": f"Task {conv}: fix the flaky build in module {conv}."}]}]
        bodies = []
        for turn, calls in enumerate(_conversation_turns(conv)):
            if turn:
                messages.append({"role": "user", "content": f"Follow-up {turn} for task {conv}: " + "please continue " * 10})
            for call in range(calls):
                step += 1
                bodies.append({"model": MODEL, "max_tokens": 32, "stream": True, "system": _system(step),
                               "tools": _tools(rng), "messages": [dict(m) for m in messages]})
                tool_id = f"toolu_{conv}_{turn}_{call}"
                messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "grep",
                                                                   "input": {"pattern": f"flaky{call}", "path": "src"}}]})
                messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id,
                                                              "content": f"src/m{conv}.py:{call}: " + "match " * 40}]})
            step += 1
            bodies.append({"model": MODEL, "max_tokens": 32, "stream": True, "system": _system(step),
                           "tools": _tools(rng), "messages": [dict(m) for m in messages]})
            messages.append({"role": "assistant", "content": f"Done with turn {turn}: " + "summary " * 20})
        out.append(bodies)
    return out


def litellm_markers(body: dict[str, Any]) -> dict[str, Any]:
    """Marker on the system message and on the last message, as LiteLLM's injection points do."""
    body = dict(body)
    body["system"] = [{"type": "text", "text": body["system"], "cache_control": {"type": "ephemeral"}}]
    messages = [dict(m) for m in body["messages"]]
    last = messages[-1]
    content = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
    last["content"] = [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]
    body["messages"] = messages
    return body


async def run_mode(url: str, mode: str, convs: list[list[dict[str, Any]]], directory: Path) -> dict[str, Any]:
    team = f"bench-{mode}"
    extra = {"as-written": "{enabled: false}", "litellm": "{enabled: false}", "advice": "{reorder: false}",
             "slipstream": "{reorder: true}"}[mode]
    runtime = TeamRuntime.build(load_policy(write_policy(directory, team, f"k-{team}", url, f"prompt_cache: {extra}\n")))
    totals: dict[str, Any] = dict(input=0, read=0, write=0, uncached=0, ttft=0.0, n=0)
    hit_rate: list[float] = []  # cumulative share of input tokens read from cache, after each request
    # Conversations run in interleaved rounds, as concurrent users would.
    for round_ in range(max(len(c) for c in convs)):
        for bodies in convs:
            if round_ >= len(bodies):
                continue
            body = litellm_markers(bodies[round_]) if mode == "litellm" else bodies[round_]
            started = time.perf_counter()
            answer, _ = await runtime.handle(LLMRequest(Endpoint.MESSAGES, body))
            totals["ttft"] += time.perf_counter() - started  # streams return at their first event
            if isinstance(answer, LLMStream):
                async for _ in answer.events:
                    pass
                await answer.aclose()
            usage = answer.usage
            totals["input"] += usage.total_input_tokens
            totals["read"] += usage.cache_read_tokens
            totals["write"] += usage.cache_write_tokens
            totals["uncached"] += usage.input_tokens
            totals["n"] += 1
            hit_rate.append(totals["read"] / max(1, totals["input"]))
    await close_upstream_for_running_loop()
    totals["cost"] = (totals["uncached"] + 0.1 * totals["read"] + 1.25 * totals["write"]) * PRICE / 1e6
    totals["report"] = stats.report(team)
    totals["hit_rate"] = hit_rate
    return totals


def possible_reads(sent: list[dict[str, Any]], minimum: int = 1024) -> int:
    """Ideal reads: longest shared prefix with any earlier request (moved tail excluded)."""
    seen: list[list[int]] = []
    total = 0
    for body in sent:
        layout = anthropic_layout(body)
        best = max((layout.common_prefix(chain) for chain in seen), default=0)
        best = min(best, len(layout.blocks) - 1)  # the request's own last block is never shared
        if best > 0 and layout.pos[best - 1] >= minimum:
            total += layout.pos[best - 1]
        seen.append(layout.chain)
    return total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.1, help="latency scale of EmulatorConfig.realistic()")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--plot", help="write the cache hit rate over the run as a PNG here")
    args = parser.parse_args()
    convs = workload(args.conversations)
    config = EmulatorConfig.realistic(ttft_base_ms=200.0 * args.scale, ttft_per_uncached_token_ms=0.05 * args.scale,
                                      ttft_per_cached_token_ms=0.002 * args.scale, per_output_token_ms=10.0 * args.scale,
                                      record_requests=100_000)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("as-written", "litellm", "advice", "slipstream"):
            with running_emulator(config) as emu:  # a fresh provider cache per mode
                results[mode] = await run_mode(emu.url, mode, convs, Path(tmp))
                # The bodies the provider received (planning happens per upstream attempt, after the
                # request's own body), for the ideal below.
                results[mode]["sent"] = [orjson.loads(r["body"]) for r in emu.state.recent]
    possible = possible_reads(results["slipstream"]["sent"])
    if args.plot:
        from bench.plots import line_chart

        line_chart(args.plot, "Prompt-cache hit rate over an agentic workload", "request", "share of input tokens read from cache",
                   {mode: (list(range(1, len(r["hit_rate"]) + 1)), r["hit_rate"]) for mode, r in results.items()})
    base_cost = results["as-written"]["cost"]
    n = results["as-written"]["n"]
    print(f"{n} requests, {args.conversations} conversations, model {MODEL}, latency scale {args.scale}")
    print(f"possible reads (ideal under the provider's rules): {possible} tokens")
    print(f"{'mode':<12} {'cached share':>12} {'of possible':>11} {'input $':>9} {'vs as-written':>13} {'mean TTFT ms':>12}")
    for mode, r in results.items():
        print(f"{mode:<12} {r['read'] / r['input']:>12.1%} {r['read'] / possible:>11.1%} {r['cost']:>9.4f} "
              f"{r['cost'] / base_cost:>13.2f} {1000 * r['ttft'] / r['n']:>12.1f}")
    for mode in ("advice", "slipstream"):
        report = results[mode]["report"]
        print(f"\n{mode}: moved {report['volatile_moved']}, advice {report['volatile_advice']}, "
              f"canonicalized {report['canonicalized']}, expected misses {report['expected_misses']}")
        for cause in report["top_miss_causes"]:
            print(f"  {cause['count']:>4}  {cause['cause']}  {cause['example']}")


if __name__ == "__main__":
    asyncio.run(main())
