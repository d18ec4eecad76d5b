"""OpenAI dialect: Chat Completions and the Responses API (OpenAI's API reference)."""

from __future__ import annotations

from typing import Literal

from sdk.requests import upstream_headers
from sdk.types import Endpoint, LLMRequest, Protocol

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_PATHS = {Endpoint.CHAT_COMPLETIONS: "/chat/completions", Endpoint.EMBEDDINGS: "/embeddings", Endpoint.RESPONSES: "/responses",
          Endpoint.RESPONSES_INPUT_TOKENS: "/responses/input_tokens", Endpoint.RESPONSES_COMPACT: "/responses/compact"}


ResponsesMode = Literal["native", "auto", "chat"]


class OpenAIDialect:
    """`responses`: how the upstream serves POST /responses — natively, natively until it answers
    404 (`auto`), or not at all (`chat`: Responses requests are translated to Chat Completions)."""

    protocol = Protocol.OPENAI

    def __init__(self, responses: ResponsesMode = "auto"):
        self.responses = responses

    def path(self, endpoint: Endpoint) -> str:
        return _PATHS[endpoint]

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
