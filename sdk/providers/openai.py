"""OpenAI Chat Completions dialect (provider-protocols.md C)."""

from __future__ import annotations

from sdk.requests import upstream_headers
from sdk.types import Endpoint, LLMRequest, Protocol

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIDialect:
    protocol = Protocol.OPENAI

    def path(self, endpoint: Endpoint) -> str:
        return "/embeddings" if endpoint is Endpoint.EMBEDDINGS else "/chat/completions"

    models_path = "/models"

    def auth(self, api_key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"}

    def headers(self, api_key: str, request: LLMRequest) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if request.stream else "application/json",
            **self.auth(api_key),
        }
        headers.update(upstream_headers(request))
        return headers
