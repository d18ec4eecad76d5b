"""Process-wide resources that stages share across teams and survive policy reloads.

Heavy things (the embedding model, cache stores) are created once, lazily, on first use, so a team
whose policy does not enable a feature never pays for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def default_data_dir() -> Path:
    return Path(os.environ.get("SLIPSTREAM_DATA_DIR", Path.home() / ".cache" / "slipstream"))


@dataclass
class Services:
    data_dir: Path = field(default_factory=default_data_dir)
