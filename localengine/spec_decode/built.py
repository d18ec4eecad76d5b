"""MLP speculators built on first use.

Only the demo models' weights ship in the package, so a real model's speculator is a name that
stands for a recipe: `localengine/demo/train_speculator.py` run on the target's own answers, once,
into the data directory. The first engine that names it (or `slipstream engine build-speculator`,
ahead of time) builds it; every later one loads what that build left. A build is keyed by the
target file it was trained on, so a new release of the target's package gets a new speculator.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from localengine.config import packaged_model_path
from localengine.models.gguf import data_dir, file_key

log = logging.getLogger("localengine.speculator")


@dataclass(frozen=True, slots=True)
class SpeculatorRecipe:
    """The training script's settings for one packaged target (its flags, by the same names)."""

    target: str  # a packaged model name (localengine.config.PACKAGED_MODELS)
    prompts: int = 5000  # chat instructions answered greedily by the target: the training texts
    gen_tokens: int = 192
    n_predict: int = 4
    draft_vocab: int = 4096  # heads over the target's most generated tokens, not all 49,152
    minutes: float = 45.0  # training budget in CPU minutes
    max_num_seqs: int = 256  # the engine's batch while answering
    hours_on_two_cores: float = 2.0  # what a build took on a 2-core CPU, for the log line

    def argv(self, out: Path, threads: int) -> list[str]:
        return ["--target", self.target, "--prompt-set", "chat", "--prompts", str(self.prompts),
                "--gen-tokens", str(self.gen_tokens), "--sampled-share", "0", "--n-predict", str(self.n_predict),
                "--draft-vocab", str(self.draft_vocab), "--target-embeddings", "--soft-weight", "0",
                "--greedy-weight", "1", "--minutes", str(self.minutes), "--batch-size", "512",
                "--max-num-seqs", str(self.max_num_seqs), "--threads", str(threads), "--out", str(out)]


# The recipe measured in docs/localengine.md ("Speculative decoding"): 5,000 answers, 45 CPU minutes.
BUILT_SPECULATORS: dict[str, SpeculatorRecipe] = {
    "smollm2-135m-instruct-speculator": SpeculatorRecipe(target="smollm2-135m-instruct"),
}


def speculator_dir(name: str) -> Path:
    """Where `name`'s build lives: keyed by the target file (path, size, mtime) it is trained on."""
    target = packaged_model_path(BUILT_SPECULATORS[name].target)
    return data_dir() / "localengine" / "speculators" / f"{name}-{file_key(target)}"


def is_built(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def built_speculator(name: str) -> Path:
    """`name`'s speculator, built now if no build exists (one process builds, the others wait)."""
    out = speculator_dir(name)
    if not is_built(out):
        recipe = BUILT_SPECULATORS[name]
        log.warning("%s is not built yet: building it now, once, into %s (about %.0f hours on 2 CPU cores, "
                    "less on more; `slipstream engine build-speculator %s` builds it ahead of time)",
                    name, out, recipe.hours_on_two_cores, name)
        build_speculator(name, recipe)
    return out


def build_speculator(name: str, recipe: SpeculatorRecipe, threads: int | None = None, force: bool = False) -> Path:
    """Build `name` from `recipe` unless a build exists (or `force`), under a file lock: a process
    that finds another building it waits and then takes that build. The training runs in a child
    process (its torch threads, seeds and memory stay its own), into a temporary directory beside
    the build, which then takes the build's place."""
    out = speculator_dir(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(out.parent / f"{out.name}.lock"):
        if is_built(out) and not force:
            return out
        for stale in out.parent.glob(f"{out.name}.*"):  # what a build killed midway left (we hold the lock)
            if stale.is_dir():
                shutil.rmtree(stale)
        tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
        command = [sys.executable, "-m", "localengine.demo.train_speculator",
                   *recipe.argv(tmp / "speculator", threads or os.cpu_count() or 1)]
        tail: deque[str] = deque(maxlen=20)  # the last lines, for the error
        try:
            with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
                assert child.stdout is not None
                for line in child.stdout:  # the script's progress, as it comes
                    log.info("%s: %s", name, line.rstrip())
                    tail.append(line.rstrip())
            if child.returncode:
                raise RuntimeError(f"building {name} failed (exit {child.returncode}):\n" + "\n".join(tail))
            if out.exists():
                shutil.rmtree(out)
            (tmp / "speculator").rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s built: %s", name, out)
    return out

