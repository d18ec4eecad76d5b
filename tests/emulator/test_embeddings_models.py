"""Embeddings (deterministic unit vectors), the model catalogue in both providers' shapes, and
unknown models answered with each provider's 404."""

from __future__ import annotations

import anthropic
import numpy as np
import openai
import pytest

from .helpers import HTTP, OPENAI_HEADERS, post

EMB = "text-embedding-3-small"


def _vectors(resp) -> list[np.ndarray]:
    return [np.asarray(d.embedding, dtype=np.float64) for d in resp.data]


def test_embeddings_are_deterministic_unit_vectors(oai):
    r = oai.embeddings.create(model=EMB, input=["alpha", "beta", "alpha"])  # client asks base64
    a, b, a2 = _vectors(r)
    assert a.shape == (1536,) and abs(np.linalg.norm(a) - 1) < 1e-5
    assert np.array_equal(a, a2) and not np.allclose(a, b)
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == EMB
    assert r.usage.prompt_tokens == r.usage.total_tokens == 3
    again = _vectors(oai.embeddings.create(model=EMB, input="alpha", encoding_format="float"))[0]
    assert np.allclose(again, a, atol=1e-7)
    other_model = _vectors(oai.embeddings.create(model="text-embedding-3-large", input="alpha"))[0]
    assert other_model.shape == (3072,)


def test_dimensions_shorten_and_renormalise(oai):
    full = _vectors(oai.embeddings.create(model=EMB, input="gamma"))[0]
    short = _vectors(oai.embeddings.create(model=EMB, input="gamma", dimensions=64))[0]
    assert short.shape == (64,) and abs(np.linalg.norm(short) - 1) < 1e-5
    assert np.allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)


def test_token_inputs(oai):
    r = oai.embeddings.create(model=EMB, input=[[1, 2, 3], [4]])
    assert len(r.data) == 2 and r.usage.prompt_tokens == 4
    single = oai.embeddings.create(model=EMB, input=[1, 2, 3])
    assert len(single.data) == 1 and np.allclose(_vectors(single)[0], _vectors(r)[0])


def test_embedding_errors(emu, oai):
    with pytest.raises(openai.NotFoundError) as ei:
        oai.embeddings.create(model="gpt-4o-embed-nope", input="x")
    assert ei.value.code == "model_not_found"
    for body, param in (({"model": EMB, "input": ""}, "input"), ({"model": EMB, "input": []}, "input"),
                        ({"model": EMB, "input": [{"a": 1}]}, "input"),
                        ({"model": EMB, "input": "x", "dimensions": 5000}, "dimensions"),
                        ({"model": "text-embedding-ada-002", "input": "x", "dimensions": 8}, "dimensions"),
                        ({"model": EMB, "input": "x", "encoding_format": "int8"}, "encoding_format")):
        r = post(emu.url, "/v1/embeddings", body, OPENAI_HEADERS)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, body


def test_faults_apply_to_embeddings_and_models(oai, anth, emu):
    emu.inject_fault("429:retry_after=0", path="/v1/embeddings")
    with pytest.raises(openai.RateLimitError):
        oai.embeddings.create(model=EMB, input="x")
    emu.inject_fault("529", path="/v1/models")
    with pytest.raises(anthropic.InternalServerError) as ei:
        anth.models.list()
    assert ei.value.status_code == 529 and emu.stats()["faults_injected"] == 2


def test_models_openai_shape(oai):
    ids = [m.id for m in oai.models.list()]
    assert {"gpt-5-mini", "gpt-4o", EMB} <= set(ids)
    m = oai.models.retrieve("gpt-4o")
    assert m.object == "model" and m.owned_by == "openai" and m.created > 0
    with pytest.raises(openai.NotFoundError) as ei:
        oai.models.retrieve("llama-3-70b")
    assert ei.value.code == "model_not_found"


def test_models_anthropic_shape(anth, emu):
    page = anth.models.list(limit=2)
    assert [m.type for m in page.data] == ["model", "model"] and page.has_more
    assert page.first_id == page.data[0].id and page.last_id == page.data[1].id
    every = [m.id for m in anth.models.list()]  # the client follows after_id to the end
    assert every[:2] == [m.id for m in page.data] and "claude-haiku-4-5" in every
    m = anth.models.retrieve("claude-sonnet-4-6")
    assert m.display_name == "Claude Sonnet 4.6" and m.created_at.year == 2026
    with pytest.raises(anthropic.NotFoundError) as ei:
        anth.models.retrieve("gpt-4o")
    assert ei.value.body["error"]["type"] == "not_found_error"


def test_unknown_models_get_the_provider_404(oai, anth, emu):
    with pytest.raises(openai.NotFoundError) as ei:
        oai.chat.completions.create(model="llama-3", messages=[{"role": "user", "content": "x"}])
    assert ei.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model="claude-sonnet-4-6", input="x")
    with pytest.raises(anthropic.NotFoundError) as ai:
        anth.messages.create(model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert ai.value.body["error"]["message"] == "model: gpt-4o"
    assert emu.stats()["statuses"] == {"404": 3}


def test_unknown_paths_take_the_callers_shape(emu):
    r = HTTP.get(emu.url + "/v1/nothing", headers=OPENAI_HEADERS)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    r = HTTP.get(emu.url + "/v1/nothing", headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
