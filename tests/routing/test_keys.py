"""Several API keys for one provider (sdk/providers/keys.py): a 429 or a refused key moves the call on."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sdk.errors import UpstreamHTTPError
from sdk.policy import ProviderConfig, load_policy
from sdk.runtime import TeamRuntime
from tests.routing.conftest import inject, messages_request
from tests.state.conftest import redis_server, redis_url  # noqa: F401  (fixtures)


def _keys_used(emulator) -> list[str]:
    recent = httpx.get(f"{emulator.url}/_emulator/requests").json()["requests"]
    return [r["headers"]["x-api-key"] for r in recent if r["path"] == "/v1/messages"]


def _keyed_policy(directory: Path, team: str, key: str, emulator_url: str) -> Path:
    """A team with one Anthropic provider holding two keys, one attempt per target."""
    path = directory / f"{team}.yaml"
    path.write_text(f"""team: {team}
api_keys: [{{value: "{key}"}}]
providers:
  keyed: {{kind: anthropic, base_url: "{emulator_url}", api_key: [key-one, key-two]}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: keyed}}]
retry: {{max_attempts: 1}}
""")
    return path


@pytest.fixture
def keyed_runtime(tmp_path: Path, fresh_emulator) -> TeamRuntime:
    return TeamRuntime.build(load_policy(_keyed_policy(tmp_path, "keys", "sk-keys", fresh_emulator.url)))


async def test_a_rate_limited_key_hands_the_call_to_the_next_and_cools_down(keyed_runtime, fresh_emulator):
    inject(fresh_emulator, "429:retry_after=30")
    answer, _ctx = await keyed_runtime.handle(messages_request())
    assert answer.status == 200  # one router attempt: the second key answered at once, no backoff
    answer, _ctx = await keyed_runtime.handle(messages_request())
    assert _keys_used(fresh_emulator) == ["key-one", "key-two", "key-two"]  # key-one cools down for its 30 s


async def test_every_key_refused_reaches_the_router_as_the_provider_answered(keyed_runtime, fresh_emulator):
    inject(fresh_emulator, "429:retry_after=30", count=2)
    with pytest.raises(UpstreamHTTPError) as error:
        await keyed_runtime.handle(messages_request())
    assert error.value.status == 429 and error.value.headers["retry-after"] == "30"
    assert _keys_used(fresh_emulator) == ["key-one", "key-two"]


async def test_server_errors_do_not_rotate_keys(keyed_runtime, fresh_emulator):
    inject(fresh_emulator, "500")
    with pytest.raises(UpstreamHTTPError):
        await keyed_runtime.handle(messages_request())
    assert _keys_used(fresh_emulator) == ["key-one"]  # a 500 is the provider's, not the key's: the router decides


def test_keys_from_a_list_of_environment_variables(monkeypatch):
    monkeypatch.setenv("KEY_A", "a")
    monkeypatch.delenv("KEY_UNSET", raising=False)
    config = ProviderConfig(kind="openai", api_key_env=["KEY_A", "KEY_UNSET"])
    assert config.resolve_api_keys() == ("a",)
    assert ProviderConfig(kind="openai", api_key="solo").resolve_api_keys() == ("solo",)


def test_key_ring_tries_cooled_keys_last_but_never_skips_them():
    from sdk.providers.keys import KeyRing

    ring = KeyRing(("a", "b", "c"))
    assert ring.order() == [0, 1, 2]
    ring.refused(0, 429, {"retry-after-ms": "60000"})
    ring.refused(1, 401, {})
    assert ring.order() == [2, 0, 1]  # ready first; then the 60 s cooldown before the 5 min one
    assert KeyRing(("solo",)).order() == [0]


def test_one_teams_refused_request_does_not_cool_a_key_for_the_others(tmp_path: Path, fresh_emulator, redis_url):  # noqa: F811
    """A 403 is about what the request asked for (OpenAI: "Project … does not have access to model
    …"), not the key: one team naming a model the account may not use cooled the key for five
    minutes on every replica and for every team sharing it, moving their calls to the next key.
    It still moves that call on, and cools the key for that team; the others go on with it."""
    import anthropic

    from gateway.testing import running_proxy

    for team in ("alpha", "beta"):
        _keyed_policy(tmp_path, team, f"sk-{team}-keys", fresh_emulator.url)
    inject(fresh_emulator, "403", model="claude-restricted")
    with running_proxy([tmp_path], state_url=redis_url) as proxy:
        def ask(team: str, model: str) -> None:
            client = anthropic.Anthropic(base_url=proxy.url, api_key=f"sk-{team}-keys", max_retries=0)
            client.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])

        ask("alpha", "claude-restricted")  # key-one refused it, key-two answered
        ask("beta", "claude-x")
        ask("alpha", "claude-x")
    assert _keys_used(fresh_emulator) == ["key-one", "key-two", "key-one", "key-two"]


def test_one_teams_oversized_request_does_not_cool_a_key_for_the_others(tmp_path: Path, redis_url):  # noqa: F811
    """A 429 that the request alone caused (OpenAI's "Request too large for … on tokens per min":
    more tokens than the key may take in a minute) says nothing about the key's load: cooled on the
    shared flag, one team's oversized request moved every team's calls, on every replica, off the
    key. It still moves that call to the next key (another project's key may take it), and cools
    nothing; the team is told to make the request smaller, not to retry."""
    import openai

    from emulator.app import EmulatorConfig
    from emulator.testing import running_emulator
    from gateway.testing import running_proxy

    with running_emulator(EmulatorConfig(openai_tpm_limits={"key-one": 2_000, "key-two": 50_000})) as emulator:
        for team in ("alpha", "beta"):
            (tmp_path / f"{team}.yaml").write_text(f"""team: {team}
api_keys: [{{value: "sk-{team}-keys"}}]
providers:
  keyed: {{kind: openai, base_url: "{emulator.openai_url}", api_key: [key-one, key-two]}}
routes:
  - match: {{model: "gpt-*"}}
    targets: [{{provider: keyed}}]
retry: {{max_attempts: 1}}
""")
        with running_proxy([tmp_path], state_url=redis_url) as proxy:
            def ask(team: str, text: str) -> None:
                client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=f"sk-{team}-keys", max_retries=0)
                client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=[{"role": "user", "content": text}])

            ask("alpha", "word " * 4_000)  # key-one: 429 Request too large; key-two answered
            ask("beta", "Hi")
            ask("alpha", "Hi")
            with pytest.raises(openai.RateLimitError) as refused:  # over both keys' limits
                ask("alpha", "word " * 80_000)
            assert not [flag for flag in proxy.app.state.registry.services.state().flags() if flag.startswith("key:")]
        used = [r["headers"]["authorization"].removeprefix("Bearer ") for r in emulator.state.recent if r["path"] == "/v1/chat/completions"]
        assert used == ["key-one", "key-two", "key-one", "key-one", "key-one", "key-two"]
    assert refused.value.code == "rate_limit_exceeded" and "retrying does not help" in refused.value.message


def test_one_teams_call_outside_a_keys_scopes_does_not_cool_it_for_the_others(tmp_path: Path, redis_url):  # noqa: F811
    """A restricted OpenAI key answers a call outside its scopes with a 401 ("You have insufficient
    permissions for this operation. Missing scopes: api.responses.write"): like a 403, it refuses
    what the request asked for (here the Responses API), not the key, yet it cooled the key for five
    minutes for every team and replica, as a wrong key does. It moves the call on and cools the key
    for that team only; the others go on with it."""
    import openai

    from emulator.app import EmulatorConfig
    from emulator.testing import running_emulator
    from gateway.testing import running_proxy

    with running_emulator(EmulatorConfig(openai_key_scopes={"key-one": ["model.request"]})) as emulator:
        for team in ("alpha", "beta"):
            (tmp_path / f"{team}.yaml").write_text(f"""team: {team}
api_keys: [{{value: "sk-{team}-keys"}}]
providers:
  keyed: {{kind: openai, base_url: "{emulator.openai_url}", api_key: [key-one, key-two], responses: native}}
routes:
  - match: {{model: "gpt-*"}}
    targets: [{{provider: keyed}}]
retry: {{max_attempts: 1}}
""")
        with running_proxy([tmp_path], state_url=redis_url) as proxy:
            def client(team: str) -> openai.OpenAI:
                return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=f"sk-{team}-keys", max_retries=0)

            client("alpha").responses.create(model="gpt-4o", input="Hi", max_output_tokens=16)  # key-one: 401 missing scope; key-two answered
            client("beta").chat.completions.create(model="gpt-4o", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
            assert not [flag for flag in proxy.app.state.registry.services.state().flags() if flag.startswith("key:")]
        used = [(r["path"], r["headers"]["authorization"].removeprefix("Bearer ")) for r in emulator.state.recent]
        assert used == [("/v1/responses", "key-one"), ("/v1/responses", "key-two"), ("/v1/chat/completions", "key-one")]
