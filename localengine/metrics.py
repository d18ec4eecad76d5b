"""Prometheus metrics with vLLM's names, one registry per engine.

Counters are exported by prometheus_client with a `_total` suffix (vllm:num_preemptions_total),
exactly as vLLM exposes them, so existing vLLM dashboards read these unchanged.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)


class EngineMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV cache usage, 1 = full", labels, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens", labels, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions (by recompute)", labels, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", labels, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests", labels + ["finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency", labels,
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", labels,
                             buckets=_E2E_BUCKETS, registry=r)
        self.model_name = model_name
        self._last = {"queries": 0, "hits": 0, "preemptions": 0}
        # Children bound once: `labels()` is a locked dict lookup, paid per request per step otherwise.
        self._ttft, self._itl, self._e2e = self.ttft.labels(model_name), self.itl.labels(model_name), self.e2e.labels(model_name)
        self._running, self._waiting = self.running.labels(model_name), self.waiting.labels(model_name)
        self._kv_usage, self._generation = self.kv_usage.labels(model_name), self.generation_tokens.labels(model_name)

    def _inc_to(self, key: str, counter: Counter, total: int) -> None:
        delta = total - self._last[key]
        if delta > 0:
            counter.labels(self.model_name).inc(delta)
        self._last[key] = total

    def record_step(self, *, running: int, waiting: int, kv_usage: float, prefix_queries: int,
                    prefix_hits: int, preemptions: int, prompt_tokens: int, generation_tokens: int) -> None:
        self._running.set(running)
        self._waiting.set(waiting)
        self._kv_usage.set(kv_usage)
        self._inc_to("queries", self.prefix_queries, prefix_queries)
        self._inc_to("hits", self.prefix_hits, prefix_hits)
        self._inc_to("preemptions", self.preemptions, preemptions)
        if prompt_tokens:
            self.prompt_tokens.labels(self.model_name).inc(prompt_tokens)
        if generation_tokens:
            self._generation.inc(generation_tokens)

    def record_first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def record_inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def record_finished(self, reason: str, e2e_seconds: float) -> None:
        self.success.labels(self.model_name, reason).inc()
        self._e2e.observe(e2e_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
