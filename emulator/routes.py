"""Which handler answers which method and path, and whose error shape an unrouted or failed
request gets."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from . import (
    anthropic,
    anthropic_batches,
    batches,
    completions,
    conversations,
    embeddings,
    files,
    models,
    openai,
    responses,
    responses_store,
)
from .asgi import Call

if TYPE_CHECKING:
    from .app import Emulator

Handler = Callable[["Emulator", Call], Awaitable[None]]

_ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/messages"): anthropic.messages,
    ("POST", "/v1/messages/count_tokens"): anthropic.count_tokens,
    ("POST", "/v1/chat/completions"): openai.chat_completions,
    ("GET", "/v1/models"): models.list_models,
    ("POST", "/v1/responses"): responses.create,
    ("POST", "/v1/responses/input_tokens"): responses.input_tokens,
    ("POST", "/v1/responses/compact"): responses.compact,
    ("POST", "/v1/conversations"): conversations.create,
    ("POST", "/v1/embeddings"): embeddings.embeddings,
    ("POST", "/v1/completions"): completions.completions,
    ("POST", "/v1/files"): files.upload,
    ("GET", "/v1/files"): files.list_files,
    ("POST", "/v1/batches"): batches.create,
    ("GET", "/v1/batches"): batches.list_batches,
    ("POST", "/v1/messages/batches"): anthropic_batches.create,
    ("GET", "/v1/messages/batches"): anthropic_batches.list_batches,
}

# Paths with parameters: (method, pattern, name counted in stats, handler); groups -> call.params.
_PATTERNS: list[tuple[str, re.Pattern[str], str, Handler]] = [
    ("GET", re.compile(r"/v1/models/(.+)"), "/v1/models/{id}", models.retrieve_model),
    ("GET", re.compile(r"/v1/responses/([^/]+)"), "/v1/responses/{id}", responses_store.retrieve),
    ("DELETE", re.compile(r"/v1/responses/([^/]+)"), "/v1/responses/{id}", responses_store.delete),
    ("GET", re.compile(r"/v1/responses/([^/]+)/input_items"), "/v1/responses/{id}/input_items",
     responses_store.input_items),
    ("POST", re.compile(r"/v1/responses/([^/]+)/cancel"), "/v1/responses/{id}/cancel",
     responses_store.cancel),
    ("GET", re.compile(r"/v1/conversations/([^/]+)"), "/v1/conversations/{id}", conversations.retrieve),
    ("GET", re.compile(r"/v1/conversations/([^/]+)/items"), "/v1/conversations/{id}/items", conversations.items),
    ("GET", re.compile(r"/v1/files/([^/]+)"), "/v1/files/{id}", files.retrieve),
    ("DELETE", re.compile(r"/v1/files/([^/]+)"), "/v1/files/{id}", files.delete),
    ("GET", re.compile(r"/v1/files/([^/]+)/content"), "/v1/files/{id}/content", files.content),
    ("GET", re.compile(r"/v1/batches/([^/]+)"), "/v1/batches/{id}", batches.retrieve),
    ("POST", re.compile(r"/v1/batches/([^/]+)/cancel"), "/v1/batches/{id}/cancel", batches.cancel),
    ("GET", re.compile(r"/v1/messages/batches/([^/]+)"), "/v1/messages/batches/{id}",
     anthropic_batches.retrieve),
    ("DELETE", re.compile(r"/v1/messages/batches/([^/]+)"), "/v1/messages/batches/{id}",
     anthropic_batches.delete),
    ("POST", re.compile(r"/v1/messages/batches/([^/]+)/cancel"), "/v1/messages/batches/{id}/cancel",
     anthropic_batches.cancel),
    ("GET", re.compile(r"/v1/messages/batches/([^/]+)/results"), "/v1/messages/batches/{id}/results",
     anthropic_batches.results),
]


def route(method: str, path: str) -> tuple[Handler, str, tuple[str, ...]] | None:
    handler = _ROUTES.get((method, path))
    if handler is not None:
        return handler, path, ()
    for m, pattern, name, h in _PATTERNS:
        if m == method:
            match = pattern.fullmatch(path)
            if match:
                return h, name, match.groups()
    return None


def is_openai_call(call: Call) -> bool:
    """Whose error shape an answer takes: Anthropic for /v1/messages* and requests that carry
    `anthropic-version`, OpenAI for everything else."""
    return not call.path.startswith("/v1/messages") and "anthropic-version" not in call.headers
