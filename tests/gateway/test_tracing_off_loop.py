"""A large answer's trace attributes are read off the event loop.

Through the proxy with the official openai client, the emulator as the upstream, spans caught in memory.
When a request ends its trace reads the answer for the finish reasons, the response id and model (a scan
of the whole body) and, with message capture on, its output (the body parsed). That ran on the event loop
every team's requests share, once the answer was sent, whatever the answer's size: an embeddings answer
is megabytes for a few words (2,048 inputs at 3,072 dimensions: about 67 MB, a scan of 75 ms, half a second
with capture on). An answer of 256 KiB or more is read in the heavy-work pool now, as its team's work.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import PATIENCE_S, oai, skip_without_extra, write_policy

skip_without_extra("otel")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from emulator.testing import RunningEmulator  # noqa: E402
from gateway.testing import running_proxy  # noqa: E402
from sdk.observability import tracing  # noqa: E402
from sdk.observability.tracing import genai  # noqa: E402
from sdk.offload import LARGE_BYTES, TENANT  # noqa: E402

KEY = "sk-alpha-traced"
ROUTE = '  - match: {model: "text-embedding-*"}\n    targets: [{provider: gpt}]\nprompt_cache: {enabled: false}\n'


@pytest.fixture
def exporter(monkeypatch) -> Iterator[InMemorySpanExporter]:
    caught = InMemorySpanExporter()
    monkeypatch.setenv(tracing.CAPTURE_VAR, "true")  # read when tracing is set up
    tracing.install(SimpleSpanProcessor(caught))
    yield caught
    tracing.reset()


def test_a_large_answers_trace_attributes_are_read_in_the_heavy_work_pool(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                         exporter: InMemorySpanExporter, monkeypatch) -> None:
    """An embeddings answer of 330 KB: read on the loop's thread before (uvicorn's), in the heavy-work pool
    as alpha's work now, its span exported as before; a small answer is still read where it is."""
    ran: list[tuple[bool, str, str]] = []
    read = genai._read_body

    def recorded(attributes: dict[str, Any], body: bytes, capture: bool) -> None:
        ran.append((len(body) >= LARGE_BYTES, threading.current_thread().name.rsplit("-", 1)[0], TENANT.get()))
        read(attributes, body, capture)

    monkeypatch.setattr(genai, "_read_body", recorded)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra=ROUTE)
    with running_proxy([tmp_path]) as proxy:
        client = oai(proxy, KEY)
        words = [f"word {i}" for i in range(20)]  # 20 vectors of 3,072 floats, in base64 as the client asks
        assert len(client.embeddings.create(model="text-embedding-3-large", input=words).data) == 20
        client.chat.completions.create(model="gpt-4o-mini", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        deadline = time.monotonic() + PATIENCE_S
        while len(exporter.get_finished_spans()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    spans = {span.attributes["gen_ai.operation.name"]: span for span in exporter.get_finished_spans()
             if span.attributes and "slipstream.route" in span.attributes}
    assert spans["embeddings"].attributes["gen_ai.response.model"] == "text-embedding-3-large"
    assert ran[0] == (True, "slipstream-heavy", "alpha")  # before: the event loop's thread
    assert ran[1][0] is False and ran[1][1] != "slipstream-heavy"
