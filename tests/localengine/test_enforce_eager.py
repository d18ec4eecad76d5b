"""`enforce_eager`: accepted by the engine and `engine serve`; on CPU there are never decode graphs
(their GPU behaviour is tests/gpu/test_cuda_engine.py's)."""

from __future__ import annotations

from gateway.cli import build_parser
from localengine import SamplingParams
from tests.localengine.conftest import make_llm


def test_engine_serve_takes_enforce_eager():
    parser = build_parser()
    assert parser.parse_args(["engine", "serve", "--model", "demo", "--enforce-eager"]).enforce_eager is True
    assert parser.parse_args(["engine", "serve", "--model", "demo"]).enforce_eager is False


def test_cpu_engine_never_captures_graphs(llama_dir):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = []
    for eager in (False, True):
        llm = make_llm(llama_dir, enforce_eager=eager)
        runner = llm.llm_engine.model_runner
        assert runner.graphs is None and not runner.use_cuda_graphs
        assert runner.kv_cache.shape[2] == runner.num_kvcache_blocks  # no scratch block without graphs
        outs.append(llm.generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids)
    assert outs[0] == outs[1]
