"""What `slipstream policy check` adds to validation: "did you mean" for misspelt keys, and warnings
for a policy that is valid but will not work as written here (its environment variables unset, a
speculator its first start would spend hours building).

Messages speak in policy keys, never in the names of the classes that validate them.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from sdk.policy import Policy


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (`X`, `X | None`, `list[X]`, `dict[str, X]`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (model := _model_in(arg)) is not None:
            return model
    return None


def _is_collection(annotation: Any) -> bool:
    """True when the annotation's value is a list or dict of models, so the next key path part is an index or name."""
    origin = typing.get_origin(annotation)
    if origin in (list, dict):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_is_collection(arg) for arg in typing.get_args(annotation))
    return False


def keys_at(root: type[BaseModel], path: Sequence[int | str]) -> list[str]:
    """The keys the mapping at `path` takes (empty when the path does not lead to a mapping)."""
    annotation: Any = root
    skip_next = False
    for part in path:
        if skip_next:
            skip_next = False
            continue
        model = _model_in(annotation)
        field = model.model_fields.get(str(part)) if model else None
        if field is None:
            return []
        annotation = field.annotation
        skip_next = _is_collection(annotation)
    model = _model_in(annotation)
    return list(model.model_fields) if model else []


def did_you_mean(word: str, known: Sequence[str]) -> str:
    """' (did you mean 'x'?)' for the closest known word, or ''."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def warnings(policy: Policy) -> list[str]:
    """Key path: problem, for environment variables the policy names that are unset here."""
    found = []
    unset_team = [(i, ref.env) for i, ref in enumerate(policy.api_keys) if ref.env and not os.environ.get(ref.env)]
    for i, name in unset_team:
        found.append(f"api_keys.{i}: environment variable {name} is not set")
    if not policy.resolved_keys():
        found.append("api_keys: no team key is set, so no client can reach this team: it will not be served")
    for name, provider in policy.providers.items():
        env = [provider.api_key_env] if isinstance(provider.api_key_env, str) else provider.api_key_env or []
        unset = [var for var in env if not os.environ.get(var)]
        if unset and len(unset) == len(env):
            last = [str(i) for i, route in enumerate(policy.routes) if route.targets[-1].provider == name]
            where_last = (f"; where it is the last target (routes {', '.join(last)}), they are refused with a 502 "
                          "that names the variable" if last else "")
            found.append(f"providers.{name}.api_key_env: {' and '.join(unset)} not set: requests routed to "
                         f"{name!r} go to the next target of their route{where_last}")
        elif unset:
            found.append(f"providers.{name}.api_key_env: {' and '.join(unset)} not set (the other keys are used)")
        speculator = provider.speculative.model if provider.speculative else None
        if speculator and (hours := _unbuilt_speculator_hours(speculator)):
            found.append(f"providers.{name}.speculative.model: {speculator} is not built yet: the engine's first start "
                         f"trains it (about {hours:.0f} hours on 2 CPU cores) before the gateway is ready; "
                         f"`slipstream engine build-speculator {speculator}` builds it ahead of time")
    return found


def _unbuilt_speculator_hours(model: str) -> float:
    """How long a build of `model` takes, when it is a speculator built on first use and not built here
    (0 otherwise, and where the engine is not installed: the extras check reports that)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return 0.0
    from localengine.spec_decode.built import BUILT_SPECULATORS, is_built, speculator_dir

    if model not in BUILT_SPECULATORS:
        return 0.0
    try:
        return 0.0 if is_built(speculator_dir(model)) else BUILT_SPECULATORS[model].hours_on_two_cores
    except FileNotFoundError:  # its target's package is missing: loading the target reports that
        return 0.0
