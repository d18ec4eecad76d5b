"""The models a team may call, for `GET /v1/models` and `GET /v1/models/{id}`.

Explicit names come from the policy: a route whose match is a literal model name, and every
target's own `model`. A glob route (`claude-*`, `*`) names no model, so for each of its targets
that passes the client's model through, the catalog asks that provider for its own list (with the
provider's key) and keeps the entries the glob matches, but fine-tuned models (`ft:…`, made on the
provider account every team sharing the key shares) only where the policy names them. Upstream lists are cached per provider for
`models.ttl_s`; a provider that cannot answer (no key, down) adds nothing and is asked again on the
next listing. Answers are rendered in OpenAI's shape, or Anthropic's when the client is Anthropic's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from sdk.errors import NotFoundError, SlipstreamError, UpstreamHTTPError
from sdk.policy import FINE_TUNED, ModelsPolicy, Route, is_glob
from sdk.providers.base import Provider
from sdk.types import Protocol

log = logging.getLogger("slipstream.models")

_ANTHROPIC_PAGE = 20  # Anthropic's default `limit`


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str
    owned_by: str  # the provider that serves it ("slipstream" for a route's own name)
    created: int = 0  # unix seconds, when the upstream said
    display_name: str = ""

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": self.owned_by}

    def anthropic(self) -> dict[str, Any]:
        created_at = datetime.fromtimestamp(self.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"type": "model", "id": self.id, "display_name": self.display_name or self.id, "created_at": created_at}


def _from_upstream(entry: dict[str, Any], provider: str) -> ModelInfo:
    created = entry.get("created")
    if not isinstance(created, int) and isinstance(entry.get("created_at"), str):
        try:
            created = int(datetime.fromisoformat(entry["created_at"]).timestamp())
        except ValueError:
            created = 0
    display = entry.get("display_name")
    return ModelInfo(entry["id"], provider, created if isinstance(created, int) else 0, display if isinstance(display, str) else "")


class ModelCatalog:
    def __init__(self, routes: list[Route], providers: Mapping[str, Provider], policy: ModelsPolicy, usable: frozenset[str]):
        self.routes = routes
        self.providers = providers
        self.policy = policy
        self.usable = usable  # the account objects the team may name (Policy.usable_objects): its fine-tunes
        self._upstream: dict[str, tuple[float, list[dict[str, Any]]]] = {}  # provider -> (expires, entries)

    def explicit(self) -> list[ModelInfo]:
        """The names the policy itself spells out."""
        found: dict[str, ModelInfo] = {}
        for route in self.routes:
            if not is_glob(route.match.model):
                found.setdefault(route.match.model, ModelInfo(route.match.model, "slipstream"))
            for target in route.targets:
                if target.model:
                    found.setdefault(target.model, ModelInfo(target.model, target.provider))
        return list(found.values())

    async def models(self) -> list[ModelInfo]:
        found = {model.id: model for model in self.explicit()}
        if self.policy.upstream_lists:
            for route in self.routes:
                if not is_glob(route.match.model):
                    continue
                for target in route.targets:
                    if target.model:
                        continue
                    for entry in await self._listed(target.provider):
                        if route.match.matches(entry["id"]) and entry["id"] not in found and self._listable(entry["id"]):
                            found[entry["id"]] = _from_upstream(entry, target.provider)
        return list(found.values())

    async def model(self, model_id: str) -> ModelInfo:
        for model in await self.models():
            if model.id == model_id:
                return model
        raise NotFoundError(f"The model '{model_id}' does not exist or this team's policy does not route to it")

    def _listable(self, model: str) -> bool:
        """Not another team's fine-tune: one on a shared account is listed only where the policy names it."""
        return not model.startswith(FINE_TUNED) or model in self.usable or "*" in self.usable

    async def _listed(self, name: str) -> list[dict[str, Any]]:
        cached = self._upstream.get(name)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            entries = await self.providers[name].list_models()
        except (SlipstreamError, UpstreamHTTPError, ValueError) as exc:  # ValueError: a list that is not JSON
            log.warning("provider %s did not list its models: %s", name, exc)
            return []
        self._upstream[name] = (now + self.policy.ttl_s, entries)
        return entries


def models_body(models: list[ModelInfo], protocol: Protocol, query: Mapping[str, str] | None = None) -> bytes:
    """A `GET /v1/models` answer in the client's provider's shape (Anthropic's is paginated)."""
    if protocol is Protocol.OPENAI:
        return orjson.dumps({"object": "list", "data": [model.openai() for model in models]})
    query = query or {}
    ids = [model.id for model in models]
    start, end = 0, len(models)
    if query.get("after_id") in ids:
        start = ids.index(query["after_id"]) + 1
    if query.get("before_id") in ids:
        end = ids.index(query["before_id"])
    try:
        limit = max(1, min(1000, int(query.get("limit", _ANTHROPIC_PAGE))))
    except ValueError:
        limit = _ANTHROPIC_PAGE
    if "before_id" in query and "after_id" not in query:
        start = max(start, end - limit)
    page = models[start:end][:limit]
    return orjson.dumps({
        "data": [model.anthropic() for model in page],
        "has_more": start + len(page) < end if "before_id" not in query or "after_id" in query else start > 0,
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
    })


def model_body(model: ModelInfo, protocol: Protocol) -> bytes:
    return orjson.dumps(model.anthropic() if protocol is Protocol.ANTHROPIC else model.openai())
