"""Without Redis, who owns a file or a batch is kept on disk (sdk/state/ownership.py:SQLiteRecords):
a restarted proxy and every worker of `--workers N --local-state` know the objects a team created.
Kept in process memory, a restart forgot them all (a team's own 24-hour batch answered 404) and
each worker knew only its own."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import openai

from gateway.testing import free_port
from tests.gateway.test_cli import ROOT, _command, _wait
from tests.helpers import write_policy


@contextmanager
def _serving(policies: Path, data: Path, *options: str) -> Iterator[Callable[[], openai.OpenAI]]:
    port = free_port()
    process = subprocess.Popen([*_command(), "serve", "--policy-dir", str(policies), "--port", str(port), *options],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "SLIPSTREAM_DATA_DIR": str(data), "SLIPSTREAM_STATE_URL": ""})
    try:
        _wait(f"http://127.0.0.1:{port}/healthz", process)
        # A client, and so a connection, for every request: under --workers the kernel spreads them over the workers.
        yield lambda: openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-t", max_retries=0)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def _created(client: Callable[[], openai.OpenAI]) -> tuple[str, str]:
    """A file and a batch of it, created by the team through the proxy."""
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-4o-mini", "messages": []}}'
    with client() as one:
        uploaded = one.files.create(file=("input.jsonl", line), purpose="batch")
    with client() as one:
        batch = one.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    return uploaded.id, batch.id


def _known(client: Callable[[], openai.OpenAI], file_id: str, batch_id: str) -> None:
    with client() as one:
        assert one.files.retrieve(file_id).id == file_id
    with client() as one:
        assert one.batches.retrieve(batch_id).id == batch_id


def test_a_restarted_proxy_still_knows_the_teams_files_and_batches(tmp_path, fresh_emulator):
    policies, data = tmp_path / "policies", tmp_path / "data"
    policies.mkdir()
    write_policy(policies, "t", "sk-t", fresh_emulator.url)
    with _serving(policies, data) as client:
        file_id, batch_id = _created(client)
    with _serving(policies, data) as client:
        _known(client, file_id, batch_id)


def test_every_worker_knows_what_another_worker_created(tmp_path, fresh_emulator):
    policies, data = tmp_path / "policies", tmp_path / "data"
    policies.mkdir()
    write_policy(policies, "t", "sk-t", fresh_emulator.url)
    with _serving(policies, data, "--workers", "2", "--local-state") as client:
        created = [_created(client) for _ in range(3)]
        for file_id, batch_id in created * 2:
            _known(client, file_id, batch_id)
