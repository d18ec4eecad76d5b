"""`slipstream policy check` beyond validity: warnings for unset environment variables, "did you mean"
for misspelt keys, and messages in policy terms (no validator class names)."""

from __future__ import annotations

import pytest

from gateway.cli import main
from sdk.errors import PolicyError
from sdk.policy import load_policy
from tests.gateway.test_policy_cli import GOOD, _write
from tests.helpers import requires_extra


def _check(tmp_path, text: str, capsys) -> tuple[int, str, str]:
    code = main(["policy", "check", str(_write(tmp_path, "team.yaml", text))])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@requires_extra("semantic")
def test_unset_team_and_provider_keys_are_named(tmp_path, capsys, monkeypatch):
    for name in ("SEARCH_TEAM_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    code, out, _ = _check(tmp_path, GOOD.replace(', {value: "sk-team-literal-for-tests"}', ""), capsys)
    assert code == 0 and "(team search, 4 warnings)" in out
    assert "warning: api_keys.0: environment variable SEARCH_TEAM_KEY is not set" in out
    assert "no team key is set" in out and "will not be served" in out
    assert "warning: providers.claude.api_key_env: ANTHROPIC_API_KEY not set" in out
    assert "warning: providers.gpt.api_key_env: OPENAI_API_KEY not set" in out


@requires_extra("semantic")
def test_no_warning_once_the_variables_are_set(tmp_path, capsys, monkeypatch):
    for name in ("SEARCH_TEAM_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.setenv(name, "set")
    code, out, _ = _check(tmp_path, GOOD, capsys)
    assert code == 0 and "warning:" not in out and "(team search)" in out


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        ("honor_retry_after: true", "honour_retry_after: true", "retry.honour_retry_after: unknown key (did you mean 'honor_retry_after'?)"),
        ("breakpoints: auto", "breakpiont: auto", "prompt_cache.breakpiont: unknown key (did you mean 'breakpoints'?)"),
        ("kind: anthropic,", "knd: anthropic,", "providers.claude.knd: unknown key (did you mean 'kind'?)"),
    ],
)
def test_misspelt_key_gets_a_suggestion(tmp_path, good, bad, message):
    with pytest.raises(PolicyError) as error:
        load_policy(_write(tmp_path, "team.yaml", GOOD.replace(good, bad)))
    assert message in str(error.value)


def test_a_far_off_key_gets_no_guess(tmp_path):
    with pytest.raises(PolicyError) as error:
        load_policy(_write(tmp_path, "team.yaml", GOOD + "colour: blue\n"))
    assert "colour: unknown key (see policies/README.md" in str(error.value)


def test_misspelt_provider_in_a_route(tmp_path):
    with pytest.raises(PolicyError) as error:
        load_policy(_write(tmp_path, "team.yaml", GOOD.replace("{provider: claude}", "{provider: cluade}")))
    assert "unknown provider 'cluade' (did you mean 'claude'?)" in str(error.value)


def test_messages_use_policy_terms_not_class_names(tmp_path, capsys):
    text = GOOD.replace('{value: "sk-team-literal-for-tests"}', '"sk-a-bare-string"') + "semantic_cache: true\n"
    text = text.replace("semantic_cache: {enabled: false}\n", "")
    code, _, err = _check(tmp_path, text, capsys)
    assert code == 1
    assert "api_keys.1: expected a mapping (keys: env, value), got a string" in err
    assert "sk-a-bare-string" not in err  # a key written where a mapping belongs is still a key: never echoed
    assert "semantic_cache: expected a mapping (see policies/README.md for its keys), got true/false" in err
    assert "instance of" not in err and "SecretRef" not in err and "Policy" not in err


def test_an_unset_provider_key_where_no_target_follows_is_said_to_be_a_502(monkeypatch):
    """policies/default.yaml without provider keys: claude and gpt are each a route's only target, so
    their requests are a 502, not "go to the next target" as the warning said alone."""
    from pathlib import Path

    from sdk.policy_advice import warnings

    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    found = warnings(load_policy(Path(__file__).resolve().parents[2] / "policies" / "default.yaml"))
    claude = next(line for line in found if line.startswith("providers.claude.api_key_env"))
    assert "where it is the last target (routes 2), they are refused with a 502 that names the variable" in claude
    gpt = next(line for line in found if line.startswith("providers.gpt.api_key_env"))
    assert "(routes 3, 4, 5)" in gpt
