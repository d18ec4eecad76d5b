"""The access log: off by default; with `json` or `text`, one line per request through the proxy,
carrying ids, counts and times but never the team key or prompt text."""

from __future__ import annotations

import io
import shlex
import sys
import threading
import time

import openai
import orjson
import pytest

from sdk.observability import access_log
from tests.gateway.conftest import TEAM_KEY
from tests.helpers import PATIENCE_S


@pytest.fixture
def access(capsys):
    yield capsys
    access_log.configure("off")


def lines(capsys) -> list[str]:
    access_log.flush()  # lines are written by the access log's thread
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_json_lines_for_answers_streams_and_errors(proxy, access):
    access_log.configure("json")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=TEAM_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-5-mini", messages=[{"role": "user", "content": "secret prompt text"}])
    stream = client.chat.completions.create(model="gpt-5-mini", stream=True,
                                            messages=[{"role": "user", "content": "hello"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    records = [orjson.loads(line) for line in lines(access)]
    assert [r["status"] for r in records] == [200, 200, 404]
    first = records[0]
    assert first["request_id"] == raw.headers["x-slipstream-request-id"]
    assert first["team"] == "alpha" and first["route"].startswith("gpt/") and first["cache"] == "miss"
    assert first["attempts"] == 1 and first["input_tokens"] > 0 and first["output_tokens"] > 0
    assert first["ttft_ms"] is None or first["ttft_ms"] <= first["total_ms"]
    assert records[1]["ttft_ms"] is not None and records[2]["route"] == ""
    text = "\n".join(map(str, records))
    assert TEAM_KEY not in text and "secret prompt text" not in text


def test_text_lines_and_off_by_default(proxy, access):
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=TEAM_KEY, max_retries=0)
    access_log.configure("off")
    client.chat.completions.create(model="gpt-5-mini", messages=[{"role": "user", "content": "hi"}])
    assert lines(access) == []
    access_log.configure("text")
    client.chat.completions.create(model="gpt-5-mini", messages=[{"role": "user", "content": "hi"}])
    (line,) = lines(access)
    assert " team=alpha " in line and " status=200 " in line and " attempts=1" in line


def test_a_model_name_cannot_write_fields_into_a_text_line(proxy, access):
    """A value with spaces was put in quotes with its own quotes left as they were, so a team's model
    name could close the quotes and write fields of its own after them: a logfmt reader took the line
    for another team's request (the later `team=`) with the tokens the client chose. Quotes and
    backslashes in a value are escaped now."""
    access_log.configure("text")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=TEAM_KEY, max_retries=0)
    forged = 'gpt-x" team=beta input_tokens=999999 x="'
    client.chat.completions.create(model=forged, messages=[{"role": "user", "content": "hi"}])  # a wildcard route
    (line,) = lines(access)
    fields = dict(token.split("=", 1) for token in shlex.split(line)[1:])  # shlex reads logfmt's quoting
    teams = [token for token in shlex.split(line) if token.startswith("team=")]
    assert teams == ["team=alpha"]  # before: team=alpha, then team=beta
    assert fields["model"] == forged and fields["input_tokens"] != "999999"
    # The pass-through did not hold a model name to printable characters: a line break wrote a line of its
    # own. Escaped since; and since the pass-through checks names as the pipeline does, refused (400).
    forged_line = "gpt-x\n2026-01-01T00:00:00 request_id=0 team=beta endpoint=chat_completions status=200"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=forged_line, prompt="hi", max_tokens=1)
    (line,) = lines(access)  # before: two lines, the second team beta's
    assert dict(token.split("=", 1) for token in shlex.split(line)[1:])["status"] == "400" and "team=beta" not in line


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="text, json"):
        access_log.configure("yaml")


def _stalled_stderr(monkeypatch) -> tuple[threading.Event, threading.Event, list[str]]:
    """A standard error whose writes block (a pipe to a log shipper that stopped reading) until `release`
    is set: (entered: a write began, release, what was written)."""
    entered, release, written = threading.Event(), threading.Event(), []

    class Stalled(io.StringIO):
        def write(self, text: str) -> int:
            entered.set()
            release.wait(30)
            written.append(text)
            return len(text)

    monkeypatch.setattr(sys, "stderr", Stalled())
    return entered, release, written


def test_a_stalled_standard_error_does_not_hold_the_request_that_logs(monkeypatch):
    # A pipe to a log shipper that stops reading: the write blocks. It must block the logging thread,
    # not the event loop that ends the request.
    entered, release, written = _stalled_stderr(monkeypatch)
    access_log.configure("json")
    try:
        access_log.log.info({"request_id": "first"})
        access_log.log.info({"request_id": "second"})  # returns although the first line's write is stuck
        assert entered.wait(10)
        assert written == []
        release.set()
        access_log.flush()
        assert [orjson.loads(line)["request_id"] for line in "".join(written).splitlines()] == ["first", "second"]
    finally:
        release.set()
        access_log.configure("off")


def test_a_forked_child_writes_its_own_lines(tmp_path):
    # The writing thread does not survive fork(): the child must start its own, not queue lines forever.
    import os

    out = tmp_path / "child.err"
    access_log.configure("json")
    try:
        pid = os.fork()
        if pid == 0:  # the child: its standard error to a file, one line, flushed, then out
            try:
                fd = os.open(out, os.O_WRONLY | os.O_CREAT)
                os.dup2(fd, 2)
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (the child exits right after)
                os.environ[access_log.ENV] = "json"
                access_log.log.info({"request_id": "from-child"})  # no handler: the child's logger was reset
                access_log.record_passthrough("t", "k", "from-child", "passthrough:files", "m", "r", 200, None, 0.0)
                access_log.flush()
                sys.stderr.flush()
            finally:
                os._exit(0)
        deadline = time.monotonic() + PATIENCE_S
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the child's line never left its queue (its flush() waited for a thread it does not have)")
            time.sleep(0.05)
    finally:
        access_log.configure("off")
    lines = [orjson.loads(line) for line in out.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == ["from-child"]


def test_one_teams_lines_do_not_fill_the_memory_or_take_another_teams_place(monkeypatch):
    """Lines wait for the writing thread in a queue, and a standard error nobody drains (a stalled log
    shipper) kept them all: every team's lines grew the process they share until it ran out of memory.
    The queue is bounded now (here 10), and past the bound a team holding less than its share still
    gets its line in: team b's one line is written, team a's beyond its places dropped and counted."""
    from sdk.observability.metrics import ACCESS_LOG_DROPPED

    entered, release, written = _stalled_stderr(monkeypatch)
    monkeypatch.setattr(access_log, "MAX_QUEUED", 10)
    access_log.configure("json")
    dropped_before = ACCESS_LOG_DROPPED.labels("a")._value.get()
    try:
        access_log.record_passthrough("a", "k", "a-0", "passthrough:files", "m", "r", 200, None, 0.0)
        assert entered.wait(10)  # the writer holds team a's first line, stuck in the write
        for i in range(1, 40):
            access_log.record_passthrough("a", "k", f"a-{i}", "passthrough:files", "m", "r", 200, None, 0.0)
        access_log.record_passthrough("b", "k", "b-0", "passthrough:files", "m", "r", 200, None, 0.0)
        release.set()
        access_log.flush()
    finally:
        release.set()
        access_log.configure("off")
    teams = [orjson.loads(line)["team"] for line in "".join(written).splitlines()]
    assert teams.count("b") == 1
    assert teams.count("a") == 11  # the one being written and the ten places (40 before)
    assert ACCESS_LOG_DROPPED.labels("a")._value.get() - dropped_before == 29
