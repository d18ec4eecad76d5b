"""Anthropic Messages API dialect (Anthropic's API docs, api/messages)."""

from __future__ import annotations

from sdk.requests import upstream_headers
from sdk.types import Endpoint, LLMRequest, Protocol

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"


class AnthropicDialect:
    protocol = Protocol.ANTHROPIC

    def path(self, endpoint: Endpoint) -> str:
        return "/v1/messages/count_tokens" if endpoint is Endpoint.COUNT_TOKENS else "/v1/messages"

    models_path = "/v1/models"

    def auth(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key, "anthropic-version": DEFAULT_VERSION}

    def headers(self, api_key: str, request: LLMRequest) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if request.stream else "application/json",
            **self.auth(api_key),
        }
        headers.update(upstream_headers(request))
        return headers
