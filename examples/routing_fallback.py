"""Routing with fallbacks: requests keep flowing while a provider fails.

The emulator injects faults (429 with retry-after, 529 overloaded, 500, a dropped connection) into
the first target; the route falls back to a second target, across providers: an Anthropic-shaped
request served by an OpenAI-compatible target, translated both ways.

    python examples/routing_fallback.py
"""

from __future__ import annotations

import anthropic
import httpx
from _local import TEAM_KEY, emulator_stats, emulator_url, policy_file

from gateway.testing import running_proxy

POLICY_TAIL = """retry: {max_attempts: 2, base_delay_ms: 50, max_delay_ms: 2000}
"""


def main() -> None:
    with emulator_url() as upstream:
        path = policy_file(upstream, POLICY_TAIL)
        # Claude models fall back to an OpenAI model: `claude-*` -> [claude, gpt(gpt-5-mini)].
        path.write_text(path.read_text().replace("targets: [{provider: claude}]", "targets: [{provider: claude}, {provider: gpt, model: gpt-5-mini}]"))
        with running_proxy([path]) as proxy:
            before = emulator_stats(upstream)  # an emulator you started has counted earlier requests too
            client = anthropic.Anthropic(base_url=proxy.url, api_key=TEAM_KEY, max_retries=0)
            for fault in ("429:retry_after=30", "529", "500", "reset", None):
                if fault:
                    # The next attempt on the first target fails with this fault.
                    httpx.post(f"{upstream}/_emulator/faults", json={"fault": fault, "count": 1, "match": {"model": "claude-*"}})
                raw = client.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=32, messages=[{"role": "user", "content": "Hello"}])
                message = raw.parse()
                print(f"fault {fault or 'none':>20} -> answered by {raw.headers['x-slipstream-route']:<22} stop={message.stop_reason}")
            stats = emulator_stats(upstream)
            attempts, faults = (stats[name] - before[name] for name in ("requests_total", "faults_injected"))
            print(f"every request answered; upstream attempts: {attempts}, faults injected: {faults}")


if __name__ == "__main__":
    main()
