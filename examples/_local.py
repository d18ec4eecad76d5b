"""Shared by the examples: a local stand-in for the providers, so every example runs offline.

Set SLIPSTREAM_EMULATOR_URL to use an emulator you started yourself (`slipstream emulate`): it gets
the example's settings (latency, answer length) for the example's duration, then its own back, and
its counters are read as differences (they count what came before too). Otherwise one is started in
this process for the example's duration.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

TEAM_KEY = "sk-example-team"


@contextlib.contextmanager
def emulator_url(**config: float) -> Iterator[str]:
    if url := os.environ.get("SLIPSTREAM_EMULATOR_URL"):
        import httpx

        url = url.rstrip("/")
        before = httpx.get(f"{url}/_emulator/config").raise_for_status().json()
        if config:
            httpx.post(f"{url}/_emulator/config", json=config).raise_for_status()
        try:
            yield url
        finally:
            if config:
                httpx.post(f"{url}/_emulator/config", json={name: before[name] for name in config}).raise_for_status()
        return
    from emulator.app import EmulatorConfig
    from emulator.testing import running_emulator

    with running_emulator(EmulatorConfig(**config)) as emulator:
        yield emulator.url


def emulator_stats(upstream: str) -> dict[str, int]:
    """The emulator's counters (`GET /_emulator/stats`)."""
    import httpx

    stats: dict[str, int] = httpx.get(f"{upstream}/_emulator/stats").raise_for_status().json()
    return stats


def policy_file(upstream: str, extra: str = "") -> Path:
    """A team policy whose providers are the emulator (in real use: the hosted APIs and your keys)."""
    path = Path(tempfile.mkdtemp(prefix="slipstream-example-")) / "example.yaml"
    path.write_text(
        f"""team: example
api_keys: [{{value: "{TEAM_KEY}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{upstream}", api_key: "emulator-key"}}
  gpt: {{kind: openai, base_url: "{upstream}/v1", api_key: "emulator-key"}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude}}]
  - match: {{model: "*"}}
    targets: [{{provider: gpt}}]
{extra}"""
    )
    return path
