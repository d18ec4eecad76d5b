"""Shared by the examples: a local stand-in for the providers, so every example runs offline.

Set SLIPSTREAM_EMULATOR_URL to use an emulator you started yourself (`slipstream emulate`);
otherwise one is started in this process for the example's duration.
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
        yield url.rstrip("/")
        return
    from emulator.app import EmulatorConfig
    from emulator.testing import running_emulator

    with running_emulator(EmulatorConfig(**config)) as emulator:
        yield emulator.url


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
