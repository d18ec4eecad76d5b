"""Provider adapters, built from a policy's `providers` section."""

from __future__ import annotations

from typing import Any

from sdk.errors import ProviderUnavailableError
from sdk.policy import ProviderConfig
from sdk.providers.anthropic import DEFAULT_BASE_URL as ANTHROPIC_URL
from sdk.providers.anthropic import AnthropicDialect
from sdk.providers.base import HTTPProvider, Provider
from sdk.providers.egress import Egress
from sdk.providers.http1 import Caller
from sdk.providers.keys import KeyRing
from sdk.providers.local import LocalProvider, team_cache_salt
from sdk.providers.openai import DEFAULT_BASE_URL as OPENAI_URL
from sdk.providers.openai import OpenAIDialect
from sdk.providers.upstream import TeamUpstream, Timeouts
from sdk.services import Services
from sdk.types import Answer, LLMRequest, Protocol, Timings


class UnavailableProvider:
    """A provider that cannot serve (no key configured, engine missing): fails over to the next target."""

    def __init__(self, name: str, protocol: Protocol, reason: str):
        self.name = name
        self.protocol = protocol
        self.reason = reason

    async def send(self, request: LLMRequest, timings: Timings) -> Answer:
        raise ProviderUnavailableError(f"provider {self.name!r} is unavailable: {self.reason}")

    async def list_models(self) -> list[dict[str, Any]]:
        return []  # nothing can be called through it


def build_provider(name: str, config: ProviderConfig, services: Services | None = None, team: str | None = None) -> Provider:
    """`team` scopes what a provider shares between teams: the local engine's prefix cache is salted per team."""
    timeouts = Timeouts(config.connect_timeout_s, config.first_byte_timeout_s, config.read_timeout_s)
    if config.kind == "local":
        # In process, or over HTTP to `slipstream engine serve` / any OpenAI-compatible server.
        engine_args = {"speculative_config": config.speculative.model_dump(exclude_none=True)} if config.speculative else None
        keys = config.resolve_api_keys() or ("local",)
        # Over HTTP, the engine every team's requests share: the team's share of the pool's connections to it.
        return LocalProvider(name, config.model or "demo", config.base_url, keys[0], timeouts, engine_args, services,
                             cache_salt=team_cache_salt(team or ""), default_max_tokens=config.default_max_tokens,
                             client=TeamUpstream(Caller(team, config.max_connections)))
    dialect = AnthropicDialect() if config.kind == "anthropic" else OpenAIDialect(config.responses or "auto")
    base_url = (config.base_url or (ANTHROPIC_URL if config.kind == "anthropic" else OPENAI_URL)).rstrip("/")
    keys = config.resolve_api_keys()
    if not keys:
        env = [config.api_key_env] if isinstance(config.api_key_env, str) else config.api_key_env
        where = f"environment variable {' or '.join(env)}" if env else "'api_key' or 'api_key_env'"
        return UnavailableProvider(name, dialect.protocol, f"no API key (set {where})")
    egress = Egress.from_environment(config.proxy, config.ca_bundle, config.client_cert, config.client_key)
    client = TeamUpstream(Caller(team, config.max_connections, egress))  # the team's share of the loop's pool
    return HTTPProvider(name=name, dialect=dialect, base_url=base_url, keys=KeyRing(keys, services.shared_state() if services else None),
                        timeouts=timeouts, client=client,
                        shared_account=services is not None and not services.shared_provider_keys.isdisjoint(keys))
