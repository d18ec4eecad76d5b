"""A large request's prompt is hashed for prefix affinity off the event loop.

Through the proxy with the official client, the emulator upstream. A `prefix_affinity` route serializes
the request's whole prompt to cut it into blocks (`sdk/routing/affinity.py:prefix_hashes`): work in
proportion to the body (about 15 ms for 10 MB, more within the default 32 MiB body limit), which ran on
the event loop every team's requests share. A request of 256 KiB or more is hashed in the heavy-work
pool now, as its team's turn; a small one stays where it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.routing import router
from tests.helpers import large_then_small_chat, oai, running_where

KEY = "sk-alpha-affinity-hash"


def test_a_large_requests_prefix_is_hashed_in_the_heavy_work_pool(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch) -> None:
    ran: list[tuple[str, str]] = []
    hashes = router.prefix_hashes

    def recorded(body: dict[str, Any]) -> list[bytes]:
        ran.append(running_where())
        return hashes(body)

    monkeypatch.setattr(router, "prefix_hashes", recorded)
    (tmp_path / "alpha.yaml").write_text(f"""team: alpha
api_keys: [{{value: "{KEY}"}}]
providers:
  a: {{kind: openai, base_url: "{fresh_emulator.url}/v1", api_key: "up-openai"}}
  b: {{kind: openai, base_url: "{fresh_emulator.url}/v1", api_key: "up-openai"}}
routes:
  - match: {{model: "gpt-*"}}
    strategy: prefix_affinity
    targets: [{{provider: a}}, {{provider: b}}]
prompt_cache: {{enabled: false}}
""")
    with running_proxy([tmp_path]) as proxy:
        large_then_small_chat(oai(proxy, KEY))
    assert ran[0] == ("slipstream-heavy", "alpha")  # before: the event loop's thread
    assert len(ran) == 2 and ran[1][0] != "slipstream-heavy"
