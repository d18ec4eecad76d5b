"""The synchronous engine: add requests, call step() until done. LLM and the async engine wrap it.

One step = schedule (which tokens of which requests), run the model once over all of them,
then per request: append the sampled token, detokenize, check stop conditions, emit output.
Not thread-safe: the async engine calls it from its single engine thread.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from localengine.config import Config, SpeculativeConfig
from localengine.engine.block_manager import BlockManager
from localengine.engine.detokenizer import IncrementalDetokenizer
from localengine.engine.model_runner import ModelRunner
from localengine.engine.scheduler import Scheduler
from localengine.engine.sequence import Sequence
from localengine.engine.tp_worker import TensorParallelWorkers
from localengine.metrics import EngineMetrics
from localengine.outputs import CompletionOutput, RequestOutput
from localengine.sampling_params import RequestOutputKind, SamplingParams
from localengine.spec_decode.metrics import SpecDecodingMetrics, SpecDecodingStats
from localengine.spec_decode.ngram import NgramProposer
from localengine.spec_decode.policy import SpeculationPolicy
from localengine.spec_decode.proposer import Proposer

Prompt = str | list[int]


def load_tokenizer(config: Config) -> Any:
    if config.model_path.suffix == ".gguf":
        # Converted from the file's metadata (models/gguf_tokenizer.py): always a fast tokenizer,
        # and AutoTokenizer would import the model's transformers config class just to learn that.
        return PreTrainedTokenizerFast.from_pretrained(str(config.tokenizer_path), local_files_only=True)
    return AutoTokenizer.from_pretrained(str(config.tokenizer_path), local_files_only=True)


def eos_token_ids(config: Config, tokenizer: Any) -> set[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer (models disagree)."""
    ids: set[int] = set()
    sources = [config.hf_config.get("eos_token_id")]
    gen = config.tokenizer_path / "generation_config.json"
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
        self.tp_workers = TensorParallelWorkers(config) if config.tensor_parallel_size > 1 else None
        self.model_runner = ModelRunner(config, self.eos_token_ids)
        assert config.max_model_len is not None
        self.max_model_len = config.max_model_len
        self.block_manager = BlockManager(
            self.model_runner.num_kvcache_blocks, config.block_size, config.enable_prefix_caching
        )
        spec = config.speculative_config
        assert spec is None or isinstance(spec, SpeculativeConfig)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_batched_tokens, config.max_num_seqs, self.max_model_len,
            num_lookahead_tokens=spec.num_speculative_tokens if spec else 0,
        )
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.metrics = EngineMetrics(config.model)
        self.proposer: Proposer | None = None
        self.spec_policy: SpeculationPolicy | None = None
        # prompt_lookup: n-gram lookup first, the proposer for the rest, each with its own policy
        # (lookup's acceptance and cost are not the speculator's).
        self.lookup: NgramProposer | None = None
        self.lookup_policy: SpeculationPolicy | None = None
        self.spec_metrics: SpecDecodingMetrics | None = None
        if spec is not None:
            self._init_speculation(spec)
        self._next_id = 0
        self._last_step_seconds = 0.0

    def _init_speculation(self, spec: SpeculativeConfig) -> None:
        from localengine.spec_decode.draft import DraftModelProposer
        from localengine.spec_decode.mlp_proposer import MLPSpeculatorProposer

        if spec.method == "ngram":
            self.proposer, draft_cost = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max), 0.0
        elif spec.method == "mlp_speculator":
            speculator = MLPSpeculatorProposer(self.config, spec, self.model_runner.model)
            self.model_runner.keep_hidden = True
            self.proposer, draft_cost = speculator, speculator.cost_ratio()
        else:
            runner = self.model_runner
            draft = DraftModelProposer(self.config, spec, runner.num_kvcache_blocks, self.tokenizer,
                                       runner.model.args.vocab_size)
            self.proposer, draft_cost = draft, draft.cost_ratio(runner.model)
        self.spec_policy = SpeculationPolicy(spec, self.max_model_len, draft_cost)
        if spec.prompt_lookup:
            self.lookup = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
            as_ngram = dataclasses.replace(spec, method="ngram", prompt_lookup=False, disable_by_batch_size=None)
            self.lookup_policy = SpeculationPolicy(as_ngram, self.max_model_len, 0.0)
        self.spec_metrics = SpecDecodingMetrics(self.metrics.registry, self.config.model, spec.num_speculative_tokens)

    def spec_decode_stats(self) -> SpecDecodingStats | None:
        return self.spec_metrics.stats if self.spec_metrics else None

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do without tensor parallelism)."""
        if self.tp_workers is not None:
            self.model_runner.stop_workers()
            self.tp_workers.join()
            self.tp_workers = None

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
        vocab = self.model_runner.model.args.vocab_size
        if params.logit_bias and not all(isinstance(t, int) and 0 <= t < vocab for t in params.logit_bias):
            raise ValueError("logit_bias keys must be token ids inside the model's vocabulary")
        seq = Sequence(request_id, token_ids, params, text, cache_salt, arrival_time, self.model_runner.device)
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
            self._forget(seq)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        sched_out = self.scheduler.schedule()
        if sched_out.is_empty:
            self._record_step(0, 0)
            return []
        start = time.perf_counter()
        sampled = self.model_runner.execute(sched_out)
        self._last_step_seconds = time.perf_counter() - start
        num_rejected = {s.item.seq.request_id: s.num_draft - s.num_accepted for s in sampled if s.num_draft}
        self.scheduler.update_after_step(sched_out, num_rejected)
        now = time.time()
        outputs = []
        num_generated = 0
        for s in sampled:
            seq = s.item.seq
            seq.last_hidden = s.hidden
            if s.num_draft and self.spec_metrics and self.spec_policy:
                self.spec_metrics.observe_draft(s.num_draft, s.num_accepted)
                policy = self.lookup_policy if seq.spec_by_lookup and self.lookup_policy else self.spec_policy
                policy.observe(seq.request_id, s.num_draft, s.num_accepted)
            for token_id in s.token_ids:
                seq.append_token(token_id)
                num_generated += 1
                if s.logprobs is not None and seq.logprobs is not None:
                    seq.logprobs.append(s.logprobs)
                    seq.cumulative_logprob += s.logprobs[token_id].logprob
                self._check_stop(seq, token_id)
                if seq.is_finished:
                    break  # tokens accepted past a stop condition are dropped
            m = seq.metrics
            if m.first_token_time is None:
                m.first_token_time = now
                self.metrics.record_first_token(now - m.arrival_time)
            elif m.last_token_time is not None:
                self.metrics.record_inter_token(now - m.last_token_time)
            m.last_token_time = now
            if seq.is_finished:
                outputs.append(self._output(seq))
                self._forget(seq)
                self.metrics.record_finished(seq.finish_reason or "stop", now - m.arrival_time)
            elif seq.sampling_params.output_kind is RequestOutputKind.CUMULATIVE:
                outputs.append(self._output(seq))
        prompt_tokens = sum(
            max(0, min(it.num_computed_before + it.num_new_tokens, it.seq.num_prompt_tokens) - it.num_computed_before)
            for it in sched_out.scheduled
        )
        self._record_step(prompt_tokens, num_generated)
        if self.proposer is not None:
            self._propose()
        return outputs

    def _propose(self) -> None:
        """Proposals for the next step, for every running request that is decoding (its K/V
        cover all but the last token) and for which the policy says speculation pays; with
        prompt_lookup, n-gram lookup's where it finds a match, the proposer's elsewhere."""
        assert self.proposer is not None and self.spec_policy is not None
        running = self.scheduler.running
        ready = [s for s in running if not s.spec_token_ids and s.num_computed_tokens == s.num_tokens - 1]
        if self.lookup is not None and self.lookup_policy is not None:
            self._propose_with(self.lookup, self.lookup_policy, ready, len(running), by_lookup=True)
            ready = [s for s in ready if not s.spec_token_ids]
        self._propose_with(self.proposer, self.spec_policy, ready, len(running), by_lookup=False)

    def _propose_with(self, proposer: Proposer, policy: SpeculationPolicy, ready: list[Sequence], batch_size: int,
                      by_lookup: bool) -> None:
        seqs, ks = [], []
        for seq in ready:
            k = policy.num_tokens(seq, batch_size)
            if k > 0:
                seqs.append(seq)
                ks.append(k)
        if not seqs:
            return
        start = time.perf_counter()
        proposals = proposer.propose(seqs, ks)
        # The policy's cost model: one proposal position (a draft pass over the batch, or the
        # n-gram lookups) relative to the target step that just ran.
        policy.observe_cost((time.perf_counter() - start) / max(ks) / max(self._last_step_seconds, 1e-6))
        for seq, proposal in zip(seqs, proposals, strict=True):
            seq.spec_token_ids = proposal.token_ids
            seq.spec_draft_probs = proposal.draft_probs
            seq.spec_by_lookup = by_lookup

    def _forget(self, seq: Sequence) -> None:
        """Drop per-request state once a request is finished or aborted (its blocks are already free)."""
        self.detokenizers.pop(seq.request_id, None)
        if self.proposer is not None and self.spec_policy is not None:
            self.proposer.free(seq.request_id)
            self.spec_policy.free(seq.request_id)
        if self.lookup is not None and self.lookup_policy is not None:
            self.lookup.free(seq.request_id)
            self.lookup_policy.free(seq.request_id)

    def _check_stop(self, seq: Sequence, token_id: int) -> None:
        params = seq.sampling_params
        may_stop = seq.num_output_tokens >= params.min_tokens
        stop_string = self.detokenizers[seq.request_id].append(token_id, check_stop=may_stop)
        reason: tuple[str, int | str | None] | None = None
        by_token = False  # ended by a stop token (end of text, stop_token_ids)
        if may_stop:
            if token_id in params.stop_token_ids:
                reason, by_token = ("stop", token_id), True
            elif not params.ignore_eos and token_id in self.eos_token_ids:
                reason, by_token = ("stop", None), True
            elif stop_string is not None:
                reason = ("stop", stop_string)
        if reason is None and (
            (params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens)
            or seq.num_tokens >= self.max_model_len
        ):
            reason = ("length", None)
        if reason is not None:
            detok = self.detokenizers[seq.request_id]
            if by_token and not params.include_stop_str_in_output:
                detok.drop_last()  # a stop token's text is not the answer's (vLLM's rule)
            if stop_string is None:  # after a stop string the text is cut there
                detok.flush()
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
