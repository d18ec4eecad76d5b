"""Team policies: one YAML file per team, validated by pydantic; unknown keys are errors.

Every key is documented in policies/README.md. Loading errors name the file, the key path and what
was expected, so `slipstream policy check` output can be acted on directly.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sdk.compression.protection import DEFAULT_PROTECT, ProtectKind
from sdk.errors import PolicyError
from sdk.policy_advice import did_you_mean, keys_at


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Strict):
    """A secret given by environment variable name or, for tests and the emulator, literally."""

    env: str | None = None
    value: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.value is None):
            raise ValueError("give exactly one of 'env' (an environment variable name) or 'value'")
        return self

    def resolve(self) -> str | None:
        return os.environ.get(self.env) if self.env else self.value


class SpeculativePolicy(_Strict):
    """Speculative decoding for an in-process local engine (vLLM's `speculative_config` keys)."""

    method: Literal["ngram", "draft_model", "mlp_speculator"]
    num_speculative_tokens: Annotated[int, Field(ge=1, le=32)] = 4
    # draft_model: a local HF directory or "demo-draft"; mlp_speculator: a speculator checkpoint
    # trained on the target's hidden states, "demo-speculator", or one built on first use
    # ("smollm2-135m-instruct-speculator", localengine/spec_decode/built.py)
    model: str | None = None
    # mlp_speculator: n-gram lookup proposes where the context repeats, the speculator elsewhere
    # (None: off, and left out of the engine's arguments, which key the shared engines)
    prompt_lookup: bool | None = None

    @model_validator(mode="after")
    def _draft_needs_model(self) -> SpeculativePolicy:
        if self.method != "ngram" and not self.model:
            raise ValueError(f"method '{self.method}' needs 'model' (a local directory, 'demo-draft' or 'demo-speculator')")
        if self.prompt_lookup and self.method != "mlp_speculator":
            raise ValueError("prompt_lookup combines n-gram lookup with method 'mlp_speculator' only")
        return self


class ProviderConfig(_Strict):
    kind: Literal["anthropic", "openai", "local"]
    base_url: str | None = None
    api_key_env: str | list[str] | None = None  # several: a 429 or refused key moves a call to the next
    api_key: str | list[str] | None = None
    model: str | None = None  # local: model path or "demo" (in process), or the served model's name (base_url)
    speculative: SpeculativePolicy | None = None  # local, in process only
    # local, in process only: the output cap of a request that names none (None: up to the context,
    # as vLLM; `slipstream engine serve --override-generation-config '{"max_new_tokens": N}'`)
    default_max_tokens: Annotated[int, Field(gt=0)] | None = None
    # openai: how the upstream serves POST /responses (native, native until a 404, or translated to Chat)
    responses: Literal["auto", "native", "chat"] | None = None
    connect_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    first_byte_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    read_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    # Egress (sdk/providers/egress.py): an http:// proxy URL or "direct" (None: HTTPS_PROXY/HTTP_PROXY/
    # ALL_PROXY/NO_PROXY from the environment), CAs to trust instead of the system's, a client certificate.
    proxy: Annotated[str, Field(pattern=r"^(direct|http://\S+)$")] | None = None
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    # Most connections this team holds to the provider's origin at once (None: a quarter of the
    # pool's 1,000 per origin), so that one team's streams cannot take every connection.
    max_connections: Annotated[int, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _one_key_source(self) -> ProviderConfig:
        if self.api_key_env and self.api_key:
            raise ValueError("give either 'api_key_env' or 'api_key', not both")
        if self.speculative is not None and (self.kind != "local" or self.base_url):
            raise ValueError("'speculative' applies to an in-process local engine (kind: local, no base_url)")
        if self.default_max_tokens is not None and (self.kind != "local" or self.base_url):
            raise ValueError("'default_max_tokens' applies to an in-process local engine (kind: local, no base_url)")
        if self.responses is not None and self.kind != "openai":
            raise ValueError("'responses' applies to kind: openai (other kinds always serve the Responses API translated)")
        if self.kind == "local" and (self.api_key_env or self.api_key) and not self.base_url:
            raise ValueError("an in-process local provider takes no api key (give base_url to reach a server)")
        if self.client_key and not self.client_cert:
            raise ValueError("'client_key' needs 'client_cert'")
        return self

    def resolve_api_keys(self) -> tuple[str, ...]:
        """The keys that are set, in the policy's order (an unset environment variable is skipped)."""
        if self.api_key_env:
            names = [self.api_key_env] if isinstance(self.api_key_env, str) else self.api_key_env
            values = [os.environ.get(name) for name in names]
        else:
            values = [self.api_key] if isinstance(self.api_key, str) else list(self.api_key or [])
        return tuple(value for value in values if value)


_GLOB = frozenset("*?[")


FINE_TUNED = "ft:"  # OpenAI's fine-tuned models: ft:BASE:ORG:SUFFIX:ID


def is_glob(pattern: str) -> bool:
    """Whether a model pattern (a route's `match.model`, a `pricing:` key: shell-style globs) can
    match more than the one name it spells."""
    return not _GLOB.isdisjoint(pattern)


class RouteMatch(_Strict):
    model: str = "*"  # shell-style glob on the requested model name

    def matches(self, model: str) -> bool:
        return fnmatch.fnmatchcase(model, self.model)


class Target(_Strict):
    provider: str
    model: str | None = None  # None: the model the client asked for
    weight: Annotated[float, Field(gt=0)] = 1.0  # share of traffic under strategy "weighted"


class Route(_Strict):
    """Keys documented in docs/routing.md."""

    match: RouteMatch = RouteMatch()
    targets: Annotated[list[Target], Field(min_length=1)]
    strategy: Literal["priority", "weighted", "lowest_latency", "least_busy", "prefix_affinity"] = "priority"


class RetryPolicy(_Strict):
    """Keys documented in docs/routing.md."""

    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3  # per target
    base_delay_ms: Annotated[int, Field(ge=0)] = 250
    max_delay_ms: Annotated[int, Field(ge=0)] = 8000
    honor_retry_after: bool = True  # also retry-after-ms and x-should-retry
    deadline_ms: Annotated[int, Field(gt=0)] | None = None  # whole request, every attempt and wait included
    first_byte_timeout_ms: Annotated[int, Field(gt=0)] | None = None  # per attempt: abandon a stalled target


class BreakerPolicy(_Strict):
    """Per-target circuit breaker; keys documented in docs/routing.md."""

    enabled: bool = True
    window_s: Annotated[float, Field(gt=0)] = 30.0
    min_requests: Annotated[int, Field(ge=1)] = 10
    failure_rate: Annotated[float, Field(gt=0, le=1)] = 0.5
    cooldown_s: Annotated[float, Field(gt=0)] = 5.0


class HedgingPolicy(_Strict):
    """Opt-in hedged requests; keys documented in docs/routing.md."""

    enabled: bool = False
    delay_ms: Annotated[int, Field(gt=0)] | None = None  # None: the target's observed p95 time to first byte
    default_delay_ms: Annotated[int, Field(gt=0)] = 1000  # until enough samples exist for a p95
    min_samples: Annotated[int, Field(ge=1)] = 20
    max_legs: Annotated[int, Field(ge=2, le=4)] = 2  # attempts of one request running at once


class RateLimits(_Strict):
    """Token buckets and a concurrency cap; None leaves that limit off."""

    requests_per_minute: Annotated[int, Field(gt=0)] | None = None
    tokens_per_minute: Annotated[int, Field(gt=0)] | None = None
    max_concurrent: Annotated[int, Field(gt=0)] | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.requests_per_minute, self.tokens_per_minute, self.max_concurrent))


class PromptCachePolicy(_Strict):
    """Prompt-cache optimizer; every key is documented in docs/prompt-cache.md."""

    enabled: bool = True
    reorder: bool = False  # move volatile system-prompt lines to the latest user turn (changes where the model reads them)
    breakpoints: Literal["auto", "client", "off"] = "auto"
    ttl: Literal["5m", "1h"] = "5m"  # breakpoints on the static prefix (tools, system, documents)
    tail_ttl: Literal["5m", "1h"] = "5m"  # rolling breakpoints on the conversation
    canonicalize: bool = True  # sort keys of tool schemas and tool inputs
    learn_volatile: bool = True  # learn from traffic which system-prompt lines vary within a conversation
    openai_cache_key: bool = True  # set prompt_cache_key from team + stable prefix when the client did not
    isolate: bool = False  # a per-team salt line leads the cached prefix: no cache entry is shared with another team
    warm_fanout: bool = False  # hold requests sharing a prefix being written until its writer's first byte
    fanout_max_wait_ms: Annotated[int, Field(gt=0, le=600_000)] = 5000


class SemanticCachePolicy(_Strict):
    """Response cache (exact + semantic tiers); every key is documented in docs/semantic-cache.md."""

    enabled: bool = False
    exact: bool = True  # serve byte-for-byte equivalent requests (canonical hash)
    semantic: bool = True  # serve paraphrases of the latest user turn, through the verifier
    min_precision: Annotated[float, Field(gt=0, le=1)] = 0.95  # a request may raise it, never lower it
    ttl_s: Annotated[float, Field(gt=0)] = 86_400.0
    max_entries: Annotated[int, Field(ge=1)] = 10_000  # per team; least recently used evicted first
    max_bytes: Annotated[int, Field(ge=1)] = 256 * 1024 * 1024  # per team
    max_turns_for_semantic: Annotated[int, Field(ge=1)] = 3  # user turns; longer conversations: exact tier only
    cache_sampled: bool = False  # cache answers to temperature > 0 (or unset) requests
    cache_tool_calls: bool = False  # cache answers that call tools


class EmbeddingCachePolicy(_Strict):
    """Exact cache of `/v1/embeddings` vectors per input item (always safe: embeddings are deterministic)."""

    enabled: bool = True
    ttl_s: Annotated[float, Field(gt=0)] = 7 * 86_400.0
    max_entries: Annotated[int, Field(ge=1)] = 100_000  # per team; least recently used evicted first
    max_bytes: Annotated[int, Field(ge=1)] = 128 * 1024 * 1024  # per team, counting the vectors' JSON


class ModelsPolicy(_Strict):
    """What `GET /v1/models` lists beyond the names the routes spell out."""

    upstream_lists: bool = True  # for glob routes, list the upstreams' own models that the glob matches
    ttl_s: Annotated[float, Field(gt=0)] = 300.0  # how long an upstream's list is reused


class DocumentCompression(_Strict):
    """Query-aware extractive pruning of documents; keys documented in docs/compression.md."""

    enabled: bool = True
    min_tokens: Annotated[int, Field(ge=1)] = 400  # smaller documents are left alone
    ratio: Annotated[float, Field(gt=0, le=1)] = 0.4  # share of a piece's prose tokens kept (code always kept)
    max_tokens: Annotated[int, Field(ge=1)] | None = None  # and at most this many tokens per document
    scorer: Literal["static", "contextual"] = "static"
    neighbours: bool = True  # keep the sentence before one that refers back ("It", "This", "However", ...)
    marker: str = "[…]"  # replaces each run of dropped sentences


class HistoryCompression(_Strict):
    """Summaries of older turns, computed in the background; keys documented in docs/compression.md."""

    enabled: bool = False
    trigger_tokens: Annotated[int, Field(ge=1)] = 8000  # messages (or the verbatim tail after a summary) above this
    keep_turns: Annotated[int, Field(ge=1)] = 2  # latest user turns (and what follows them) kept verbatim


class TokenPruning(_Strict):
    """Drop low-surprisal tokens from documents with the local demo model; docs/compression.md."""

    enabled: bool = False
    ratio: Annotated[float, Field(gt=0, le=1)] = 0.8  # share of a document's prose tokens kept


class Summarizer(_Strict):
    provider: str  # one of the team's providers
    model: str | None = None  # required for hosted providers; a local provider uses its own model
    max_tokens: Annotated[int, Field(ge=16, le=8192)] = 512


class CompressionPolicy(_Strict):
    """Prompt compression (opt-in: it changes what the model sees); docs/compression.md."""

    enabled: bool = False
    documents: DocumentCompression = DocumentCompression()
    history: HistoryCompression = HistoryCompression()
    token_pruning: TokenPruning = TokenPruning()
    # Where material is looked for (docs/compression.md, "Where the material is").
    scope: list[Literal["system", "earlier_turns", "latest_turn"]] = ["system", "earlier_turns", "latest_turn"]
    protect: list[ProtectKind] = list(DEFAULT_PROTECT)
    summarizer: Summarizer | None = None

    @model_validator(mode="after")
    def _summarizer_for_history(self) -> CompressionPolicy:
        if self.history.enabled and self.summarizer is None:
            raise ValueError("history compaction needs a 'summarizer' ({provider: NAME, model: MODEL})")
        return self


class LimitsPolicy(RateLimits):
    """Team-wide rate limits, plus `per_key` for each team key alone (docs/routing.md)."""

    max_body_bytes: Annotated[int, Field(gt=0)] = 32 * 1024 * 1024  # Anthropic's own limit
    max_upload_bytes: Annotated[int, Field(gt=0)] = 512 * 1024 * 1024  # pass-through bodies (files): OpenAI's file limit
    per_key: RateLimits = RateLimits()


class Price(_Strict):
    """USD per million tokens, per 1,000 web and file searches the provider runs, and per image its
    image generation tool makes (docs/spend.md)."""

    input: Annotated[float, Field(ge=0)]
    output: Annotated[float, Field(ge=0)]
    cache_read: Annotated[float, Field(ge=0)] | None = None  # None: the input price
    cache_write: Annotated[float, Field(ge=0)] | None = None  # None: the input price
    cache_write_1h: Annotated[float, Field(ge=0)] | None = None  # Anthropic's 1-hour writes; None: the cache_write price
    web_search: Annotated[float, Field(ge=0)] = 10.0  # per 1,000 searches: both providers' base rate
    file_search: Annotated[float, Field(ge=0)] = 2.5  # per 1,000 calls of OpenAI's file search tool
    # USD per image of the Responses API's image generation tool (billed at the image model's rates, by
    # quality and size); None: not priced (a budgeted team is refused the tool)
    image_generation: Annotated[float, Field(ge=0)] | None = None
    # USD per container the Responses API's code interpreter runs code in (billed per container session,
    # by its memory: $0.03 for 1 GB to $1.92 for 64 GB); None: not priced (a budgeted team is refused the tool)
    code_interpreter: Annotated[float, Field(ge=0)] | None = None
    # Token prices times these where OpenAI says the answer was served on its priority or flex tier
    priority: Annotated[float, Field(ge=0)] = 2.0
    flex: Annotated[float, Field(ge=0)] = 0.5
    # Token prices times this for Anthropic's fast mode; None: not priced (a budgeted team is refused it)
    fast: Annotated[float, Field(ge=0)] | None = None
    us_only: Annotated[float, Field(ge=0)] = 1.1  # token prices times this where Anthropic ran it in the US only (inference_geo)
    # Above this many input tokens (cached ones included) a request is billed at long-context rates:
    # input-side prices times long_input, output times long_output (Claude Sonnet 4.x, Opus 4.6 with 1M context)
    long_context_from: Annotated[int, Field(gt=0)] | None = None
    long_input: Annotated[float, Field(ge=0)] = 2.0
    long_output: Annotated[float, Field(ge=0)] = 1.5

    @model_validator(mode="after")
    def _cache_default_to_input(self) -> Price:
        if self.cache_read is None:
            object.__setattr__(self, "cache_read", self.input)
        if self.cache_write is None:
            object.__setattr__(self, "cache_write", self.input)
        if self.cache_write_1h is None:
            object.__setattr__(self, "cache_write_1h", self.cache_write)
        return self


class BudgetPolicy(_Strict):
    """A team's spend limit per UTC day or month; over it, calls are refused with a 429 (docs/spend.md)."""

    usd: Annotated[float, Field(gt=0)]
    period: Literal["day", "month"] = "month"


class ResponsesStorePolicy(_Strict):
    """The team's share of the Responses API store (stored responses, sdk/responses/store.py). Over a
    quota the team's least recently used responses are evicted; a single conversation larger than the
    quota is refused (400) before it is sent."""

    max_entries: Annotated[int, Field(ge=1)] = 100_000  # stored responses
    max_bytes: Annotated[int, Field(ge=1)] = 1024 * 1024 * 1024  # their own input items and response objects
    ttl_s: Annotated[float, Field(gt=0)] = 30 * 86_400.0  # retention, counted from a conversation's last turn


class AlertsPolicy(_Strict):
    """Latency thresholds in ms; crossing one logs a warning and counts slipstream_latency_alerts_total."""

    window: Annotated[int, Field(ge=10)] = 200  # requests in the rolling window
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p95_ms: float | None = None
    e2e_p99_ms: float | None = None


class Policy(_Strict):
    team: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]
    api_keys: list[SecretRef] = []
    providers: Annotated[dict[str, ProviderConfig], Field(min_length=1)]
    routes: Annotated[list[Route], Field(min_length=1)]
    retry: RetryPolicy = RetryPolicy()
    breaker: BreakerPolicy = BreakerPolicy()
    hedging: HedgingPolicy = HedgingPolicy()
    prompt_cache: PromptCachePolicy = PromptCachePolicy()
    semantic_cache: SemanticCachePolicy = SemanticCachePolicy()
    embedding_cache: EmbeddingCachePolicy = EmbeddingCachePolicy()
    models: ModelsPolicy = ModelsPolicy()
    compression: CompressionPolicy = CompressionPolicy()
    limits: LimitsPolicy = LimitsPolicy()
    alerts: AlertsPolicy = AlertsPolicy()
    pricing: dict[str, Price] = {}  # model glob → price, searched before the built-in table
    budget: BudgetPolicy | None = None
    responses_store: ResponsesStorePolicy = ResponsesStorePolicy()
    # ids of objects made on the provider account without the gateway (vector stores, conversations,
    # containers, stored prompts, skills, fine-tuned models) this team may name; "*": the account is the team's alone
    provider_objects: list[Annotated[str, Field(min_length=1)]] = []

    @model_validator(mode="after")
    def _targets_exist(self) -> Policy:
        for i, route in enumerate(self.routes):
            for j, target in enumerate(route.targets):
                if target.provider not in self.providers:
                    known = ", ".join(sorted(self.providers))
                    hint = did_you_mean(target.provider, list(self.providers))
                    raise ValueError(f"routes.{i}.targets.{j}.provider: unknown provider {target.provider!r}{hint} (known: {known})")
        return self

    @model_validator(mode="after")
    def _summarizer_exists(self) -> Policy:
        summarizer = self.compression.summarizer
        if summarizer is not None:
            provider = self.providers.get(summarizer.provider)
            if provider is None:
                known = ", ".join(sorted(self.providers))
                raise ValueError(f"compression.summarizer.provider: unknown provider {summarizer.provider!r} (known: {known})")
            if provider.kind != "local" and summarizer.model is None:
                raise ValueError("compression.summarizer.model: a hosted provider needs a model name")
        return self

    def route_for(self, model: str) -> Route | None:
        """The first route whose match takes `model` (the router's order); None where none does."""
        return next((route for route in self.routes if route.match.matches(model)), None)

    def usable_objects(self) -> frozenset[str]:
        """The provider-account objects this team may name: `provider_objects`, and the fine-tuned
        models (`ft:…`) a route or target spells out."""
        named = {model for route in self.routes for model in (route.match.model, *(t.model for t in route.targets)) if model}
        return frozenset(self.provider_objects) | {model for model in named if model.startswith(FINE_TUNED)}

    def resolved_keys(self) -> list[str]:
        return [key for ref in self.api_keys if (key := ref.resolve())]


def _format_errors(path: Path, error: ValidationError) -> str:
    """One line per error: file, key path, what was expected. Never the value that was given: a
    policy holds team keys and provider keys, and this text goes to logs and terminals."""
    lines = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            hint = did_you_mean(str(item["loc"][-1]), keys_at(Policy, item["loc"][:-1]))
            message = f"unknown key{hint} (see policies/README.md for the keys a policy takes)"
        elif item["type"] == "model_type":  # pydantic says "instance of SecretRef": name the keys instead
            keys = keys_at(Policy, item["loc"])
            listed = f"keys: {', '.join(keys)}" if len(keys) <= 4 else "see policies/README.md for its keys"
            message = f"expected a mapping ({listed}), got {_kind(item.get('input'))}"
        elif "expected" not in message and item["type"] not in ("value_error", "missing"):
            message = f"{message} (got {_kind(item.get('input'))})"  # the kind of value, never the value
        lines.append(f"{path}: {where}: {message.removeprefix('Value error, ')}")
    return "\n".join(lines)


def _kind(value: object) -> str:
    kinds = {str: "a string", bool: "true/false", int: "a number", float: "a number", list: "a list", dict: "a mapping"}
    return "nothing" if value is None else kinds.get(type(value), type(value).__name__)


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """Where the YAML breaks and why, without the snippet of the file PyYAML would quote (it may be a key)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or "cannot be parsed"
    return f"{path}: not valid YAML{where}: {problem}"


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and validate one policy file; raises PolicyError with a clear message."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{path}: not UTF-8 text (byte {exc.start} cannot be decoded)") from None
    except yaml.YAMLError as exc:
        raise PolicyError(_yaml_error(path, exc)) from None
    if not isinstance(raw, dict):
        raise PolicyError(f"{path}: expected a mapping of policy keys at the top level")
    try:
        return Policy.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(_format_errors(path, exc)) from None


def policy_files(paths: Sequence[str | Path]) -> list[Path]:
    """Expand directories to their *.yaml / *.yml files, sorted for a stable order."""
    files: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            files.extend(sorted(p for p in entry.iterdir() if p.suffix in (".yaml", ".yml")))
        else:
            files.append(entry)
    return files


def load_policies(paths: Sequence[str | Path]) -> dict[Path, Policy]:
    """Load every policy; collects all errors, and checks team names and keys are unique."""
    policies: dict[Path, Policy] = {}
    errors: list[str] = []
    files = policy_files(paths)
    if not files:
        raise PolicyError(f"no policy files (*.yaml) found in {', '.join(map(str, paths))}")
    for file in files:
        try:
            policies[file] = load_policy(file)
        except PolicyError as exc:
            errors.append(str(exc))
    teams: dict[str, Path] = {}
    keys: dict[str, Path] = {}
    for file, policy in policies.items():
        if policy.team in teams:
            errors.append(f"{file}: team: {policy.team!r} is already defined in {teams[policy.team]}")
        teams[policy.team] = file
        for key in policy.resolved_keys():
            if key in keys and keys[key] != file:
                errors.append(f"{file}: api_keys: a key is also used by {keys[key]}; each key must name one team")
            keys[key] = file
    if errors:
        raise PolicyError("\n".join(errors))
    return policies
