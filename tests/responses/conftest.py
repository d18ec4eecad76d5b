"""Fixtures for the Responses API tests: one team whose targets cover every way /v1/responses is served.

- `oai-*` → `oai` (model gpt-4.1-mini) and `o4-*` (a reasoning model) → `oai`: an OpenAI-kind
  provider serving /responses natively (`responses: native`);
- `gpt-*`   → `gpt`, an OpenAI-kind provider told its upstream has no /responses (`responses: chat`):
  translated to Chat Completions;
- `auto-*`  → `auto` (model gpt-4o), an OpenAI-kind provider left to discover it (`responses: auto`);
- `claude-*` → `claude`, Anthropic: translated to Chat, then to Messages;
- `fall-*`  → `oai` (model `gpt-primary`, where tests aim faults) first, then `claude`;
- `mixed-*` → `gpt` (translated) first, then `oai` (native).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.testing import RunningServer, running_proxy
from sdk.extras import missing_extra_message
from sdk.responses.store import StoredResponse

KEY = "sk-responses-team"
OTHER_KEY = "sk-other-team"
CACHING_KEY = "sk-caching-team"  # the same targets with the prompt-cache optimizer on
HITS_KEY = "sk-hits-team"  # the same targets with the response cache (exact and semantic tiers) on
MIB = 1024 * 1024


def stored_response(team: str, response_id: str = "resp_1", previous: str | None = None, text: str = "hi") -> StoredResponse:
    """A stored response of `team`'s: one user message of `text`, continuing `previous` if given."""
    return StoredResponse(response_id, team, "claude", False, 0.0, [{"role": "user", "content": text}],
                          {"id": response_id, "output": [{"type": "message", "id": f"msg_{response_id}", "content": []}]}, previous)


def policy_text(team: str, key: str, emulator_url: str, prompt_cache: str = "{enabled: false}", extra: str = "") -> str:
    return f"""team: {team}
api_keys: [{{value: "{key}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator_url}", api_key: "up-anthropic"}}
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai", responses: chat}}
  oai: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai", responses: native}}
  auto: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai"}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude}}]
  - match: {{model: "gpt-*"}}
    targets: [{{provider: gpt}}]
  - match: {{model: "oai-*"}}
    targets: [{{provider: oai, model: gpt-4.1-mini}}]  # the emulator, like OpenAI, 404s unknown models
  - match: {{model: "o4-*"}}
    targets: [{{provider: oai}}]
  - match: {{model: "auto-*"}}
    targets: [{{provider: auto, model: gpt-4o}}]
  - match: {{model: "fall-*"}}
    targets: [{{provider: oai, model: gpt-primary}}, {{provider: claude, model: claude-backup}}]
  - match: {{model: "mixed-*"}}
    targets: [{{provider: gpt, model: gpt-4o}}, {{provider: oai, model: gpt-4.1-mini}}]
retry: {{max_attempts: 1}}
prompt_cache: {prompt_cache}
{extra}"""


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, emulator) -> Path:
    directory = tmp_path_factory.mktemp("responses-policies")
    (directory / "responses.yaml").write_text(policy_text("responses", KEY, emulator.url))
    (directory / "other.yaml").write_text(policy_text("other", OTHER_KEY, emulator.url))
    (directory / "caching.yaml").write_text(policy_text("caching", CACHING_KEY, emulator.url, "{enabled: true}"))
    if missing_extra_message("semantic", "the response cache") is None:  # else its tests skip, naming the extra
        (directory / "hits.yaml").write_text(policy_text("hits", HITS_KEY, emulator.url, extra="semantic_cache: {enabled: true}"))
    return directory


@pytest.fixture(scope="module")
def proxy(policy_dir, tmp_path_factory) -> Iterator[RunningServer]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("responses-data")))
        with running_proxy([policy_dir]) as running:
            yield running
