"""Helpers shared by test folders."""

from __future__ import annotations

from pathlib import Path


def write_policy(directory: Path, team: str, key: str, emulator_url: str, extra: str = "", upstream_key: str | None = None) -> Path:
    """A policy with one Anthropic and one OpenAI provider, both served by the emulator.

    `upstream_key` replaces both providers' keys (for an emulator that accepts only some keys).
    """
    path = directory / f"{team}.yaml"
    path.write_text(
        f"""team: {team}
api_keys: [{{value: "{key}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator_url}", api_key: "{upstream_key or 'up-anthropic'}"}}
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "{upstream_key or 'up-openai'}"}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude}}]
  - match: {{model: "gpt-*"}}
    targets: [{{provider: gpt}}]
{extra}"""
    )
    return path
