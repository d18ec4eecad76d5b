"""Async front end: one engine thread runs model steps; asyncio callers stream per-request outputs.

Model steps take milliseconds to seconds and hold the GIL only between torch ops, so they run in a
dedicated thread, never on an event loop. Callers on any event loop submit requests through a
command list; the engine thread applies commands between steps (so adds and aborts never race a
step) and hands each output to the caller's loop with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from localengine.config import Config
from localengine.engine.llm_engine import LLMEngine, Prompt
from localengine.outputs import RequestOutput
from localengine.sampling_params import SamplingParams


class _RequestStream:
    """Outputs of one request, delivered from the engine thread to the caller's event loop. Outputs
    are cumulative, so one the reader has not taken yet is replaced by the next (vLLM merges a slow
    reader's outputs so too): a slow reader holds one, not a copy of everything so far per step."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.pending: deque[RequestOutput | BaseException] = deque()
        self.ready = asyncio.Event()

    def put(self, item: RequestOutput | BaseException) -> bool:
        try:
            self.loop.call_soon_threadsafe(self._put, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            return False
        return True

    def _put(self, item: RequestOutput | BaseException) -> None:
        last = self.pending[-1] if self.pending else None
        if isinstance(item, RequestOutput) and isinstance(last, RequestOutput) and not last.finished:
            self.pending[-1] = item
        else:
            self.pending.append(item)
        self.ready.set()

    async def get(self) -> RequestOutput | BaseException:
        while not self.pending:
            self.ready.clear()
            await self.ready.wait()
        return self.pending.popleft()


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: Prompt
    params: SamplingParams
    cache_salt: str | None


@dataclass(slots=True)
class _Abort:
    request_id: str


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._streams: dict[str, _RequestStream] = {}
        self._commands: list[_Add | _Abort] = []
        self._cv = threading.Condition()
        self._stopped = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="localengine-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_args(cls, model: str, **kwargs: Any) -> AsyncLLMEngine:
        return cls(LLMEngine(Config(model=model, **kwargs)))

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.config.model

    async def generate(self, prompt: Prompt, sampling_params: SamplingParams, request_id: str | None = None,
                       cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream cumulative outputs of one request. Leaving the loop early aborts the request."""
        rid = request_id or f"req-{next(self._ids)}"
        stream = _RequestStream(asyncio.get_running_loop())
        with self._cv:
            if self._stopped:
                raise RuntimeError("the engine has been shut down")
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in use")
            self._streams[rid] = stream
            self._commands.append(_Add(rid, prompt, sampling_params, cache_salt))
            self._cv.notify()
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    break
        finally:
            if not finished:
                self.abort(rid)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks before the next step. Thread-safe, idempotent."""
        with self._cv:
            self._commands.append(_Abort(request_id))
            self._cv.notify()

    def shutdown(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout=30)
        self.engine.shutdown()

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cv:
                while not self._stopped and not self._commands and not engine.has_unfinished_requests():
                    self._cv.wait()
                if self._stopped:
                    break
                commands, self._commands = self._commands, []
            for cmd in commands:
                self._apply(cmd)
            if not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # a failed step fails every request in flight, not the thread
                self._fail_all(exc)
                continue
            for out in outputs:
                self._deliver(out)
        self._fail_all(RuntimeError("the engine was shut down"))

    def _apply(self, cmd: _Add | _Abort) -> None:
        if isinstance(cmd, _Abort):
            for out in self.engine.abort_request(cmd.request_id):
                self._deliver(out)
            return
        try:
            self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params, cmd.cache_salt)
        except Exception as exc:
            stream = self._pop_stream(cmd.request_id)
            if stream is not None:
                stream.put(exc)

    def _deliver(self, out: RequestOutput) -> None:
        with self._cv:
            stream = self._streams.get(out.request_id)
            if out.finished:
                self._streams.pop(out.request_id, None)
        if stream is not None and not stream.put(out) and not out.finished:
            self.engine.abort_request(out.request_id)

    def _pop_stream(self, request_id: str) -> _RequestStream | None:
        with self._cv:
            return self._streams.pop(request_id, None)

    def _fail_all(self, exc: BaseException) -> None:
        self.engine.abort_request(list(self.engine.scheduler.requests))
        with self._cv:
            streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put(exc)


_shared: dict[tuple[str, str], AsyncLLMEngine] = {}
_shared_lock = threading.Lock()


def get_shared_engine(model: str, **kwargs: Any) -> AsyncLLMEngine:
    """The process-wide engine for `model` and these engine arguments, created on first use (loading
    weights blocks: call it from a worker thread when on an event loop). Providers asking for the
    same model with other arguments (speculation, say) get an engine of their own."""
    key = (model, json.dumps(kwargs, sort_keys=True, default=str))
    with _shared_lock:
        engine = _shared.get(key)
        if engine is None:
            engine = _shared[key] = AsyncLLMEngine.from_args(model, **kwargs)
        return engine
