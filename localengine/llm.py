"""`LLM`: the offline batch API, vLLM's names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from localengine.config import Config
from localengine.engine.llm_engine import LLMEngine, Prompt
from localengine.outputs import RequestOutput
from localengine.sampling_params import RequestOutputKind, SamplingParams
from localengine.spec_decode.metrics import SpecDecodingStats


class LLM:
    """Load a local model and generate for many prompts at once with continuous batching.

    >>> llm = LLM("demo")
    >>> llm.generate(["def main("], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text
    """

    def __init__(self, model: str, speculative_config: dict[str, Any] | None = None, **kwargs: Any):
        self.llm_engine = LLMEngine(Config(model=model, speculative_config=speculative_config, **kwargs))

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of `prompts`. A list of ints is one tokenized prompt."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompt_list = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(prompt_list)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompt_list):
            raise ValueError("give one SamplingParams, or one per prompt")
        # Only finished outputs are returned: the engine need not build one per request per step.
        params = [p if p.output_kind is RequestOutputKind.FINAL_ONLY else replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
                  for p in params]
        engine = self.llm_engine
        ids: list[str] = []
        try:
            for prompt, p in zip(prompt_list, params, strict=True):
                rid = engine.new_request_id()
                engine.add_request(rid, prompt, p)
                ids.append(rid)
        except Exception:
            engine.abort_request(ids)  # all or nothing: none of this call's prompts stays queued
            raise
        finished: dict[str, RequestOutput] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
        return [finished[rid] for rid in ids]

    def spec_decode_stats(self) -> SpecDecodingStats | None:
        """Speculative decoding totals since start (drafts, draft/accepted tokens, per position,
        mean_acceptance_length, acceptance_rate); None without speculative_config."""
        return self.llm_engine.spec_decode_stats()

    def shutdown(self) -> None:
        """Stop the worker processes of a tensor-parallel engine (they also end with this process)."""
        self.llm_engine.shutdown()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix; running requests keep their blocks."""
        self.llm_engine.block_manager.reset_prefix_cache()

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: one conversation (a list of messages) or several, each rendered with the
        model's chat template; one output per conversation, in order."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.llm_engine.tokenizer
        # The template holds any BOS the model wants: the rendered text is tokenized without adding one.
        prompts: list[Prompt] = [
            tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False),
                             add_special_tokens=False)
            for c in conversations]
        return self.generate(prompts, sampling_params)
