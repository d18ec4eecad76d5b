"""`python -m emulator [--host H] [--port N] [--latency fast|realistic]`."""

from __future__ import annotations

import argparse

from .app import EmulatorConfig, serve


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m emulator", description="Provider API emulator")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--latency", choices=("fast", "realistic"), default="fast")
    a = p.parse_args(argv)
    cfg = EmulatorConfig.realistic() if a.latency == "realistic" else EmulatorConfig()
    print(f"emulator listening on http://{a.host}:{a.port} (latency={a.latency})", flush=True)
    serve(a.host, a.port, cfg)


if __name__ == "__main__":
    main()
