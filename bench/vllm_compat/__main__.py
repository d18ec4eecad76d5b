"""vLLM's own OpenAI-server tests for chat and completions, run against `slipstream engine serve`.

    .venv/bin/python -m bench.vllm_compat [--vllm-src DIR] [--model NAME] [-- PYTEST_ARGS...]

The tests come from vLLM's published source distribution (VLLM_VERSION below; its sdist carries
the `tests/` tree), unchanged. They are not copied into this repository: `--vllm-src` names an
unpacked vLLM source tree of that version (sdist or git checkout); without it the sdist is fetched
once with pip into ~/.cache/slipstream/ (pip unpacks it, then fails to build vLLM's metadata,
which is not needed). A run directory is laid out in a temporary folder: the chosen test files at
their own paths, `remote_server.py` as their `tests/utils.py` (a `RemoteOpenAIServer` that starts
`slipstream engine serve --model NAME --served-model-name <vLLM's model>`), and `conftest_shim.py`
as its conftest (stand-ins for the `vllm` imports, the expected failures of exceptions.py as xfail).
Prints pytest's outcome for every test, then the counts. Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VLLM_VERSION = "0.33.0"
# The files run, and their sha256 in vLLM 0.33.0 (exceptions.py is written for exactly these).
TEST_FILES = {
    "tests/entrypoints/openai/chat_completion/test_chat.py":
        "9bef28af1506c0d7777b009e8ab12c713559b081f5ee11592b35d61e6bbe9672",
    "tests/entrypoints/openai/completion/test_completion.py":
        "baebf405d593594cb532aaf65c7cbcbff1f77def1bbc7fe6d4610f8fd9730310",
    "tests/entrypoints/openai/chat_completion/test_chat_logit_bias_validation.py":
        "bf77fcb7b218214814effd7a2cd804f843f75fde6aaf3554e9cc48e6f8b633ea",
    "tests/entrypoints/openai/completion/test_prompt_validation.py":
        "54756656f2866c8b681895d866099fa12c1890de5e90d1701403cde50fd5fe50",
}
PYTEST_INI = """[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
pythonpath = .
"""


def fetch_sources(cache: Path) -> Path:
    """vLLM's source tree (tests/ and LICENSE) of VLLM_VERSION, fetched once with pip."""
    if (cache / "tests").is_dir():
        return cache
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TMPDIR": tmp}
        cmd = [sys.executable, "-m", "pip", "download", f"vllm=={VLLM_VERSION}", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "--no-clean", "-d", tmp]
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        unpacked = [p for p in Path(tmp).glob("pip-*/vllm_*") if (p / "tests").is_dir()]
        if not unpacked:
            raise SystemExit(f"could not fetch vLLM {VLLM_VERSION}'s sources with pip; pass --vllm-src DIR")
        cache.mkdir(parents=True, exist_ok=True)
        for name in ("tests", "LICENSE", "PKG-INFO"):
            src = unpacked[0] / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, cache / name)
    return cache


def lay_out(src: Path, run: Path) -> None:
    for rel, digest in TEST_FILES.items():
        if hashlib.sha256((src / rel).read_bytes()).hexdigest() != digest:
            raise SystemExit(f"{src / rel} is not vLLM {VLLM_VERSION}'s file (sha256 differs)")
        dest = run / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / rel, dest)
        for parent in Path(rel).parents:  # the packages the test's module path runs through
            if str(parent) != ".":
                (run / parent / "__init__.py").touch()
    shutil.copy(HERE / "remote_server.py", run / "tests" / "utils.py")
    shutil.copy(HERE / "conftest_shim.py", run / "conftest.py")
    (run / "pytest.ini").write_text(PYTEST_INI)


def report(junit: Path) -> None:
    counts: dict[str, int] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, reason = child.tag, (child.get("message") or "").splitlines()[0][:140] if child.get("message") else ""
            elif child.tag == "skipped":
                xfail = (child.get("type") or "") == "pytest.xfail"
                outcome, reason = ("xfail" if xfail else "skipped"), (child.get("message") or "")[:140]
        counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{outcome:8} {name}  {reason}")
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-src", type=Path, help=f"an unpacked vLLM {VLLM_VERSION} source tree")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="what engine serve loads")
    parser.add_argument("--max-new-tokens", type=int, default=256,
                        help="cap on a chat request that names no max_tokens (vLLM's --override-generation-config "
                             "max_new_tokens; 0: up to the context, minutes per request on a CPU)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --), e.g. -k logprobs")
    args = parser.parse_args()
    src = args.vllm_src or fetch_sources(Path.home() / ".cache" / "slipstream" / f"vllm-{VLLM_VERSION}")
    with tempfile.TemporaryDirectory(prefix="vllm_compat-") as tmp:
        run = Path(tmp)
        lay_out(src, run)
        junit = run / "junit.xml"
        env = {**os.environ, "VLLM_COMPAT_MODEL": args.model, "VLLM_COMPAT_MAX_NEW_TOKENS": str(args.max_new_tokens),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--timeout=600", f"--junitxml={junit}",
               *TEST_FILES, *args.pytest_args]
        code = subprocess.run(cmd, cwd=run, env=env, check=False).returncode
        if junit.is_file():
            report(junit)
    return code


if __name__ == "__main__":
    sys.exit(main())
