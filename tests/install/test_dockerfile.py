"""The Dockerfile (docs/deployment.md) copies paths that exist and installs extras that exist; no
container daemon runs here, so this is what can be checked of it without building."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_copies_what_the_repository_holds_and_names_real_extras():
    text = (ROOT / "Dockerfile").read_text()
    sources = [src for line in re.findall(r"^COPY (.+)$", text, re.M) for src in line.split()[:-1]]
    assert sources and all((ROOT / src).exists() for src in sources), sources
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    default = re.search(r"^ARG EXTRAS=(\S+)$", text, re.M).group(1)
    assert set(default.split(",")) <= set(extras)
    assert re.search(r"^CMD \[\"slipstream\", \"serve\"", text, re.M)
