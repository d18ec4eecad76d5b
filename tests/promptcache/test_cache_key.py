"""Provider prompt caches with one organisation key shared by two teams (issue 25, item 6).

- The gateway's own `prompt_cache_key` is a keyed digest: it names no team and another team that
  sends it as its own key does not land on the first team's cache entries.
- A client's own `prompt_cache_key` is namespaced to its team.
- Without `isolate`, an identical long Anthropic prompt reads another team's cache (the documented
  oracle); with `prompt_cache: {isolate: true}` it does not.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import RunningEmulator, running_emulator
from gateway.testing import running_proxy
from sdk.promptcache import keys
from tests.helpers import requires_extra, wait_until, write_policy

SHARED_KEY = "org-key-shared-by-every-team"
ALPHA, BETA = "sk-team-alpha-pc", "sk-team-beta-pc"
SYSTEM = "You are the support assistant of ACME. " + " ".join(f"Policy {i}: answer from the manual, section {i}." for i in range(300))
QUESTION = [{"role": "user", "content": "How do I reset the pump controller?"}]


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with running_emulator(EmulatorConfig(api_keys=frozenset({SHARED_KEY}))) as running:
        yield running


def _teams(directory: Path, emu: RunningEmulator, extra: str = "") -> Path:
    for team, key in (("alpha", ALPHA), ("beta", BETA)):
        write_policy(directory, team, key, emu.url, extra="retry: {max_attempts: 1}\n" + extra, upstream_key=SHARED_KEY)
    return directory


def _sent_key(emu: RunningEmulator) -> str:
    return json.loads(emu.state.recent[-1]["body"])["prompt_cache_key"]


def test_keys_are_keyed_digests_namespaced_by_team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_secret", b"one secret")
    ours = keys.gateway_key("alpha", "abcd")
    assert ours.startswith("slipstream-") and "alpha" not in ours and ours != keys.gateway_key("beta", "abcd")
    assert keys.team_key("alpha", "shared") != keys.team_key("beta", "shared")
    assert keys.team_key("alpha", "shared") == keys.team_key("alpha", "shared")  # stable: the provider keeps routing it
    monkeypatch.setattr(keys, "_secret", b"another secret")
    assert keys.gateway_key("alpha", "abcd") != ours  # unguessable without the server's secret


def test_the_secret_is_created_once_under_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(keys.SECRET_ENV, raising=False)
    monkeypatch.setattr(keys, "_secret", None)
    first = keys.server_secret(tmp_path)
    monkeypatch.setattr(keys, "_secret", None)
    assert keys.server_secret(tmp_path) == first and len(first) == 32
    assert (tmp_path / "server-secret").stat().st_mode & 0o077 == 0
    monkeypatch.setattr(keys, "_secret", None)
    monkeypatch.setenv(keys.SECRET_ENV, "set-by-the-operator")
    assert keys.server_secret(tmp_path) == b"set-by-the-operator"


def test_a_team_cannot_reuse_another_teams_openai_cache_key(tmp_path: Path, emu: RunningEmulator) -> None:
    emu.reset()
    messages = [{"role": "system", "content": SYSTEM}, *QUESTION]
    with running_proxy([_teams(tmp_path, emu)]) as proxy:
        alpha = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0)
        beta = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=BETA, max_retries=0)
        alpha.chat.completions.create(model="gpt-4o", messages=messages)
        alpha_key = _sent_key(emu)
        assert "alpha" not in alpha_key
        again = alpha.chat.completions.create(model="gpt-4o", messages=messages)
        assert again.usage.prompt_tokens_details.cached_tokens >= 1024  # the key still routes alpha to its cache
        # Beta sends alpha's key as its own: it is namespaced to beta, so alpha's entries stay out of reach.
        probe = beta.chat.completions.create(model="gpt-4o", messages=messages, prompt_cache_key=alpha_key)
        assert _sent_key(emu) != alpha_key
        assert probe.usage.prompt_tokens_details.cached_tokens == 0
        # The same client key from both teams reaches the provider as two keys.
        alpha.chat.completions.create(model="gpt-4o", messages=QUESTION, prompt_cache_key="shared-name")
        from_alpha = _sent_key(emu)
        beta.chat.completions.create(model="gpt-4o", messages=QUESTION, prompt_cache_key="shared-name")
        assert _sent_key(emu) != from_alpha and "shared-name" not in from_alpha


def test_a_compaction_cannot_reuse_another_teams_openai_cache_key(tmp_path: Path, emu: RunningEmulator) -> None:
    """/v1/responses/compact takes a `prompt_cache_key` too: it went upstream as the client sent it,
    so two teams naming the same key reached one provider cache."""
    emu.reset()
    with running_proxy([_teams(tmp_path, emu)]) as proxy:
        sent = []
        for key in (ALPHA, BETA):
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)
            client.responses.compact(model="gpt-4o", input="How do I reset the pump controller?", prompt_cache_key="shared-name")
            sent.append(_sent_key(emu))
        assert sent[0] != sent[1] and not {"shared-name"} & set(sent)
        assert sent[0] == keys.team_key("alpha", "shared-name")


@pytest.mark.parametrize("isolate", [False, True])
def test_isolate_keeps_identical_prompts_out_of_each_others_cache(tmp_path: Path, emu: RunningEmulator, isolate: bool) -> None:
    emu.reset()
    extra = f"prompt_cache: {{isolate: {str(isolate).lower()}}}\n"
    with running_proxy([_teams(tmp_path, emu, extra)]) as proxy:
        alpha = anthropic.Anthropic(base_url=proxy.url, api_key=ALPHA, max_retries=0)
        beta = anthropic.Anthropic(base_url=proxy.url, api_key=BETA, max_retries=0)
        written = alpha.messages.create(model="claude-sonnet-4-6", max_tokens=16, system=SYSTEM, messages=QUESTION)
        assert written.usage.cache_creation_input_tokens > 0
        probe = beta.messages.create(model="claude-sonnet-4-6", max_tokens=16, system=SYSTEM, messages=QUESTION)
        if isolate:
            assert probe.usage.cache_read_input_tokens == 0  # beta learns nothing of alpha's prompts
            again = alpha.messages.create(model="claude-sonnet-4-6", max_tokens=16, system=SYSTEM, messages=QUESTION)
            assert again.usage.cache_read_input_tokens > 0  # each team still reads its own
        else:
            assert probe.usage.cache_read_input_tokens > 0  # the oracle docs/prompt-cache.md describes


def _secret_of_a_worker(data_dir: Path, start: Any, secrets: Any) -> None:
    keys._secret = None  # a fresh process: forked from one that may have read its own already
    start.wait()  # every worker asks at once, as `slipstream serve --workers N` starting on a new data directory
    secrets.put(keys.server_secret(data_dir))


def _secrets_of_six_workers(data_dir: Path) -> list[bytes]:
    """The secret each of six forked workers read, all asking at once."""
    fork = multiprocessing.get_context("fork")
    start, secrets = fork.Barrier(6), fork.Queue()
    workers = [fork.Process(target=_secret_of_a_worker, args=(data_dir, start, secrets)) for _ in range(6)]
    for worker in workers:
        worker.start()
    read = [secrets.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join()
    return read


def test_workers_starting_together_share_one_whole_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first worker created the file and then wrote it: another could read it in between, empty,
    and key its digests with no secret (in about one start in six of six workers: 30 starts miss it
    with a chance of (5/6)^30, 0.4%; each start forks the test process six times, which took 3 s a
    start in a loaded full run, where this process holds the suite's models)."""
    monkeypatch.delenv(keys.SECRET_ENV, raising=False)
    for start_number in range(30):
        data_dir = tmp_path / str(start_number)
        read = _secrets_of_six_workers(data_dir)
        assert read == [(data_dir / "server-secret").read_bytes()] * 6 and len(read[0]) == 32, start_number
        assert [path.name for path in data_dir.iterdir()] == ["server-secret"]  # no spare file left behind


def test_workers_replace_an_empty_secret_file_with_one_whole_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zero-byte secret file (a process that crashed between creating and writing it; the race
    above in an older release) was read as the secret: every digest keyed with nothing, so anyone
    could compute every team's prompt-cache keys and end-user ids. Workers starting on it now replace
    it once, all with the same new secret."""
    monkeypatch.delenv(keys.SECRET_ENV, raising=False)
    for start_number in range(10):
        data_dir = tmp_path / str(start_number)
        data_dir.mkdir()
        (data_dir / "server-secret").write_bytes(b"")
        read = _secrets_of_six_workers(data_dir)
        assert read == [(data_dir / "server-secret").read_bytes()] * 6 and len(read[0]) == 32, start_number
        assert (data_dir / "server-secret").stat().st_mode & 0o077 == 0


def test_an_unwritable_data_dir_still_gives_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(keys.SECRET_ENV, raising=False)
    monkeypatch.setattr(keys, "_secret", None)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    secret = keys.server_secret(blocked / "data")
    assert len(secret) == 32 and keys.server_secret(blocked / "data") == secret  # one per process


def test_native_responses_bodies_are_planned_like_chat_ones(tmp_path: Path, emu: RunningEmulator) -> None:
    """A Responses request to a native Responses upstream gets the gateway's cache key, and the
    second request reads the prefix the first wrote (predicted in x-slipstream-prompt-cache)."""
    emu.reset()
    with running_proxy([_teams(tmp_path, emu)]) as proxy:
        alpha = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0)
        alpha.responses.create(model="gpt-4o", instructions=SYSTEM, input=QUESTION[0]["content"])
        sent = json.loads(emu.state.recent[-1]["body"])
        assert emu.state.recent[-1]["path"].endswith("/responses")
        assert sent["prompt_cache_key"].startswith("slipstream-") and sent["instructions"] == SYSTEM
        raw = alpha.responses.with_raw_response.create(model="gpt-4o", instructions=SYSTEM, input=QUESTION[0]["content"])
        usage = raw.parse().usage
        assert usage is not None and usage.input_tokens_details.cached_tokens >= 1024
        header = dict(part.split("=", 1) for part in raw.headers["x-slipstream-prompt-cache"].split(";"))
        assert int(header["expected_read"]) >= 1024


@pytest.mark.parametrize("isolate", [False, True])
def test_isolate_covers_native_responses(tmp_path: Path, emu: RunningEmulator, isolate: bool) -> None:
    emu.reset()
    extra = f"prompt_cache: {{isolate: {str(isolate).lower()}}}\n"
    with running_proxy([_teams(tmp_path, emu, extra)]) as proxy:
        alpha = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0)
        beta = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=BETA, max_retries=0)
        alpha.responses.create(model="gpt-4o", instructions=SYSTEM, input=QUESTION[0]["content"])
        sent = json.loads(emu.state.recent[-1]["body"])
        # Beta sends alpha's exact prompt under alpha's cache key (as sent upstream): the key is
        # namespaced to beta; with isolate the salt also keeps the prefix itself apart.
        probe = beta.responses.create(model="gpt-4o", instructions=SYSTEM, input=QUESTION[0]["content"],
                                      prompt_cache_key=sent["prompt_cache_key"])
        if isolate:
            assert sent["instructions"].startswith("[cache scope ") and sent["instructions"].endswith(SYSTEM)
            assert probe.usage is not None and probe.usage.input_tokens_details.cached_tokens == 0
            again = alpha.responses.create(model="gpt-4o", instructions=SYSTEM, input=QUESTION[0]["content"])
            assert again.usage is not None and again.usage.input_tokens_details.cached_tokens > 0
        else:
            assert sent["instructions"] == SYSTEM


class _CountedEncoding:
    """cl100k, recording every text it tokenizes."""

    def __init__(self, encoding) -> None:
        self.encoding = encoding
        self.texts: list[str] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.texts.append(text)
        return self.encoding.encode_ordinary(text)

    def __getattr__(self, name: str):
        return getattr(self.encoding, name)


@requires_extra("semantic")  # the teams' policy turns document pruning on
def test_token_counts_are_not_shared_between_teams(tmp_path: Path, emu: RunningEmulator, monkeypatch):
    """The planner and compression memoise token counts by content, and a count found takes well
    under a millisecond where one made takes ~10 ms for 60 KB: team B read in its own
    `x-slipstream-overhead-ms` (1.4 ms against 13 ms, median of 15) whether team A had sent a
    document. Each team's counts are its own: B's copy of A's document is counted for B."""
    from sdk.compression import tokens as compression_tokens
    from sdk.promptcache import tokens

    encoding = _CountedEncoding(tokens.load_encoding())
    monkeypatch.setattr(tokens, "_ENCODING", encoding)
    monkeypatch.setattr(compression_tokens, "_encoding", lambda: encoding)
    document = "Clause 7. " + " ".join(f"The supplier shall deliver lot {i} within {i % 9 + 2} days." for i in range(600))
    _teams(tmp_path, emu, extra="compression: {enabled: true, documents: {min_tokens: 100000}}\n")
    with running_proxy([tmp_path]) as proxy:
        for key in (ALPHA, BETA):
            client = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)
            client.messages.create(model="claude-sonnet-4-5", max_tokens=8, system=[{"type": "text", "text": document}], messages=QUESTION)
    assert encoding.texts.count(document) == 4  # by the planner and by compression, for each team


async def test_one_teams_large_prompts_do_not_take_every_teams_background_counts():
    """Past 64 KiB of new text in a request a block is estimated and counted exactly in the heavy-work
    pool, at most four at a time; the four places were every team's, so one team's stream of large
    prompts kept another team's blocks estimated. Each team has its own four."""
    import asyncio
    import threading

    from sdk.offload import HEAVY_POOL, TENANT
    from sdk.promptcache import tokens

    gate = threading.Event()
    TENANT.set("held")
    held = [HEAVY_POOL.submit(lambda: gate.wait(30)) for _ in range(2)]  # both threads busy: counts queue
    big = "lorem ipsum " * 7_000  # past one request's exact share
    for i in range(tokens.RequestCounter.MAX_PENDING):
        TENANT.set("alpha")
        tokens.RequestCounter("alpha").count(1000 + i, f"{i} {big}")
    TENANT.set("beta")
    tokens.RequestCounter("beta").count(2000, big)
    gate.set()
    await asyncio.gather(*(asyncio.wrap_future(f) for f in held))
    await asyncio.wrap_future(HEAVY_POOL.submit(lambda: None))  # beta's turn again: its count ran before, or runs
    wait_until(lambda: ("beta", 2000) in tokens._COUNTS, "beta's background count", timeout_s=5)  # on the other thread


def test_one_teams_many_texts_do_not_clear_another_teams_token_counts():
    """Token counts are remembered in one memo every team shares (65,536 entries; compression's is
    16,384), which was cleared wholesale when full: a team sending that many distinct blocks cleared
    every team's counts, and the others' next requests counted their prompts again on the event loop
    (up to 64 KiB each) or estimated them. When it is full now, the team holding the most entries
    loses its own (sdk/lru.py:TeamMemo)."""
    from sdk.promptcache import tokens

    tokens.RequestCounter("beta").count(1, "the other team's system prompt")
    for i in range(65_536 + 5_000):  # past the memo's bound
        tokens.RequestCounter("alpha").count(10_000 + i, f"block {i}")
    assert ("beta", 1) in tokens._COUNTS  # before: cleared with alpha's
    assert len(tokens._COUNTS) <= 65_536
