"""Input cost of one conversation through a translated door against the model's native door, both ways.

Workload: a 20-turn conversation with a 16 KB system prompt, each turn the whole history plus a new
question (as every chat client sends it), through the Slipstream proxy with its default policy
(`prompt_cache` on, breakpoints `auto`), on the emulator (the providers' prompt-cache rules, default
prices from sdk/spend.py):
- to `claude-sonnet-4-6`: the official OpenAI client (Chat Completions, translated to Messages)
  against the official Anthropic client (Messages, native);
- to `gpt-4o`: the official Anthropic client (Messages, translated to Chat Completions) against the
  official OpenAI client (Chat Completions, native), where OpenAI caches prefixes by itself.
Input cost is uncached input tokens at the input price, cache reads at the read price and cache
writes at the write price, summed over the turns.

Run in a tree to measure it, e.g. the commit before per-attempt planning for "before":
  git worktree add /tmp/base <commit>; cp bench/translation_cache.py /tmp/base/bench/
  (cd /tmp/base && PYTHONPATH=. /path/to/.venv/bin/python bench/translation_cache.py)
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai

from emulator.testing import running_emulator
from gateway.testing import running_proxy
from sdk.spend import price_of

CLAUDE, GPT = "claude-sonnet-4-6", "gpt-4o"
KEY = "sk-bench-translation"
SYSTEM = ("You are the support assistant of ACME Industrial. Answer from the service manual, cite its sections "
          "and keep answers short. ") * 134  # 16.6 KB
assert len(SYSTEM) >= 16 * 1024


@dataclass
class Tally:
    uncached: int = 0
    read: int = 0
    written: int = 0

    def add(self, uncached: int, read: int, written: int) -> None:
        self.uncached, self.read, self.written = self.uncached + uncached, self.read + read, self.written + written

    def usd(self, model: str) -> float:
        price = price_of(model, {})
        assert price is not None and price.cache_read is not None and price.cache_write is not None
        return (self.uncached * price.input + self.read * price.cache_read + self.written * price.cache_write) / 1e6


def question(turn: int) -> str:
    return f"Turn {turn}: the pump controller shows error E{40 + turn}; what does the manual say to check next?"


def through_chat(url: str, model: str, turns: int) -> Tally:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    tally = Tally()
    for turn in range(turns):
        messages.append({"role": "user", "content": question(turn)})
        answer = client.chat.completions.create(model=model, max_tokens=64, messages=messages)  # type: ignore[arg-type]
        usage = answer.model_dump()["usage"]  # cache_write_tokens is Slipstream's field, not in every client's type
        details = usage.get("prompt_tokens_details") or {}
        read, written = details.get("cached_tokens") or 0, details.get("cache_write_tokens") or 0
        tally.add(usage["prompt_tokens"] - read - written, read, written)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    return tally


def through_messages(url: str, model: str, turns: int) -> Tally:
    client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
    messages: list[dict[str, str]] = []
    tally = Tally()
    for turn in range(turns):
        messages.append({"role": "user", "content": question(turn)})
        answer = client.messages.create(model=model, max_tokens=64, system=SYSTEM, messages=messages)  # type: ignore[arg-type]
        usage = answer.usage
        tally.add(usage.input_tokens, usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0)
        messages.append({"role": "assistant", "content": "".join(b.text for b in answer.content if b.type == "text")})
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    print(f"{args.turns} turns, {len(SYSTEM)} B system prompt, emulator, default prices")
    print(f"{'model':<18} {'door':<22} {'uncached':>9} {'read':>9} {'written':>9} {'input USD':>10} {'vs native':>10}")
    # (model, translated door, native door): the native one last, the ratio's base
    for model, doors in ((CLAUDE, (("/v1/chat/completions", through_chat), ("/v1/messages", through_messages))),
                         (GPT, (("/v1/messages", through_messages), ("/v1/chat/completions", through_chat)))):
        rows = [(door, _run(run, model, args.turns)) for door, run in doors]
        native = rows[-1][1].usd(model)
        for door, tally in rows:
            print(f"{model:<18} {door:<22} {tally.uncached:>9} {tally.read:>9} {tally.written:>9} {tally.usd(model):>10.4f} "
                  f"{tally.usd(model) / native:>9.2f}x")


def _run(run: Callable[[str, str, int], Tally], model: str, turns: int) -> Tally:
    with running_emulator() as emulator, tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "bench.yaml").write_text(f"""team: bench
api_keys: [{{value: "{KEY}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator.url}", api_key: "up-anthropic"}}
  gpt: {{kind: openai, base_url: "{emulator.url}/v1", api_key: "up-openai"}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude}}]
  - match: {{model: "gpt-*"}}
    targets: [{{provider: gpt}}]
""")
        with running_proxy([directory], watch_interval_s=None) as proxy:
            return run(proxy.url, model, turns)


if __name__ == "__main__":
    main()
