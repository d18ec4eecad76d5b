"""The policy docs/emulator.md gives for pointing Slipstream at the emulator works as written:
the official clients reach the emulator through the real proxy on every main endpoint."""

from __future__ import annotations

import re
from pathlib import Path

import anthropic
import openai

from emulator.testing import running_emulator
from gateway.testing import running_proxy

DOC = Path(__file__).resolve().parents[2] / "docs" / "emulator.md"


def _doc_policy() -> str:
    text = DOC.read_text()
    section = text[text.index("## Pointing Slipstream at the emulator"):]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_doc_policy_drives_every_endpoint_through_the_proxy(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    with running_emulator() as emu:
        policy = _doc_policy().replace("http://127.0.0.1:8081", emu.url)
        (tmp_path / "emulator.yaml").write_text(policy)
        with running_proxy([tmp_path / "emulator.yaml"]) as proxy:
            oai = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-offline-team", max_retries=0)
            ant = anthropic.Anthropic(base_url=proxy.url, api_key="sk-offline-team", max_retries=0)
            chat = oai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
            assert chat.choices[0].message.content
            resp = oai.responses.create(model="gpt-4.1-mini", input="hi")
            assert resp.output_text and oai.responses.retrieve(resp.id).id == resp.id
            emb = oai.embeddings.create(model="text-embedding-3-small", input=["a", "b"], dimensions=8)
            assert len(emb.data) == 2 and len(emb.data[0].embedding) == 8
            msg = ant.messages.create(model="claude-sonnet-4-6", max_tokens=16,
                                      messages=[{"role": "user", "content": "hi"}])
            assert msg.content[0].text
            assert "gpt-4o" in [m.id for m in oai.models.list()]
        seen = emu.stats()["endpoints"]
    assert {"POST /v1/chat/completions", "POST /v1/responses", "GET /v1/responses/{id}",
            "POST /v1/embeddings", "POST /v1/messages"} <= set(seen)
