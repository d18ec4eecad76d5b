"""Slipstream's bundled inference engine: paged KV cache, prefix caching, continuous batching.

    from localengine import LLM, SamplingParams
    llm = LLM("demo")                       # or a local Hugging Face directory
    outputs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=16))
"""

from localengine.engine.async_engine import AsyncLLMEngine
from localengine.llm import LLM
from localengine.outputs import CompletionOutput, Logprob, RequestOutput
from localengine.sampling_params import RequestOutputKind, SamplingParams

__all__ = ["LLM", "AsyncLLMEngine", "CompletionOutput", "Logprob", "RequestOutput", "RequestOutputKind",
           "SamplingParams"]
