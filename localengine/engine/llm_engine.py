"""The synchronous engine: add requests, call step() until done. LLM and the async engine wrap it.

One step = schedule (which tokens of which requests), run the model once over all of them,
then per request: append the sampled token, detokenize, check stop conditions, emit output.
Not thread-safe: the async engine calls it from its single engine thread.
"""

from __future__ import annotations

import json
import time
from typing import Any

from transformers import AutoTokenizer

from localengine.config import Config
from localengine.engine.block_manager import BlockManager
from localengine.engine.detokenizer import IncrementalDetokenizer
from localengine.engine.model_runner import ModelRunner
from localengine.engine.scheduler import Scheduler
from localengine.engine.sequence import Sequence
from localengine.metrics import EngineMetrics
from localengine.outputs import CompletionOutput, RequestOutput
from localengine.sampling_params import SamplingParams

Prompt = str | list[int]


def load_tokenizer(config: Config) -> Any:
    return AutoTokenizer.from_pretrained(str(config.model_path), local_files_only=True)


def eos_token_ids(config: Config, tokenizer: Any) -> set[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer (models disagree)."""
    ids: set[int] = set()
    sources = [config.hf_config.get("eos_token_id")]
    gen = config.model_path / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    sources.append(tokenizer.eos_token_id)
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return ids


class LLMEngine:
    def __init__(self, config: Config):
        self.config = config
        self.tokenizer = load_tokenizer(config)
        self.eos_token_ids = eos_token_ids(config, self.tokenizer)
        self.model_runner = ModelRunner(config, self.eos_token_ids)
        assert config.max_model_len is not None
        self.max_model_len = config.max_model_len
        self.block_manager = BlockManager(
            self.model_runner.num_kvcache_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_batched_tokens, config.max_num_seqs, self.max_model_len
        )
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.metrics = EngineMetrics(config.model)
        self._next_id = 0

    @classmethod
    def from_args(cls, model: str, **kwargs: Any) -> LLMEngine:
        return cls(Config(model=model, **kwargs))

    def new_request_id(self) -> str:
        self._next_id += 1
        return str(self._next_id - 1)

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        if not all(isinstance(t, int) and 0 <= t < self.model_runner.model.args.vocab_size for t in prompt):
            raise ValueError("prompt token ids must be ints inside the model's vocabulary")
        return None, list(prompt)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams,
                    cache_salt: str | None = None, arrival_time: float | None = None) -> None:
        text, token_ids = self.tokenize(prompt)
        seq = Sequence(request_id, token_ids, params, text, cache_salt, arrival_time)
        self.scheduler.add(seq)
        self.detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, params, token_ids)

    def abort_request(self, request_ids: str | list[str]) -> list[RequestOutput]:
        """Stop requests now and free their KV blocks; returns their final outputs."""
        outputs = []
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            seq = self.scheduler.requests.get(rid)
            if seq is None:
                continue
            self.scheduler.finish(seq, "abort")
            outputs.append(self._output(seq))
            self.detokenizers.pop(rid, None)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        sched_out = self.scheduler.schedule()
        if sched_out.is_empty:
            self._record_step(0, 0)
            return []
        sampled = self.model_runner.execute(sched_out)
        self.scheduler.update_after_step(sched_out)
        now = time.time()
        outputs = []
        for s in sampled:
            seq = s.item.seq
            seq.append_token(s.token_id)
            if s.logprobs is not None and seq.logprobs is not None:
                seq.logprobs.append(s.logprobs)
                seq.cumulative_logprob += s.logprobs[s.token_id].logprob
            m = seq.metrics
            if m.first_token_time is None:
                m.first_token_time = now
                self.metrics.record_first_token(now - m.arrival_time)
            elif m.last_token_time is not None:
                self.metrics.record_inter_token(now - m.last_token_time)
            m.last_token_time = now
            self._check_stop(seq, s.token_id)
            outputs.append(self._output(seq))
            if seq.is_finished:
                self.detokenizers.pop(seq.request_id, None)
                self.metrics.record_finished(seq.finish_reason or "stop", now - m.arrival_time)
        prompt_tokens = sum(
            max(0, min(it.num_computed_before + it.num_new_tokens, it.seq.num_prompt_tokens) - it.num_computed_before)
            for it in sched_out.scheduled
        )
        self._record_step(prompt_tokens, len(sampled))
        return outputs

    def _check_stop(self, seq: Sequence, token_id: int) -> None:
        params = seq.sampling_params
        stop_string = self.detokenizers[seq.request_id].append(token_id)
        reason: tuple[str, int | str | None] | None = None
        if seq.num_output_tokens >= params.min_tokens:
            if token_id in params.stop_token_ids:
                reason = ("stop", token_id)
            elif not params.ignore_eos and token_id in self.eos_token_ids:
                reason = ("stop", None)
            elif stop_string is not None:
                reason = ("stop", stop_string)
        if reason is None and (
            (params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens)
            or seq.num_tokens >= self.max_model_len
        ):
            reason = ("length", None)
        if reason is not None:
            self.scheduler.finish(seq, *reason)

    def _output(self, seq: Sequence) -> RequestOutput:
        detok = self.detokenizers[seq.request_id]
        finished = seq.is_finished
        completion = CompletionOutput(
            index=0,
            text=detok.visible_text(finished),
            token_ids=seq.output_token_ids,
            cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            num_cached_tokens=max(0, seq.num_cached_tokens),
            metrics=seq.metrics,
        )

    def _record_step(self, prompt_tokens: int, generation_tokens: int) -> None:
        bm = self.block_manager
        self.metrics.record_step(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_usage=bm.usage(),
            prefix_queries=bm.prefix_cache_queries,
            prefix_hits=bm.prefix_cache_hits,
            preemptions=self.scheduler.num_preemptions,
            prompt_tokens=prompt_tokens,
            generation_tokens=generation_tokens,
        )
