"""The CLI as a new user meets it: help with no arguments, --version, defaults in --help, a busy port
refused before "serving teams", a warning for a fixed key on a public address, quiet library logs."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import httpx

from gateway.serving import fixed_key_warnings, port_problem
from gateway.testing import running_proxy
from sdk.policy import load_policy
from tests.gateway.test_cli import ROOT, _command
from tests.helpers import requires_extra


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_command(), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_no_arguments_prints_help():
    result = _run()
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("usage: slipstream") and "serve" in result.stdout and "policy" in result.stdout


def test_version():
    result = _run("--version")
    assert result.returncode == 0 and result.stdout.startswith("slipstream ")


def test_help_shows_defaults():
    out = _run("serve", "--help").stdout
    assert "(default: 127.0.0.1)" in out and "(default: 8080)" in out
    assert "(default: None)" not in out
    assert "(default: 8081)" in _run("emulate", "--help").stdout


@requires_extra("engine")  # the default policy serves the demo model
def test_a_busy_port_fails_before_serving():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert port_problem("127.0.0.1", port) is not None
        result = _run("serve", "--port", str(port))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "serving teams" not in result.stdout


def test_fixed_key_on_a_public_address_is_warned_about():
    served = [load_policy(ROOT / "policies" / "default.yaml")]
    assert fixed_key_warnings("127.0.0.1", served) == [] and fixed_key_warnings("localhost", served) == []
    [warning] = fixed_key_warnings("0.0.0.0", served)
    assert "listening on 0.0.0.0" in warning and "team 'default' accepts a fixed key" in warning


@requires_extra("semantic")  # faiss
def test_library_info_lines_stay_out_of_the_terminal():
    """faiss logs its loader at INFO on import and httpx each request: neither reaches the terminal."""
    script = textwrap.dedent("""
        import logging
        from gateway.cli import configure_logging
        configure_logging()
        import faiss, httpx
        logging.getLogger("slipstream.readiness").info("shown")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "faiss" not in result.stderr and "INFO slipstream.readiness: shown" in result.stderr


def test_cache_report_prints_the_report_only(tmp_path):
    from tests.helpers import write_policy

    write_policy(tmp_path, "rep", "sk-rep", "http://127.0.0.1:9")
    with running_proxy([tmp_path]) as proxy:
        assert httpx.get(f"{proxy.url}/readyz").status_code == 200
        result = _run("cache", "report", "--url", proxy.url, "--key", "sk-rep")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and "HTTP Request" not in result.stdout


def test_output_piped_into_a_reader_that_leaves_is_no_traceback():
    """`slipstream policy check policies/ | head -2`: the reader closes the pipe after two lines; the
    command stops writing without a BrokenPipeError traceback."""
    with subprocess.Popen([*_command(), "policy", "check", "policies/"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before anything is written (the command is still importing): writes fail with EPIPE
        err = proc.stderr.read()
        proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
