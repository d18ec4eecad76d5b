"""The embedder: concurrent callers share batches, off the event loop, with the same vectors as bulk encoding."""

from __future__ import annotations

import asyncio

import numpy as np


async def test_concurrent_requests_are_micro_batched(embedder):
    texts = [f"How do I cook rice number {i}?" for i in range(24)]
    before = embedder.batches
    vectors = await asyncio.gather(*(embedder.embed(text) for text in texts))
    assert embedder.batches - before < len(texts)  # queued while the worker was busy: encoded together
    np.testing.assert_allclose(np.stack(vectors), embedder.embed_many(texts), atol=1e-5)
    assert abs(float(np.linalg.norm(vectors[0])) - 1.0) < 1e-5  # unit norm: inner product is cosine
