"""The install is sized to the job: heavy modules load only when a policy uses them, and a policy that
uses a feature whose extra is missing is refused at load time, naming the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.cli import main
from sdk.errors import PolicyError
from sdk.extras import missing_extras
from sdk.policy import load_policy
from sdk.runtime import TeamRegistry, TeamRuntime
from tests.helpers import requires_extra, write_policy

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "sentence_transformers", "faiss", "transformers", "triton", "redis", "opentelemetry.sdk", "scipy", "sklearn")


def test_the_drop_in_and_the_proxy_import_no_heavy_module(tmp_path):
    """`import sdk`, `from sdk import OpenAI`, the proxy app, and building a team whose policy uses
    neither the semantic cache nor the local engine leave torch, faiss & co. unimported."""
    policy = write_policy(tmp_path, "light", "sk-light", "http://127.0.0.1:9", extra="prompt_cache: {enabled: true, reorder: true}\n")
    script = textwrap.dedent(f"""
        import sys
        import sdk
        from sdk import OpenAI
        from gateway.app import create_app
        client = OpenAI(policy={str(policy)!r})
        app = create_app([{str(policy)!r}], watch_interval_s=None)
        print(" ".join(name for name in {HEAVY!r} if name in sys.modules))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_from_sdk_import_openai_does_not_load_anthropic():
    script = "import sys\nfrom sdk import OpenAI\nprint('anthropic' in sys.modules, 'openai' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["False", "False"], result.stderr


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


LOCAL_AND_CACHE = """
team: heavy
api_keys: [{value: "sk-heavy"}]
providers:
  local: {kind: local, model: demo}
routes: [{targets: [{provider: local}]}]
semantic_cache: {enabled: true}
"""


@pytest.fixture
def without(monkeypatch):
    """Make modules unimportable, as on an install without their extra (`sys.modules[name] = None`
    is how Python marks a module as not importable; `find_spec` then reports it missing)."""

    def hide(*names: str) -> None:
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)

    return hide


@requires_extra("engine", "semantic")  # it hides one module of each itself
def test_a_missing_extra_is_named_when_the_team_is_built(tmp_path, without):
    policy = load_policy(_write(tmp_path, "heavy.yaml", LOCAL_AND_CACHE))
    without("torch", "faiss")
    with pytest.raises(PolicyError) as error:
        TeamRuntime.build(policy)
    message = str(error.value)
    assert "team heavy: providers.local: the in-process local engine (model 'demo') needs the [engine] extra" in message
    assert "pip install 'slipstream[engine]'" in message
    assert "team heavy: semantic_cache: the response cache" in message and "pip install 'slipstream[semantic]'" in message
    assert "torch, faiss not installed" in message


def test_a_team_no_key_reaches_needs_nothing_installed(tmp_path, without, monkeypatch):
    """`slipstream serve` reads every policy in the folder; one that is not served costs nothing."""
    monkeypatch.delenv("HEAVY_TEAM_KEY", raising=False)
    _write(tmp_path, "heavy.yaml", LOCAL_AND_CACHE.replace('{value: "sk-heavy"}', "{env: HEAVY_TEAM_KEY}"))
    write_policy(tmp_path, "light", "sk-light", "http://127.0.0.1:9")
    without("torch", "faiss", "transformers")
    assert sorted(TeamRegistry([tmp_path]).teams) == ["light"]


@requires_extra("engine", "semantic")  # it hides one module of each itself
def test_policy_check_reports_the_missing_extra(tmp_path, without, capsys):
    path = _write(tmp_path, "heavy.yaml", LOCAL_AND_CACHE)
    without("transformers")
    assert main(["policy", "check", str(path)]) == 1
    assert "needs the [engine] extra (transformers not installed)" in capsys.readouterr().err


def test_a_local_engine_over_http_needs_no_extra(tmp_path, without):
    remote = LOCAL_AND_CACHE.replace("model: demo}", 'model: demo, base_url: "http://127.0.0.1:8000/v1"}')
    policy = load_policy(_write(tmp_path, "remote.yaml", remote.replace("semantic_cache: {enabled: true}", "")))
    without("torch", "transformers")
    assert missing_extras(policy) == []
