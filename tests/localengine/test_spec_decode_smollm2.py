"""Speculative decoding on the bundled real model (smollm2-135m-instruct): greedy tokens equal to
decoding without it, with n-gram lookup (accepted on a prompt whose answer copies its input) and
with its MLP speculator, `smollm2-135m-instruct-speculator`, built on first use by
`localengine/demo/train_speculator.py` (here from a tiny recipe: what a build does, not how well it
trains; whatever it proposes, the target's tokens are kept); and the two together (`prompt_lookup`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.cli import main as slipstream
from localengine import LLM, SamplingParams
from localengine.config import packaged_model_path
from localengine.spec_decode.built import BUILT_SPECULATORS, SpeculatorRecipe, is_built, speculator_dir

try:
    packaged_model_path("smollm2-135m-instruct")
except FileNotFoundError as exc:  # the README's install commands put it there
    pytest.skip(str(exc), allow_module_level=True)

FUNCTION = '''def area(width, height):
    """Return the area of a rectangle."""
    if width < 0 or height < 0:
        raise ValueError("negative size")
    return width * height
'''
MESSAGES = [{"role": "user", "content": "Rewrite this function with `width` renamed to `w`. Reply with the code only."
                                        "\n\n" + FUNCTION}]
COMMON = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 2, "num_kvcache_blocks": 48}
PARAMS = SamplingParams(temperature=0, max_tokens=48)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}
PROSE = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def plain() -> LLM:
    return LLM("smollm2-135m-instruct", **COMMON)


SPECULATOR = "smollm2-135m-instruct-speculator"
POLICY = f"""team: local
api_keys: [{{value: sk-local-team}}]
providers:
  engine: {{kind: local, model: smollm2-135m-instruct,
           speculative: {{method: mlp_speculator, model: {SPECULATOR}, prompt_lookup: true}}}}
routes:
  - match: {{model: "*"}}
    targets: [{{provider: engine}}]
"""
TINY = ["--prompts", "8", "--gen-tokens", "16", "--minutes", "0.02", "--threads", "1"]


@pytest.fixture(scope="module")
def speculator() -> str:
    """The speculator's name, built ahead of time by the command line (in the suite's data dir)."""
    if not is_built(speculator_dir(SPECULATOR)):
        assert slipstream(["engine", "build-speculator", SPECULATOR, *TINY]) == 0
    assert is_built(speculator_dir(SPECULATOR))
    return SPECULATOR


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_build_speculator_command(speculator, capsys):
    weights = speculator_dir(speculator) / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    assert slipstream(["engine", "build-speculator", speculator]) == 0  # built already: nothing trained
    assert "already built" in capsys.readouterr().out and weights.stat().st_mtime_ns == built_at
    assert slipstream(["engine", "build-speculator", speculator, *TINY, "--force"]) == 0  # trained again, in its place
    assert is_built(speculator_dir(speculator)) and weights.stat().st_mtime_ns != built_at
    assert slipstream(["engine", "build-speculator", "gpt-4o-speculator"]) == 2
    assert "no speculator is built for 'gpt-4o-speculator'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_speculator_built_on_first_use(tmp_path: Path, monkeypatch, caplog, capsys):
    """The first engine that names it builds it into the data dir; the next one loads that build.
    `policy check` warns of a policy whose first start would build it, until it is built."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path))
    monkeypatch.setitem(BUILT_SPECULATORS, SPECULATOR,
                        SpeculatorRecipe(target="smollm2-135m-instruct", prompts=8, gen_tokens=16, minutes=0.02))
    policy = tmp_path / "team.yaml"
    policy.write_text(POLICY)
    warning = f"providers.engine.speculative.model: {SPECULATOR} is not built yet"
    assert slipstream(["policy", "check", str(policy)]) == 0 and warning in capsys.readouterr().out
    killed_midway = speculator_dir(SPECULATOR).with_name(speculator_dir(SPECULATOR).name + ".x1y2z3")
    (killed_midway / "speculator").mkdir(parents=True)  # a build that never finished: cleared, not taken
    spec = {"method": "mlp_speculator", "model": SPECULATOR, "num_speculative_tokens": 4}
    for _ in range(2):
        with caplog.at_level(logging.INFO, logger="localengine.speculator"):
            LLM("smollm2-135m-instruct", speculative_config=spec, **COMMON)
    built = speculator_dir(SPECULATOR)
    assert built.is_relative_to(tmp_path) and is_built(built) and not killed_midway.exists()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("is not built yet: building it now" in m for m in messages) == 1, messages
    assert sum(m.endswith(f"built: {built}") for m in messages) == 1
    assert any(": answered 8 of 8 in " in m for m in messages)  # its progress while answering
    assert any("held-out greedy acceptance" in m for m in messages)  # the training script's own report
    assert slipstream(["policy", "check", str(policy)]) == 0 and warning not in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(900)  # two loads of the model and 48 decode steps on a shared CPU
@pytest.mark.parametrize(("method", "messages"), [("ngram", MESSAGES), ("mlp_speculator", PROSE),
                                                  ("mlp_speculator+lookup", MESSAGES)])
def test_speculation_keeps_greedy_tokens(plain, speculator, method, messages):
    spec = NGRAM if method == "ngram" else {"method": "mlp_speculator", "model": speculator,
                                            "num_speculative_tokens": 4, "adaptive": False,
                                            "prompt_lookup": method.endswith("+lookup")}
    reference = plain.chat(messages, PARAMS)[0].outputs[0].token_ids
    llm = LLM("smollm2-135m-instruct", speculative_config=spec, **COMMON)
    assert llm.chat(messages, PARAMS)[0].outputs[0].token_ids == reference
    stats = llm.spec_decode_stats()
    assert stats is not None and stats.num_drafts > 0  # proposals were made and verified
    if messages is MESSAGES:  # the answer copies the function: lookup's proposals are mostly the target's own
        assert stats.acceptance_rate > 0.5, stats
