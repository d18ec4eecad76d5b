"""The run directory's `conftest.py` (copied there by `python -m bench.vllm_compat`).

vLLM's test modules import `vllm` itself: its request classes, `SamplingParams`, exceptions and
`get_tokenizer`. vLLM is not installed; a stand-in package answers those imports. A test that
calls one of vLLM's own classes is skipped (it tests vLLM's Python code, not the HTTP server);
`get_tokenizer` gives the served model's tokenizer, `ModelConfig(...).get_vocab_size()` its
vocabulary size. The fixtures vLLM's root conftest provides to
the structured-output tests are defined here, and the expected failures (exceptions.py) are marked.
"""

from __future__ import annotations

import fnmatch
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

import pytest

from bench.vllm_compat.exceptions import EXPECTED_FAILURES, VLLM_INTERNAL_TESTS, VLLM_INTERNALS


def _skip_internal() -> None:
    pytest.skip(VLLM_INTERNALS)


class _Internal(type):
    """One of vLLM's classes: using it skips the test."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        _skip_internal()

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _skip_internal()

    def _skip_operator(cls, *args: Any) -> Any:  # a setting read from vllm.envs, used in arithmetic
        _skip_internal()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __int__ = __index__ = _skip_operator


def _get_tokenizer(*args: Any, **kwargs: Any) -> Any:
    from localengine.config import Config
    from localengine.engine.llm_engine import load_tokenizer

    return load_tokenizer(Config(model=os.environ.get("VLLM_COMPAT_MODEL", "smollm2-135m-instruct")))


def _hf_api() -> Any:
    """The hub client vLLM's LoRA fixture downloads an adapter with: nothing is downloaded (engine
    serve is not given vLLM's LoRA arguments), the fixture gets a path that names the adapter."""
    return types.SimpleNamespace(snapshot_download=lambda repo_id, **_: f"(not downloaded: {repo_id})")


class _ModelConfig:
    """vllm.config.ModelConfig as the logit-bias tests use it: the served model's vocabulary size."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from localengine.config import Config

        self._config = Config(model=os.environ.get("VLLM_COMPAT_MODEL", "smollm2-135m-instruct"))

    def get_vocab_size(self) -> int:
        return int(self._config.hf_config["vocab_size"])


_STAND_INS = {"get_tokenizer": _get_tokenizer, "hf_api": _hf_api, "ModelConfig": _ModelConfig}


class _VllmModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _STAND_INS.get(name) or _Internal(name, (), {})


class _VllmFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "vllm" or fullname.startswith("vllm."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _VllmModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


sys.meta_path.insert(0, _VllmFinder())


@pytest.fixture
def sample_structured_outputs_choices() -> list[str]:
    return ["Python", "Java", "JavaScript", "C++", "C#", "PHP", "TypeScript", "Ruby", "Swift", "Kotlin"]


@pytest.fixture
def sample_regex() -> str:
    return r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)"


@pytest.fixture
def sample_json_schema() -> dict[str, Any]:
    return {"type": "object", "required": ["name", "age"],
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(fnmatch.fnmatchcase(item.name, pattern) for pattern in VLLM_INTERNAL_TESTS):
            item.add_marker(pytest.mark.skip(reason=VLLM_INTERNALS))
            continue
        for pattern, reason in EXPECTED_FAILURES.items():
            if fnmatch.fnmatchcase(item.name, pattern):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
                break
