"""End-user ids reach the shared provider account namespaced to the team (sdk/promptcache/keys.py).

Every team's requests go out under one provider key, and the provider's abuse detection reads the
end user a request names (OpenAI's `user` and `safety_identifier`, Anthropic's `metadata.user_id`):
sent as the client wrote them, two teams' "alice" were one user to the provider, a team could send
another team's user ids to have those users flagged, and the emails clients use as ids left the
gateway. Each id now reaches the provider as a keyed digest of (team, id): the same for one team
wherever it sends it (either door, a translated route, a batch), another for every other team.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gateway.testing import RunningServer, running_proxy
from tests.helpers import anth, oai, write_policy

KEYS = {"alpha": "sk-alpha-users", "beta": "sk-beta-users"}
ALICE = "alice@example.com"
# A chat model served by Claude (translated), and prices for the pass-through's completion.
EXTRA = ('  - match: {model: "chat-sonnet"}\n    targets: [{provider: claude, model: "claude-sonnet-4-6"}]\n'
         '  - match: {model: "text-embedding-*"}\n    targets: [{provider: gpt}]\n'
         'pricing: {"gpt-3.5-*": {input: 1, output: 1}}\n')
CHAT = {"model": "gpt-4o-mini", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
MSG = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[RunningServer]:
    directory: Path = tmp_path_factory.mktemp("end-users")
    for team, key in KEYS.items():
        write_policy(directory, team, key, emulator.url, extra=EXTRA)
    with running_proxy([directory]) as running:
        yield running


def last_body(emulator, path: str) -> dict:
    return orjson.loads([r for r in emulator.app.state.recent if r["path"].endswith(path)][-1]["body"])


def sent_ids(proxy: RunningServer, emulator, key: str) -> dict[str, str]:
    """The end-user id each kind of request carried to the provider, for a client naming ALICE."""
    openai_client, anthropic_client = oai(proxy, key), anth(proxy, key)
    sent: dict[str, str] = {}
    openai_client.chat.completions.create(**CHAT, user=ALICE, safety_identifier=ALICE)
    body = last_body(emulator, "/v1/chat/completions")
    sent["chat user"], sent["chat safety_identifier"] = body["user"], body["safety_identifier"]
    openai_client.responses.create(model="gpt-4o-mini", input="Hi", max_output_tokens=16, safety_identifier=ALICE)
    sent["responses safety_identifier"] = last_body(emulator, "/v1/responses")["safety_identifier"]
    openai_client.embeddings.create(model="text-embedding-3-small", input="Hi", user=ALICE)
    sent["embeddings user"] = last_body(emulator, "/v1/embeddings")["user"]
    anthropic_client.messages.create(**MSG, metadata={"user_id": ALICE})
    sent["messages metadata.user_id"] = last_body(emulator, "/v1/messages")["metadata"]["user_id"]
    openai_client.chat.completions.create(**{**CHAT, "model": "chat-sonnet"}, user=ALICE)  # to Claude, translated
    sent["translated metadata.user_id"] = last_body(emulator, "/v1/messages")["metadata"]["user_id"]
    # the pass-through: a legacy completion, a message batch's params, a batch input file's lines
    openai_client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Hi", max_tokens=4, user=ALICE)
    sent["completion user"] = last_body(emulator, "/v1/completions")["user"]
    anthropic_client.messages.batches.create(requests=[{"custom_id": "a", "params": {**MSG, "metadata": {"user_id": ALICE}}}])
    sent["message batch metadata.user_id"] = last_body(emulator, "/v1/messages/batches")["requests"][0]["params"]["metadata"]["user_id"]
    line = orjson.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                         "body": {**CHAT, "user": ALICE, "safety_identifier": ALICE}})
    uploaded = openai_client.files.create(file=("in.jsonl", line + b"\n"), purpose="batch")
    stored = orjson.loads(emulator.app.state.files.entries[uploaded.id].content.splitlines()[0])["body"]
    sent["batch line user"], sent["batch line safety_identifier"] = stored["user"], stored["safety_identifier"]
    return sent


def test_end_user_ids_reach_the_provider_namespaced_to_the_team(proxy, fresh_emulator):
    alpha, beta = (sent_ids(proxy, fresh_emulator, key) for key in KEYS.values())
    for sent in (alpha, beta):
        assert all(ALICE not in value and "alice" not in value for value in sent.values()), sent
        assert len(set(sent.values())) == 1, sent  # one end user of one team: one id wherever it is sent
        assert all(len(value) <= 64 for value in sent.values())  # OpenAI refuses a longer `user`
    assert set(alpha.values()).isdisjoint(beta.values())  # two teams' "alice" are two users to the provider


def test_requests_without_end_user_ids_are_sent_as_they_were(proxy, fresh_emulator):
    oai(proxy, KEYS["alpha"]).chat.completions.create(**CHAT)
    body = last_body(fresh_emulator, "/v1/chat/completions")
    assert "user" not in body and "safety_identifier" not in body
    anth(proxy, KEYS["alpha"]).messages.create(**MSG, metadata={"user_id": ""})
    assert last_body(fresh_emulator, "/v1/messages")["metadata"] == {"user_id": ""}  # nothing to name: left as sent
