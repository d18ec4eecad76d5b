"""llama.cpp's extra CPU buffer types off on CPUs with Intel AMX, where they crash.

llama-cpp-python 0.3.36, built from its sdist on a Xeon with AMX (2026-11-26), segfaults in
`llama_decode` on any batch of more than one token (a prompt) of SmolLM2's Q4_1 file, in llama.cpp's
"extra" buffer types (the AMX and repacked-weight buffers, `use_extra_bufts`; llama.cpp's
`--no-repack`); one-token batches run. With them off, llama.cpp runs its AVX-512 kernels, as on a
CPU without AMX. The llama.cpp rows of `smollm2.py` and `serve_streams.py` say when this applied.

    python bench/localengine/llama_cpp_amx.py -m llama_cpp.server ARGS...   # the server, buffers off

Run as that launcher it needs only llama-cpp-python (the server's own Python may lack the
repository's packages): the caller decides, with `cpu_has_amx`, whether to launch through it.
"""

from __future__ import annotations

import runpy
import sys


def cpu_has_amx() -> bool:
    from localengine.kernels.cpu_ops import cpu_flags  # here, not at the top: the launcher runs without it

    return not cpu_flags().isdisjoint({"amx_int8", "amx_bf16"})


def without_extra_buffers() -> None:
    """Make every later `Llama(...)` load without extra buffer types."""
    import llama_cpp.llama_cpp as bindings

    default = bindings.llama_model_default_params

    def params():  # the struct llama_cpp.Llama starts from, with the extra buffers off
        p = default()
        p.use_extra_bufts = False
        return p

    bindings.llama_model_default_params = params


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit(__doc__)
    module = sys.argv[2]
    without_extra_buffers()
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
