"""Policy validation errors name the file, the key and what was expected; `slipstream policy check`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.cli import main
from sdk.errors import PolicyError
from sdk.policy import load_policies
from tests.helpers import requires_extra

GOOD = """
team: search
api_keys: [{env: SEARCH_TEAM_KEY}, {value: "sk-team-literal-for-tests"}]
providers:
  claude: {kind: anthropic, base_url: "https://api.anthropic.com", api_key_env: ANTHROPIC_API_KEY}
  gpt:    {kind: openai,    base_url: "https://api.openai.com/v1", api_key_env: OPENAI_API_KEY}
  local:  {kind: local, model: demo}
routes:
  - match: {model: "claude-*"}
    targets: [{provider: claude}, {provider: gpt, model: gpt-5-mini}]
retry: {max_attempts: 3, base_delay_ms: 250, max_delay_ms: 8000, honor_retry_after: true}
prompt_cache: {enabled: true, reorder: true, breakpoints: auto, ttl: 5m}
semantic_cache: {enabled: false}
compression: {enabled: false}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, "team.yaml", text)
    with pytest.raises(PolicyError) as error:
        load_policies([path])
    return str(error.value)


def test_design_example_is_valid(tmp_path):
    policies = load_policies([_write(tmp_path, "search.yaml", GOOD)])
    assert [p.team for p in policies.values()] == ["search"]


def test_unknown_key_names_file_and_key(tmp_path):
    message = _error(tmp_path, GOOD + "retyr: {max_attempts: 2}\n")
    assert "team.yaml: retyr: unknown key" in message


def test_nested_unknown_key(tmp_path):
    message = _error(tmp_path, GOOD.replace("max_attempts: 3", "max_attempt: 3"))
    assert "retry.max_attempt: unknown key" in message


def test_wrong_type_says_what_was_expected(tmp_path):
    message = _error(tmp_path, GOOD.replace("max_attempts: 3", "max_attempts: lots"))
    assert "retry.max_attempts:" in message and "integer" in message and "(got a string)" in message
    assert "lots" not in message  # values never appear in policy errors: some of them are keys


def test_wrong_enum_value(tmp_path):
    message = _error(tmp_path, GOOD.replace("kind: openai", "kind: opneai"))
    assert "providers.gpt.kind:" in message and "'anthropic', 'openai' or 'local'" in message


def test_route_to_unknown_provider(tmp_path):
    message = _error(tmp_path, GOOD.replace("{provider: claude}", "{provider: cluade}"))
    assert "routes.0.targets.0.provider: unknown provider 'cluade'" in message


def test_not_yaml(tmp_path):
    assert "not valid YAML" in _error(tmp_path, "team: [unclosed\n")


def test_duplicate_team_and_shared_key_across_files(tmp_path):
    _write(tmp_path, "a.yaml", GOOD)
    _write(tmp_path, "b.yaml", GOOD)
    with pytest.raises(PolicyError) as error:
        load_policies([tmp_path])
    assert "team: 'search' is already defined" in str(error.value)
    assert "a key is also used by" in str(error.value)


@requires_extra("semantic")
def test_policy_check_command(tmp_path, capsys):
    good = _write(tmp_path, "search.yaml", GOOD)
    assert main(["policy", "check", str(good)]) == 0
    assert "ok" in capsys.readouterr().out
    bad = _write(tmp_path, "bad.yaml", GOOD + "extra: 1\n")
    assert main(["policy", "check", str(bad)]) == 1
    assert "bad.yaml: extra: unknown key" in capsys.readouterr().err


@requires_extra("semantic", "engine")  # the bundled policies use both
def test_bundled_policies_are_valid():
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "policy", "check", str(root / "policies")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


SECRETS = """
team: leaky
api_keys: [{value: "sk-team-SECRET-1111"}]
providers:
  claude: {base_url: "https://api.anthropic.com", api_key: "sk-provider-SECRET-2222"}
routes:
  - targets: [{provider: claude}]
"""


def test_errors_name_key_paths_never_values(tmp_path, capsys):
    """A provider missing its required `kind` printed the whole mapping, inline keys included."""
    bad = _write(tmp_path, "leaky.yaml", SECRETS)
    assert main(["policy", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "providers.claude.kind: Field required" in err
    assert "SECRET" not in err


def test_yaml_errors_do_not_quote_the_file(tmp_path, capsys):
    bad = _write(tmp_path, "broken.yaml", 'team: x\napi_keys: [{value: "sk-SECRET-3333}]\n')
    assert main(["policy", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "broken.yaml: not valid YAML at line" in err
    assert "SECRET" not in err


def test_non_utf8_policy_is_a_policy_error(tmp_path, capsys):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    assert main(["policy", "check", str(bad)]) == 1  # was: a UnicodeDecodeError traceback
    assert "latin1.yaml: not UTF-8 text" in capsys.readouterr().err
