"""The embedder: concurrent callers share batches, off the event loop, with the same vectors as bulk encoding."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.helpers import bound_from


async def test_concurrent_requests_are_micro_batched(embedder):
    texts = [f"How do I cook rice number {i}?" for i in range(24)]
    before = embedder.batches
    vectors = await asyncio.gather(*(embedder.embed(text) for text in texts))
    assert embedder.batches - before < len(texts)  # queued while the worker was busy: encoded together
    np.testing.assert_allclose(np.stack(vectors), embedder.embed_many(texts), atol=1e-5)
    assert abs(float(np.linalg.norm(vectors[0])) - 1.0) < 1e-5  # unit norm: inner product is cosine


async def test_a_huge_text_does_not_hold_other_lookups(embedder):
    """The one embedder worker serves every team: a 2 MB text used to keep it busy for seconds
    (the tokenizer reads all of it before truncating to 256 word pieces). Now it reads a bounded
    prefix, which is all the model ever saw: the vector is the same."""
    import asyncio
    import time

    import numpy as np

    from sdk.embedding import MAX_TEXT_CHARS

    huge = "The shipment left the port on time and arrived two days later. " * 32_000  # ~2 MB
    alone_started = time.perf_counter()
    await embedder.embed("where is my parcel, alone?")
    alone = time.perf_counter() - alone_started  # the bound below is relative to it: same machine, same load
    small_started = 0.0

    async def small() -> float:
        nonlocal small_started
        await asyncio.sleep(0.01)  # queued behind the huge one
        small_started = time.perf_counter()
        await embedder.embed("where is my parcel?")
        return time.perf_counter() - small_started

    vector, waited = await asyncio.gather(embedder.embed(huge), small())
    assert waited < bound_from(alone, floor_s=1.0), f"a small lookup waited {waited:.2f}s behind another team's huge text ({alone:.3f}s alone)"
    assert np.allclose(vector, await embedder.embed(huge[:MAX_TEXT_CHARS]), atol=1e-5)


async def test_a_long_embeddings_input_does_not_hold_other_lookups(embedder):
    """A local provider's /v1/embeddings hands the one worker all of a request's texts as one job,
    and every team's jobs queue behind it: 3,000 texts held another team's single lookup until all
    were encoded. A job is now encoded `max_batch` texts at a time and goes back behind the jobs
    that came meanwhile. Order of completion, not time."""
    import numpy as np

    texts = [f"Invoice {i} was paid on the third of the month by bank transfer." for i in range(3_000)]
    done: list[str] = []

    async def long() -> tuple[np.ndarray, list[int]]:
        found = await embedder.embed_counted(texts)
        done.append("long")
        return found

    before = embedder.batches
    task = asyncio.create_task(long())
    await asyncio.sleep(0)  # the long job is queued
    while embedder._waiting and embedder.batches == before:
        await asyncio.sleep(0.001)  # until the worker has taken it (an event, polled)
    await embedder.embed("where is my parcel?")
    done.append("short")
    vectors, counts = await task
    assert done == ["short", "long"]
    assert len(counts) == len(texts) == len(vectors)
    alone, alone_counts = await embedder.embed_counted([texts[0], texts[-1]])
    assert [counts[0], counts[-1]] == alone_counts  # the slices reassemble in order
    np.testing.assert_allclose(vectors[[0, -1]], alone, atol=1e-5)



async def test_one_teams_many_jobs_do_not_hold_another_teams_lookup(embedder):
    """Contextual compression embeds each sentence of a document as a job of its own, in the
    worker every team shares (so do many requests at once): one team's 400 jobs were all encoded
    before another team's one lookup, queued after them. Jobs now wait per team, and each batch
    takes one job of each waiting team in turn. Order of completion, not time."""
    done: list[str] = []

    async def embedded(text: str, team: str) -> None:
        await embedder.embed(text, team)
        done.append(team)

    many = [asyncio.create_task(embedded(f"Clause {i}: the supplier delivers lot {i} by the {i % 28 + 1}th.", "a")) for i in range(400)]
    await asyncio.sleep(0)  # every job of team a is queued
    await embedded("where is my parcel?", "b")
    await asyncio.gather(*many)
    assert done.index("b") <= 2 * embedder.max_batch  # in the first batch formed after it came (400 before)

def test_the_encoder_runs_onnx_runtime_by_default(embedder):
    assert embedder._load().runtime == "onnxruntime", "ONNX Runtime failed: a slower fallback is serving"


@pytest.mark.parametrize("runtime", ["onnxruntime", "torchscript"])
def test_each_runtime_computes_what_the_eager_model_does(embedder, runtime):
    """MiniLM runs in ONNX Runtime, else TorchScript; each must stay the same function on any batch
    shape: padded batches of mixed lengths and a text past the 256-piece window."""
    from sdk.embedding import _Encoder

    encoder = _Encoder(embedder._load().model, runtimes=(runtime,))
    assert encoder.runtime == runtime
    texts = ["Hi", "How do I learn Python quickly and well enough to get a job as a developer?", "word " * 400, "Is it safe?"]
    eager = encoder.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    np.testing.assert_allclose(encoder.encode(texts, batch_size=3), eager, atol=1e-5)
