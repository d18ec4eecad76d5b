"""Without Redis, what must outlive the process is kept on disk under the data directory: who owns a
file or a batch (sdk/state/ownership.py:SQLiteRecords), and spend (sdk/state/spend_file.py). Kept
in process memory, a restart forgot them (a team's own 24-hour batch answered 404; every team's
month was back at $0), and each worker of `--workers N --local-state` knew only its own objects."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from sdk.state.backend import Settlement, SpendRecord
from sdk.state.local import LocalState
from sdk.state.spend_file import SpendFile
from tests.gateway.test_cli import serving
from tests.helpers import wait_until, write_policy

ADMIN = "persistence-admin-key"  # opens /ui/data, which names the worker that answered (its pid)


@contextmanager
def _serving(policies: Path, data: Path, *options: str) -> Iterator[Callable[[], openai.OpenAI]]:
    """The proxy on `data` as its data directory, and a new client (so a new connection: under
    --workers the kernel spreads them over the workers) for each request."""
    with serving(policies, *options, env={"SLIPSTREAM_DATA_DIR": str(data), "SLIPSTREAM_STATE_URL": "",
                                          "SLIPSTREAM_ADMIN_KEY": ADMIN}) as url:
        yield lambda: openai.OpenAI(base_url=f"{url}/v1", api_key="sk-t", max_retries=0)


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


def _budgeted_batches(tmp_path: Path, upstream: str, max_tokens: int) -> tuple[Path, Path, bytes]:
    """Policies giving team t a $1 monthly budget and gpt-* at $1,000 / $2,000 per million tokens, the
    data directory, and a batch input line asking for up to `max_tokens` output tokens."""
    policies, data = tmp_path / "policies", tmp_path / "data"
    policies.mkdir()
    write_policy(policies, "t", "sk-t", upstream,
                 extra='pricing: {"gpt-*": {input: 1000, output: 2000}}\nbudget: {usd: 1, period: month}\n')
    line = (b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-4o-mini", '
            b'"max_tokens": %d, "messages": [{"role": "user", "content": "hello"}]}}\n' % max_tokens)
    return policies, data, line


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


def test_a_restart_does_not_give_a_team_its_spent_budget_again(tmp_path, fresh_emulator):
    """Without Redis, spend lived in process memory: a restarted proxy had every team's month at $0."""
    policies, data = tmp_path / "policies", tmp_path / "data"
    policies.mkdir()
    write_policy(policies, "t", "sk-t", fresh_emulator.url,
                 extra='pricing: {"gpt-*": {input: 100000, output: 100000}}\nbudget: {usd: 0.01, period: month}\n')
    ask = {"model": "gpt-4o-mini", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with _serving(policies, data) as client:
        with client() as one:
            one.chat.completions.create(**ask)  # admitted at $0, charged well past the budget
        with client() as one, pytest.raises(openai.RateLimitError, match="budget"):
            one.chat.completions.create(**ask)
    with _serving(policies, data) as client, client() as one, pytest.raises(openai.RateLimitError, match="budget"):
        one.chat.completions.create(**ask)


def test_every_worker_holds_a_team_to_the_budget_another_worker_charged(tmp_path, fresh_emulator):
    """Each worker read the spend file once, at start: a charge through one worker was never seen by
    the other, which admitted the team again (its budget once per worker) and reported its own spend."""
    policies, data = tmp_path / "policies", tmp_path / "data"
    policies.mkdir()
    write_policy(policies, "t", "sk-t", fresh_emulator.url,
                 extra='pricing: {"gpt-*": {input: 100000, output: 100000}}\nbudget: {usd: 0.01, period: month}\n')
    ask = {"model": "gpt-4o-mini", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with _serving(policies, data, "--workers", "2", "--local-state") as client:
        with client() as one:
            one.chat.completions.create(**ask)  # admitted at $0, charged well past the budget
            spend_url = f"{one.base_url}slipstream/spend"

        def spent() -> tuple[int, float]:
            """(the worker taking a fresh connection, the month's spend it reports), both on that connection."""
            with httpx.Client(timeout=30) as connection:
                pid = connection.get(spend_url.replace("/v1/slipstream/spend", "/ui/data"),
                                     headers={"authorization": f"Bearer {ADMIN}"}).json()["pid"]
                report = connection.get(spend_url, headers={"authorization": "Bearer sk-t"}).json()
            return pid, float(report["month"]["total"])

        reports: dict[int, float] = {}
        deadline = time.monotonic() + 60  # each worker reads the file back within about a second
        while len(reports) < 2 or min(reports.values()) <= 0.01:  # until both workers report the charge
            assert time.monotonic() < deadline, f"the workers report {reports}"
            pid, total = spent()
            reports[pid] = total
        assert len(set(reports.values())) == 1
        for _ in range(8):
            with client() as one, pytest.raises(openai.RateLimitError, match="budget"):
                one.chat.completions.create(**ask)


def test_the_spend_file_holds_the_sum_of_every_writer(tmp_path):
    path, month = tmp_path / "spend.sqlite3", time.time() + 3600
    first, second = SpendFile(path), SpendFile(path)  # two workers of one host
    for _ in range(50):
        first.add("spend:t:month", month, ("total", "model:m"), 0.01)
        second.add("spend:t:month", month, ("total",), 0.02)
    second.add("spend:t:gone", time.time() - 1, ("total",), 5.0)  # expired by the time it is read
    first.close()
    second.close()
    (expires, fields), = SpendFile(path).load(time.time()).values()
    assert expires == month and fields == pytest.approx({"total": 1.5, "model:m": 0.5})


async def test_a_local_state_starts_from_the_spend_its_file_holds(tmp_path):
    record = SpendRecord(usd=0.25, records=(("spend:t:day", 3600.0),), fields=("total",))
    state = LocalState(spend_file=SpendFile(tmp_path / "spend.sqlite3"))
    state.settle(Settlement(lease="a", spend=record))
    state.settle(Settlement(lease="b", spend=record))
    await state.close()
    restarted = LocalState(spend_file=SpendFile(tmp_path / "spend.sqlite3"))
    assert await restarted.spend("spend:t:day") == pytest.approx({"total": 0.5})
    await restarted.close()


def test_a_batchs_results_are_charged_once_whichever_worker_reads_them_and_after_a_restart(tmp_path, fresh_emulator):
    """The first complete read of a batch's results is charged, and takes back the worst cost the
    batch was charged when created, once: the claim that said so was kept in each process's memory,
    so every worker of `--workers N --local-state`, and the proxy again after a restart, charged the
    results anew, and each worker that read them before the spend file carried the first take-back
    took the worst cost back again (a team's spend could go below what it had spent before the batch)."""
    policies, data, line = _budgeted_batches(tmp_path, fresh_emulator.url, max_tokens=400)
    with _serving(policies, data, "--workers", "2", "--local-state") as client:
        with client() as one:
            uploaded = one.files.create(file=("input.jsonl", line), purpose="batch")
            batch = one.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
            done = wait_until(lambda: (b := one.batches.retrieve(batch.id)).status == "completed" and b, "the batch completes")
            base = str(one.base_url).removesuffix("/v1/")
        assert done.output_file_id is not None

        def read_on(worker: int | None, base: str = base) -> tuple[int, float]:
            """Read the results on a fresh connection (on `worker`'s, if given and it took it); then
            (that worker, the month's spend it reports on the same connection)."""
            with httpx.Client(base_url=base, timeout=30) as connection:
                pid = connection.get("/ui/data", headers={"authorization": f"Bearer {ADMIN}"}).json()["pid"]
                if worker is None or pid == worker:
                    connection.get(f"/v1/files/{done.output_file_id}/content", headers={"authorization": "Bearer sk-t"}).read()
                report = connection.get("/v1/slipstream/spend", headers={"authorization": "Bearer sk-t"}).json()
            return pid, float(report["month"]["total"])

        first, _ = read_on(None)
        deadline = time.monotonic() + 60
        reports: dict[int, float] = {}
        while len(reports) < 2 or len(set(reports.values())) > 1:  # the first read's charge and take-back, on both workers
            assert time.monotonic() < deadline, f"the workers report {reports}"
            pid, total = read_on(-1)
            reports[pid] = total
        charged = reports[first]
        assert 0 < charged < 0.2  # the results' cost, not the batch's worst (0.4 output tokens' worth at most)
        other = next(pid for pid in reports if pid != first)
        while True:  # now read on the other worker
            assert time.monotonic() < deadline, "no connection reached the other worker"
            pid, total = read_on(other)
            if pid == other:
                break
        assert total == pytest.approx(charged)
        reports = {}
        while len(reports) < 2 or len(set(reports.values())) > 1:
            assert time.monotonic() < deadline, f"the workers report {reports}"
            pid, total = read_on(-1)
            reports[pid] = total
        assert all(total == pytest.approx(charged) for total in reports.values())
    with _serving(policies, data) as client, client() as one:  # a restarted proxy: read again, not charged again
        _, total = read_on(None, str(one.base_url).removesuffix("/v1/"))
        assert total == pytest.approx(charged)


def test_batches_created_on_two_workers_at_once_cannot_each_fit_the_same_remainder(tmp_path, fresh_emulator):
    """A batch's worst cost was checked and held in the memory of the worker creating it: with
    `--workers N --local-state` another worker, which sees no hold of the first and its charge only once
    the spend file carries it, admitted a second batch against the same remainder of the budget while the
    first was being created (two batches worth $0.60 each on a $1 budget). The check and the hold are one
    transaction of the spend file now: the second worker refuses it with the budget's 429."""
    # up to 600 output tokens at $2,000 per million, at batch rates: a worst cost of about $0.60
    policies, data, line = _budgeted_batches(tmp_path, fresh_emulator.url, max_tokens=600)
    team = {"authorization": "Bearer sk-t"}
    with _serving(policies, data, "--workers", "2", "--local-state") as client, ExitStack() as stack:
        with client() as one:
            uploaded = one.files.create(file=("input.jsonl", line), purpose="batch")
            base = str(one.base_url).removesuffix("/v1/")
        workers: dict[int, httpx.Client] = {}  # one kept connection on each worker
        deadline = time.monotonic() + 60
        while len(workers) < 2:
            assert time.monotonic() < deadline, "no connection reached the second worker"
            connection = stack.enter_context(httpx.Client(base_url=base, timeout=60))
            workers.setdefault(connection.get("/ui/data", headers={"authorization": f"Bearer {ADMIN}"}).json()["pid"], connection)
        first, second = workers.values()
        create = {"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        fresh_emulator.inject_fault("stall:ms=5000", path="/v1/batches")  # the first creation is still running upstream
        with ThreadPoolExecutor(1) as pool:
            created = pool.submit(first.post, "/v1/batches", json=create, headers=team)
            wait_until(lambda: any(r["method"] == "POST" and r["path"] == "/v1/batches" for r in fresh_emulator.app.state.recent),
                       "the first creation reaches the provider")
            refused = second.post("/v1/batches", json=create, headers=team)
            assert created.result().status_code == 200
        assert refused.status_code == 429 and "batch at batch rates may cost up to" in refused.json()["error"]["message"]
        assert sum(r["method"] == "POST" and r["path"] == "/v1/batches" for r in fresh_emulator.app.state.recent) == 1
        # the hold became the creation charge: neither worker admits another batch
        for connection in (first, second):
            assert connection.post("/v1/batches", json=create, headers=team).status_code == 429
