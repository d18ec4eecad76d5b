"""AWQ and GPTQ checkpoints in their published layouts: a tiny Llama's linears are quantized to 4 bits
here and packed with the packing code AutoAWQ (WQLinear_GEMM.from_linear) and AutoGPTQ (QuantLinear.pack)
publish, then loaded by the engine, which must find the same weights and run them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from localengine import SamplingParams
from localengine.layers.linear import LinearBase
from localengine.layers.quantization import INT4_WEIGHT_TYPES
from localengine.perplexity import perplexity
from tests.localengine.conftest import make_llm

GROUP = 32
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's order_map, written out here so the test does not share ours
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per group of inputs, as AWQ/GPTQ store it: int q [out, in], int z and fp16 s
    [out, groups], w ~ (q - z) * s."""
    out, cols = w.shape
    g = w.reshape(out, cols // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    s = ((hi - lo) / 15).clamp(min=1e-5).half()
    z = (-lo / s.float()).round().clamp(0, 15)
    q = (g / s.float()[..., None] + z[..., None]).round().clamp(0, 15)
    return q.reshape(out, cols).long(), z.long(), s


def _dequantized(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    out, cols = q.shape
    g = (q.reshape(out, cols // GROUP, GROUP) - z[..., None]).float() * s.float()[..., None]
    return g.reshape(out, cols)


def _pack_awq(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> dict[str, torch.Tensor]:
    intweight, zeros = q.t(), z.t()  # [in, out], [groups, out]
    qweight = torch.zeros(intweight.shape[0], intweight.shape[1] // 8, dtype=torch.int64)
    qzeros = torch.zeros(zeros.shape[0], zeros.shape[1] // 8, dtype=torch.int64)
    for col in range(qweight.shape[1]):
        for i in range(8):
            qweight[:, col] |= intweight[:, col * 8 + AWQ_ORDER[i]] << (i * 4)
            qzeros[:, col] |= zeros[:, col * 8 + AWQ_ORDER[i]] << (i * 4)
    return {"qweight": qweight.to(torch.int32), "qzeros": qzeros.to(torch.int32), "scales": s.t().contiguous()}


def _pack_gptq(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> dict[str, torch.Tensor]:
    intweight, zeros = q.t(), z.t() - 1  # v1 checkpoints store zero - 1
    qweight = torch.zeros(intweight.shape[0] // 8, intweight.shape[1], dtype=torch.int64)
    for row in range(qweight.shape[0]):
        for j in range(8):
            qweight[row] |= intweight[row * 8 + j] << (4 * j)
    qzeros = torch.zeros(zeros.shape[0], zeros.shape[1] // 8, dtype=torch.int64)
    for col in range(qzeros.shape[1]):
        for j in range(8):
            qzeros[:, col] |= (zeros[:, col * 8 + j] & 15) << (4 * j)
    g_idx = torch.arange(intweight.shape[0], dtype=torch.int32) // GROUP
    return {"qweight": qweight.to(torch.int32), "qzeros": qzeros.to(torch.int32), "scales": s.t().contiguous(),
            "g_idx": g_idx}


def _write(src: Path, out: Path, method: str) -> tuple[Path, Path]:
    """(the quantized checkpoint, the same model with its linears' dequantized weights in fp32)."""
    for d in (out / method, out / f"{method}-reference"):
        shutil.copytree(src, d)
        for f in d.glob("*.safetensors"):
            f.unlink()
    tensors = load_file(str(next(src.glob("*.safetensors"))))
    packed, reference = {}, {}
    for name, t in tensors.items():
        if any(f".{piece}.weight" in name for piece in LINEARS):
            q, z, s = _quantize(t.float())
            reference[name] = _dequantized(q, z, s)
            parts = _pack_awq(q, z, s) if method == "awq" else _pack_gptq(q, z, s)
            packed.update({name.removesuffix("weight") + part: v for part, v in parts.items()})
        else:
            packed[name] = reference[name] = t
    save_file(packed, str(out / method / "model.safetensors"))
    save_file(reference, str(out / f"{method}-reference" / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = ({"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                                      "version": "gemm"} if method == "awq" else
                                     {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                                      "sym": False, "checkpoint_format": "gptq"})
    (out / method / "config.json").write_text(json.dumps(config))
    return out / method, out / f"{method}-reference"


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_checkpoint_loads_as_published(llama_dir, tmp_path, method):
    path, reference_path = _write(llama_dir, tmp_path, method)
    llm = make_llm(path)
    assert llm.llm_engine.config.quantization == method  # inferred from config.json, as vLLM does
    model = llm.llm_engine.model_runner.model
    linears = {n: m for n, m in model.named_modules() if isinstance(m, LinearBase)}
    assert linears and all(isinstance(m.quant, INT4_WEIGHT_TYPES) for m in linears.values())
    assert not [n for n, _ in model.named_parameters() if "proj.weight" in n]  # never given float storage
    # The weights are the checkpoint's, value for value (scale and zero rounded to bf16 as for GGUF).
    reference = make_llm(reference_path).llm_engine.model_runner.model
    for name, module in linears.items():
        expected = reference.get_submodule(name).weight
        got = module.quant.dequantize()
        step = expected.abs().amax() / 7
        assert (got - expected).abs().max() <= step * 0.02, name
    # And they run: the same text scored nearly alike, and a greedy answer of the requested length.
    ids = [int(t) for t in torch.randint(3, 300, (80,), generator=torch.Generator().manual_seed(0))]
    ours, theirs = perplexity(llm, ids, window=64, stride=32), perplexity(make_llm(reference_path), ids, window=64, stride=32)
    assert ours.perplexity == pytest.approx(theirs.perplexity, rel=0.02)
    out = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8


def test_asking_for_another_format_is_refused(llama_dir, tmp_path):
    path, reference_path = _write(llama_dir, tmp_path, "awq")
    with pytest.raises(ValueError, match="AWQ checkpoint: quantization must be None or 'awq'"):
        make_llm(path, quantization="int8")
    with pytest.raises(ValueError, match="not a checkpoint in that format"):
        make_llm(reference_path, quantization="gptq")


def test_act_order_gptq_is_refused(llama_dir, tmp_path):
    path, _ = _write(llama_dir, tmp_path, "gptq")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["desc_act"] = True
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match="act-order"):
        make_llm(path)
