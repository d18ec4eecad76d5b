"""The embedding cache stage: answer `/v1/embeddings` items from the exact cache, send only the rest.

A batch is looked up item by item. Items already cached are not sent again: the request that goes
upstream carries only the missing ones (each distinct item once), and the answer is reassembled in
the client's order. Usage is what this request cost upstream: the missing items' tokens, zero on a
full hit. Vectors are stored only when the target that answered computed them with the model the
client named (a fallback target with another `model:` is another vector space); when such a target
answers a batch that was partly cached, the whole batch is sent again so one answer never mixes
two models' vectors.

`x-slipstream-cache` is `exact-hit` when every item came from the cache; `x-slipstream-embedding-cache`
says `hits=H;misses=M` (items) whenever the cache was consulted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from sdk.cache.embeddings import EmbeddingCache, EmbeddingCacheLimits, StoredVector, item_key
from sdk.observability import metrics
from sdk.offload import off_loop_if_large
from sdk.pipeline import Handler, RequestContext
from sdk.policy import Policy
from sdk.services import Services
from sdk.types import Answer, Endpoint, LLMRequest, LLMResponse, Usage

ITEMS_HEADER = "x-slipstream-embedding-cache"


def input_items(value: Any) -> tuple[list[Any], bool]:
    """The request's items, and whether `input` was a list of them (not one string or one token list)."""
    if isinstance(value, list) and value and not isinstance(value[0], int):
        return value, True
    return [value], False


class EmbeddingCacheStage:
    name = "embedding_cache"

    def __init__(self, team: str, limits: EmbeddingCacheLimits, cache: EmbeddingCache):
        self.team = team
        self.limits = limits
        self.cache = cache
        self.counted = {outcome: metrics.EMBEDDING_CACHE.labels(team, outcome) for outcome in ("hit", "miss")}

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer:
        request = ctx.request
        if request.endpoint is not Endpoint.EMBEDDINGS:
            return await call_next(ctx)
        trace = ctx.trace
        started = time.time_ns() if trace is not None else 0
        body = request.body
        items, listed = input_items(body["input"])
        encoding = body.get("encoding_format") or "float"
        # Hashing a large request's items, and reading and writing a large answer's vectors (2,048 inputs of
        # one word ask for 2,048 vectors of up to 3,072 floats: about 67 MB of JSON, a second to read), run
        # in the heavy-work pool as the team's work, not on the loop every team's requests share.
        keys = await off_loop_if_large(request.size, _keys, request.model, items, body.get("dimensions"), encoding)
        found = self.cache.get_many(self.team, keys)
        missing: dict[bytes, Any] = {}  # key -> item, each distinct missing item once, in order
        for key, item, entry in zip(keys, items, found, strict=True):
            if entry is None:
                missing.setdefault(key, item)
        hits = len(items) - sum(entry is None for entry in found)
        self.counted["hit"].inc(hits)
        self.counted["miss"].inc(len(items) - hits)
        header = {ITEMS_HEADER: f"hits={hits};misses={len(items) - hits}"}
        if trace is not None:
            trace.stage("embedding_cache lookup", started, {"slipstream.embedding_cache.hits": hits,
                                                            "slipstream.embedding_cache.misses": len(items) - hits})
        if not missing:
            ctx.cache_status = "exact-hit"
            ctx.route = f"cache/{found[0].route}"  # type: ignore[union-attr]
            hit = await off_loop_if_large(_size(found), _body, found, "", 0)  # type: ignore[arg-type]
            return LLMResponse(200, hit, header, Usage(), ctx.route)
        narrowed = len(missing) < len(items)  # some items cached, or repeated within the batch
        if narrowed:
            ctx.request = LLMRequest(request.endpoint, {**body, "input": list(missing.values()) if listed else items[0]},
                                     request.forward_headers, request.query)
        answer = await call_next(ctx)
        if not isinstance(answer, LLMResponse) or answer.status != 200:
            return answer
        answer.headers.update(header)
        same_model = answer.route.partition("/")[2] == request.model
        computed = await off_loop_if_large(len(answer.body), _vectors, answer.body, len(missing))
        if computed is None:
            return answer  # not the shape we know: the client gets it as it is, nothing is stored
        model, vectors, tokens = computed
        if same_model:
            self.cache.put_many(self.team, list(zip(missing, vectors, strict=True)), model, answer.route, self.limits)
        if not narrowed:
            return answer  # nothing was cached or repeated: the provider's bytes as they are
        if not same_model and hits:
            ctx.request = request
            return await call_next(ctx)
        fresh = dict(zip(missing, vectors, strict=True))
        merged = [entry or StoredVector(fresh[key], model, answer.route, 0.0) for key, entry in zip(keys, found, strict=True)]
        answer.body = await off_loop_if_large(_size(merged), _body, merged, model, tokens)
        return answer


def _keys(model: str, items: list[Any], dimensions: Any, encoding: str) -> list[bytes]:
    return [item_key(model, item, dimensions, encoding) for item in items]


def _size(entries: Sequence[StoredVector | None]) -> int:
    """The bytes of the vectors an answer is written from."""
    return sum(len(entry.embedding) for entry in entries if entry is not None)


def _vectors(raw: bytes, expected: int) -> tuple[str, list[bytes], int] | None:
    """(model, each item's `embedding` JSON in input order, prompt tokens) of a provider's answer."""
    try:
        data = orjson.loads(raw)
        items = sorted(data["data"], key=lambda item: item["index"])
        if len(items) != expected:
            return None
        tokens = data.get("usage", {}).get("prompt_tokens", 0)
        return str(data.get("model", "")), [orjson.dumps(item["embedding"]) for item in items], int(tokens)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
        return None


def _body(entries: list[StoredVector], model: str, tokens: int) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": orjson.Fragment(e.embedding)} for i, e in enumerate(entries)]
    return orjson.dumps({"object": "list", "data": data, "model": model or entries[0].model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def build_embedding_cache(policy: Policy, services: Services) -> EmbeddingCacheStage | None:
    config = policy.embedding_cache
    if not config.enabled:
        return None
    limits = EmbeddingCacheLimits(config.ttl_s, config.max_entries, config.max_bytes)
    return EmbeddingCacheStage(policy.team, limits, services.embedding_cache())
