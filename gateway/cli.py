"""`slipstream` command line: serve, emulate, engine serve, policy check."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import logging
import os
import sys
from pathlib import Path

from gateway.edge import EdgeLimits
from sdk.errors import PolicyError
from sdk.extras import missing_extras
from sdk.policy import load_policies, policy_files
from sdk.policy_advice import warnings as policy_warnings

_BUNDLED_POLICIES = Path(__file__).resolve().parent.parent / "policies"


def _default_policy_dir() -> Path:
    local = Path("policies")
    return local if local.is_dir() else _BUNDLED_POLICIES


def _serve(args: argparse.Namespace) -> int:
    from gateway.admin import ENV as ADMIN_KEY_ENV
    from gateway.app import BODY_BUDGET_ENV, CONNECTIONS_ENV, SERVE_PATHS_ENV, create_app
    from gateway.serving import admin_key_from, file_limit_warning, fixed_key_warnings, port_problem, run_server, server_config
    from sdk.observability.access_log import ENV as ACCESS_LOG_ENV
    from sdk.observability.tracing.setup import EXPORT_VAR as TRACE_EXPORT_ENV
    from sdk.services import default_data_dir
    from sdk.state import STATE_URL_ENV, open_state
    from sdk.state.spend_file import ENV as SPEND_FILE_ENV

    paths = args.policy or [args.policy_dir or _default_policy_dir()]
    if args.max_body_bytes_in_flight is not None and args.max_body_bytes_in_flight < 1:
        print(f"slipstream: --max-body-bytes-in-flight must be a positive number of bytes, not {args.max_body_bytes_in_flight}",
              file=sys.stderr)
        return 2
    state_url = args.state_url or os.environ.get(STATE_URL_ENV) or None
    if args.workers > 1 and state_url is None and not args.local_state:
        print(f"slipstream: --workers {args.workers} without shared state would split every limit, budget and breaker "
              f"{args.workers} ways (each worker counts alone). Give --state-url redis://HOST:PORT/DB (or ${STATE_URL_ENV}) "
              "to share them, or --local-state to accept per-worker state.", file=sys.stderr)
        return 2
    try:
        admin_key, argv_warning = admin_key_from(args.admin_key, args.admin_key_file)
    except OSError as exc:
        print(f"slipstream: cannot read --admin-key-file: {exc}", file=sys.stderr)
        return 2
    if argv_warning:
        print(f"slipstream: warning: {argv_warning}", file=sys.stderr, flush=True)
    if args.access_log:
        os.environ[ACCESS_LOG_ENV] = args.access_log  # workers inherit it; sdk/observability/access_log.py reads it
    if state_url is None:  # in-process state: spend outlives a restart (sdk/state/spend_file.py); workers inherit it
        os.environ.setdefault(SPEND_FILE_ENV, str(default_data_dir() / "spend.sqlite3"))
    # With tracing on, the proxy encodes and sends spans in a child process, off the serving one's
    # interpreter lock (sdk/observability/tracing/export_process.py); SLIPSTREAM_TRACE_EXPORT=thread keeps it in process.
    os.environ.setdefault(TRACE_EXPORT_ENV, "process")
    try:
        if args.workers > 1:  # each worker builds its own app; here only check what they will load
            served = [policy for policy in load_policies(paths).values() if policy.resolved_keys()]
            kind = open_state(state_url or "").kind
        else:
            app = create_app(paths, state_url=state_url or "", admin_key=admin_key,
                             body_bytes_in_flight=args.max_body_bytes_in_flight, max_connections=args.max_connections)
            served, kind = [team.policy for team in app.state.registry.teams.values()], app.state.registry.services.state().kind
    except PolicyError as exc:
        print(f"slipstream: cannot serve these policies:\n{exc}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as exc:  # a state URL of an unknown scheme, or no redis client
        print(f"slipstream: {exc}", file=sys.stderr)
        return 2
    if problem := port_problem(args.host, args.port):  # after the policies (their errors come first), before "serving"
        print(f"slipstream: {problem}", file=sys.stderr)
        return 1
    edge = EdgeLimits(max_header_bytes=args.max_header_bytes, header_timeout_s=args.header_timeout,
                      max_connections=args.max_connections)
    for warning in [*fixed_key_warnings(args.host, served), *filter(None, [file_limit_warning(edge)])]:
        print(f"slipstream: warning: {warning}", file=sys.stderr, flush=True)
    teams = ", ".join(sorted(policy.team for policy in served))
    print(f"slipstream: serving teams {teams} on http://{args.host}:{args.port}; state: {kind}"
          + (f" ({args.workers} workers)" if args.workers > 1 else "")
          + " (GET /readyz answers 200 once the models the policies need are loaded)", flush=True)
    if args.workers > 1:
        # Each worker process builds its own app from the environment (uvicorn imports the factory).
        os.environ[SERVE_PATHS_ENV] = os.pathsep.join(map(str, paths))
        os.environ[STATE_URL_ENV] = state_url or ""
        if admin_key:
            os.environ[ADMIN_KEY_ENV] = admin_key  # each worker's app reads it (gateway/admin.py)
        if args.max_body_bytes_in_flight is not None:
            os.environ[BODY_BUDGET_ENV] = str(args.max_body_bytes_in_flight)
        os.environ[CONNECTIONS_ENV] = str(args.max_connections)  # each request's part of the body budget (sdk/door/bodies.py)
        config = server_config("gateway.app:app_from_env", edge, factory=True, workers=args.workers, host=args.host, port=args.port,
                               timeout_graceful_shutdown=args.shutdown_timeout)
    else:
        config = server_config(app, edge, host=args.host, port=args.port, timeout_graceful_shutdown=args.shutdown_timeout)
    run_server(config)
    return 0


def _emulate(args: argparse.Namespace) -> int:
    import emulator
    from emulator.app import EmulatorConfig

    config = EmulatorConfig.realistic() if args.latency == "realistic" else EmulatorConfig()
    print(f"slipstream emulator on http://{args.host}:{args.port} (latency: {args.latency})", flush=True)
    emulator.serve(host=args.host, port=args.port, config=config)
    return 0


def _engine_serve(args: argparse.Namespace) -> int:
    from localengine.server import serve

    speculative = json.loads(args.speculative_config) if args.speculative_config else None
    overrides = dict(json.loads(args.override_generation_config or "{}"))
    default_max_tokens = overrides.pop("max_new_tokens", None)
    if overrides or not (default_max_tokens is None or (isinstance(default_max_tokens, int) and default_max_tokens > 0)):
        print("slipstream engine: --override-generation-config takes only a positive max_new_tokens", file=sys.stderr)
        return 2
    print(f"slipstream engine: {args.model} on http://{args.host}:{args.port}", flush=True)
    sizes = {k: v for k, v in (("max_model_len", args.max_model_len), ("num_kvcache_blocks", args.num_kvcache_blocks),
                               ("num_threads", args.threads), ("max_num_seqs", args.max_num_seqs),
                               ("max_num_batched_tokens", args.max_num_batched_tokens)) if v is not None}
    try:
        serve(args.model, host=args.host, port=args.port, served_model_name=args.served_model_name,
              default_max_tokens=default_max_tokens,
              enable_prefix_caching=args.enable_prefix_caching, speculative_config=speculative,
              tensor_parallel_size=args.tensor_parallel_size, enforce_eager=args.enforce_eager, dtype=args.dtype,
              quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype, **sizes)
    except (FileNotFoundError, NotImplementedError, ValueError) as exc:  # a model or option it cannot serve
        print(f"slipstream engine: {exc}", file=sys.stderr)
        return 2
    return 0


def _engine_build_speculator(args: argparse.Namespace) -> int:
    from localengine.spec_decode.built import (
        BUILT_SPECULATORS,
        build_speculator,
        is_built,
        speculator_dir,
    )

    if args.name not in BUILT_SPECULATORS:
        print(f"slipstream engine: no speculator is built for {args.name!r}; known: {', '.join(BUILT_SPECULATORS)}",
              file=sys.stderr)
        return 2
    try:
        out = speculator_dir(args.name)
    except FileNotFoundError as exc:  # the target's package is not installed
        print(f"slipstream engine: {exc}", file=sys.stderr)
        return 2
    if is_built(out) and not args.force:
        print(f"{args.name} is already built: {out} (--force builds it again)")
        return 0
    default = BUILT_SPECULATORS[args.name]
    recipe = dataclasses.replace(default, prompts=args.prompts or default.prompts,
                                 gen_tokens=args.gen_tokens or default.gen_tokens, minutes=args.minutes or default.minutes)
    print(f"slipstream engine: building {args.name} into {out}", flush=True)
    try:
        build_speculator(args.name, recipe, threads=args.threads, force=args.force)
    except RuntimeError as exc:
        print(f"slipstream engine: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def _policy_check(args: argparse.Namespace) -> int:
    """Errors (exit 1): invalid policies, features whose extra is not installed. Warnings (exit 0):
    environment variables the policy names that are unset here."""
    try:
        policies = load_policies(args.paths)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    failed = False
    for file in policy_files(args.paths):
        policy = policies[file]
        missing = missing_extras(policy)
        if missing:
            failed = True
            print("\n".join(f"{file}: {line}" for line in missing), file=sys.stderr)
            continue
        advice = policy_warnings(policy)
        print(f"ok  {file}  (team {policy.team}{f', {len(advice)} warnings' if advice else ''})")
        for line in advice:
            print(f"    warning: {line}")
    return 1 if failed else 0


def _state_migrate(args: argparse.Namespace) -> int:
    import asyncio

    from sdk.state.migrate import migrate_hash_tags

    try:
        result = asyncio.run(migrate_hash_tags(args.url, dry_run=args.dry_run))
    except (ValueError, OSError, ConnectionError) as exc:
        print(f"slipstream: {exc}", file=sys.stderr)
        return 1
    verb = "would rename" if args.dry_run else "renamed"
    for old, new in result.renamed:
        print(f"{verb} {old} -> {new}")
    for old, new in result.kept:
        print(f"{'would keep' if args.dry_run else 'kept'} {old}: {new} already exists (written since the upgrade)")
    print(f"{len(result.renamed)} keys {verb}, {len(result.kept)} left as they were")
    return 0


def _cache_report(args: argparse.Namespace) -> int:
    import os

    import httpx

    from gateway.cache_report import format_report

    key = args.key or os.environ.get("SLIPSTREAM_TEAM_KEY")
    if not key:
        print("slipstream: give the team key with --key or SLIPSTREAM_TEAM_KEY", file=sys.stderr)
        return 2
    try:
        response = httpx.get(f"{args.url.rstrip('/')}/v1/slipstream/cache-report", headers={"authorization": f"Bearer {key}"}, timeout=10)
    except httpx.HTTPError as exc:
        print(f"slipstream: cannot reach the proxy at {args.url}: {exc}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        print(f"slipstream: the proxy answered {response.status_code}: {response.text}", file=sys.stderr)
        return 1
    print(response.text if args.json else format_report(response.json()))
    return 0


def _version() -> str:
    try:
        return importlib.metadata.version("slipstream")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was not pip-installed
        return "(not installed)"


class _ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each argument's default, except where there is none to show (None, a False flag)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    formatter = _ShowDefaults  # every argument has a help text: the formatter adds defaults only to those
    parser = argparse.ArgumentParser(prog="slipstream", description="Client-side LLM gateway", formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"slipstream {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the proxy", formatter_class=formatter)
    where = serve.add_mutually_exclusive_group()
    where.add_argument("--policy-dir", type=Path, help="directory of team policy files (default: ./policies, else the bundled ones)")
    where.add_argument("--policy", type=Path, action="append", help="a policy file (repeatable)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on")
    serve.add_argument("--state-url", help="shared state for limits, budgets, breakers and caches: redis://[:PASSWORD@]HOST:PORT/DB "
                       "or rediss://… (default: $SLIPSTREAM_STATE_URL, else in process)")
    serve.add_argument("--workers", type=int, default=1, help="processes sharing the port (needs --state-url or --local-state)")
    serve.add_argument("--local-state", action="store_true", help="with --workers: let each worker keep its own state")
    serve.add_argument("--shutdown-timeout", type=float, metavar="SECONDS",
                       help="on SIGTERM, how long requests in flight may go on before they are ended (their spend charged "
                            "from what was sent, before the process exits); default: as long as they take. Give less than "
                            "the time your orchestrator waits before it kills the process")
    serve.add_argument("--access-log", choices=("off", "text", "json"),
                       help="one line per request on stderr (default: $SLIPSTREAM_ACCESS_LOG, else off)")
    admin = serve.add_mutually_exclusive_group()
    admin.add_argument("--admin-key-file", type=Path, help="a file holding the admin key, which guards /metrics and opens the "
                       "status page /ui: send 'Authorization: Bearer KEY', or sign in at /ui (default: $SLIPSTREAM_ADMIN_KEY)")
    admin.add_argument("--admin-key", help="the admin key itself (warned about: visible to every user in the process list; "
                       "prefer $SLIPSTREAM_ADMIN_KEY or --admin-key-file)")
    serve.add_argument("--max-connections", type=int, default=EdgeLimits.max_connections,
                       help="open client connections per process; past it the oldest one still sending its request head is closed")
    serve.add_argument("--header-timeout", type=float, default=EdgeLimits.header_timeout_s,
                       help="seconds a client has to send a request's line and headers (408 after)")
    serve.add_argument("--max-header-bytes", type=int, default=EdgeLimits.max_header_bytes,
                       help="size of a request's line and headers together (431 above)")
    serve.add_argument("--max-body-bytes-in-flight", type=int, metavar="BYTES",
                       help="request bodies a process holds at once (default: 1 GiB), all teams together; past half of it a team's request is "
                       "taken only within its share (429 past it, 503 when the process is full); at least twice the largest "
                       "limits.max_body_bytes")
    serve.set_defaults(run=_serve)

    emulate = commands.add_parser("emulate", help="run the Anthropic + OpenAI emulator", formatter_class=formatter)
    emulate.add_argument("--host", default="127.0.0.1", help="address to listen on")
    emulate.add_argument("--port", type=int, default=8081, help="port to listen on")
    emulate.add_argument("--latency", choices=("fast", "realistic"), default="fast", help="latency model")
    emulate.set_defaults(run=_emulate)

    engine = commands.add_parser("engine", help="the local inference engine", formatter_class=formatter)
    engine_commands = engine.add_subparsers(dest="engine_command", required=True, metavar="COMMAND")
    engine_serve = engine_commands.add_parser("serve", help="OpenAI-compatible server for a local model", formatter_class=formatter)
    engine_serve.add_argument("--model", required=True,
                              help="a local Hugging Face directory, a GGUF file, or a bundled name: "
                                   "smollm2-135m-instruct, demo")
    engine_serve.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                              help="weights and activations (auto: float32 on CPU, the checkpoint's on GPU; "
                                   "bfloat16 prefills faster on CPUs with AMX but decodes slower there: the "
                                   "engine's decode ops are fp32; see --quantization bf16)")
    engine_serve.add_argument("--quantization", choices=("none", "bf16", "int8", "int4", "gguf", "awq", "gptq"),
                              help="weights (vLLM's name): bf16: the weights (linears, embedding, LM head) kept in bf16, multiplied "
                                   "in fp32 (half the bytes a decode reads; lossless for a bf16 checkpoint); "
                                   "int8 / int4 weight-only for the linears, the embedding int8; gguf: a GGUF's blocks kept quantized; awq / gptq: such a checkpoint's "
                                   "4-bit linears (inferred from its config.json when left out); none (default): "
                                   "in --dtype, GGUF blocks dequantized")
    engine_serve.add_argument("--kv-cache-dtype", default="auto",
                              help="KV cache element type (vLLM's name): auto (--dtype), int8, fp8 (e4m3, also "
                                   "fp8_e4m3): one byte per element with per-channel scales, twice the sequences")
    engine_serve.add_argument("--threads", type=int, help="CPU threads for model steps (default: torch's, one per core)")
    engine_serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    engine_serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    engine_serve.add_argument("--tensor-parallel-size", type=int, default=1,
                              help="processes (GPUs) to split the model across (gloo on CPU, NCCL on CUDA)")
    engine_serve.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    engine_serve.add_argument("--num-kvcache-blocks", type=int,
                              help="KV cache size in blocks of 16 tokens (default: sized from free memory)")
    engine_serve.add_argument("--served-model-name",
                              help="the name clients send as `model` (vLLM's flag; default: --model)")
    engine_serve.add_argument("--max-num-seqs", type=int, help="requests decoded together at most (default: 128)")
    engine_serve.add_argument("--max-num-batched-tokens", type=int,
                              help="tokens one engine step computes at most (vLLM's flag; default: 2048): a longer "
                                   "prompt, or a burst of them, is prefilled in chunks of this size")
    engine_serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                              help="reuse the KV blocks of a prompt prefix seen before (vLLM's flag)")
    engine_serve.add_argument("--override-generation-config",
                              help='JSON, as vLLM: \'{"max_new_tokens": 512}\' caps a chat request that names no '
                                   "max_tokens (default: up to the context); no other key is supported")
    engine_serve.add_argument("--enforce-eager", action="store_true",
                              help="CUDA: run decode eagerly instead of replaying captured CUDA graphs")
    engine_serve.add_argument(
        "--speculative-config", help='JSON, as vLLM: \'{"method": "ngram", "num_speculative_tokens": 4}\''
    )
    engine_serve.set_defaults(run=_engine_serve)
    build = engine_commands.add_parser(
        "build-speculator", formatter_class=formatter,
        help="train a packaged model's MLP speculator into the data directory (what its first use would do)")
    build.add_argument("name", help="the speculator's name (smollm2-135m-instruct-speculator)")
    build.add_argument("--prompts", type=int, help="answers to train on (default: the recipe's, 5,000)")
    build.add_argument("--gen-tokens", type=int, help="tokens per answer at most (default: 192)")
    build.add_argument("--minutes", type=float, help="training budget in CPU minutes (default: 45)")
    build.add_argument("--threads", type=int, help="CPU threads (default: one per core)")
    build.add_argument("--force", action="store_true", help="build again over an existing build")
    build.set_defaults(run=_engine_build_speculator)

    policy = commands.add_parser("policy", help="policy tools", formatter_class=formatter)
    policy_commands = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    check = policy_commands.add_parser("check", help="validate policy files or directories", formatter_class=formatter)
    check.add_argument("paths", nargs="+", type=Path, help="policy files or directories of them")
    check.set_defaults(run=_policy_check)

    state = commands.add_parser("state", help="shared-state (Redis) tools", formatter_class=formatter)
    state_commands = state.add_subparsers(dest="state_command", required=True, metavar="COMMAND")
    migrate = state_commands.add_parser(
        "migrate", formatter_class=formatter,
        help="rename keys an older version wrote (spend, stored responses, limits) to their hash-tagged names")
    migrate.add_argument("url", help="the policy's state URL (redis://… or redis+sentinel://…, with its ?prefix=)")
    migrate.add_argument("--dry-run", action="store_true", help="list the renames without making them")
    migrate.set_defaults(run=_state_migrate)

    cache = commands.add_parser("cache", help="prompt-cache tools", formatter_class=formatter)
    cache_commands = cache.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    report = cache_commands.add_parser("report", help="a team's prompt-cache hit rate, savings and top miss causes",
                                       formatter_class=formatter)
    report.add_argument("--url", default="http://127.0.0.1:8080", help="the running proxy")
    report.add_argument("--key", help="the team key (default: $SLIPSTREAM_TEAM_KEY)")
    report.add_argument("--json", action="store_true", help="print the raw JSON summary")
    report.set_defaults(run=_cache_report)
    return parser


def configure_logging() -> None:
    """Slipstream's own loggers at INFO (startup timings, reloads); libraries only from WARNING, so
    neither httpx's per-request lines nor faiss's import chatter reach the terminal."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("slipstream", "emulator", "localengine"):
        logging.getLogger(name).setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # here, not at exit, where a reader that left would be a traceback too
        return code
    except BrokenPipeError:  # the reader left (`slipstream policy check policies/ | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor one when Python flushes at exit
        return 1


if __name__ == "__main__":
    sys.exit(main())
