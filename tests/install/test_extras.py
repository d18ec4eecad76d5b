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
from sdk.policy import load_policy
from tests.helpers import write_policy

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "sentence_transformers", "faiss", "transformers", "triton", "redis", "opentelemetry.sdk", "scipy", "sklearn")


def test_the_drop_in_and_the_proxy_import_no_heavy_module(tmp_path):
    """`import sdk`, `from sdk import OpenAI`, the proxy app, and building a team whose policy uses
    neither the semantic cache nor the local engine leave torch, faiss & co. unimported."""
    policy = write_policy(tmp_path, "light", "sk-light", "http://127.0.0.1:9", extra="compression: {enabled: true}\n")
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


def test_a_missing_extra_is_named_at_policy_load(tmp_path, without):
    path = tmp_path / "heavy.yaml"
    path.write_text(LOCAL_AND_CACHE)
    assert load_policy(path).team == "heavy"  # everything installed: loads
    without("torch", "faiss")
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    message = str(error.value)
    assert f"{path}: providers.local: the in-process local engine (model 'demo') needs the [engine] extra" in message
    assert "pip install 'slipstream[engine]'" in message
    assert f"{path}: semantic_cache: the response cache" in message and "pip install 'slipstream[semantic]'" in message
    assert "torch, faiss not installed" in message


def test_policy_check_reports_the_missing_extra(tmp_path, without, capsys):
    path = tmp_path / "heavy.yaml"
    path.write_text(LOCAL_AND_CACHE)
    without("transformers")
    assert main(["policy", "check", str(path)]) == 1
    assert "needs the [engine] extra (transformers not installed)" in capsys.readouterr().err


def test_a_local_engine_over_http_needs_no_extra(tmp_path, without):
    path = tmp_path / "remote.yaml"
    path.write_text(LOCAL_AND_CACHE.replace("model: demo}", 'model: demo, base_url: "http://127.0.0.1:8000/v1"}')
                    .replace("semantic_cache: {enabled: true}", ""))
    without("torch", "transformers")
    assert load_policy(path).providers["local"].base_url
