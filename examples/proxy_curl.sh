#!/usr/bin/env bash
# A plain curl session against the proxy.
#
#   examples/proxy_curl.sh
#
# starts what it needs (the provider emulator and a proxy whose team policy points at it, on free
# loopback ports) and stops them on exit. To use a proxy you already run instead (it asks for gpt-4o
# and claude-sonnet-5 unless SLIPSTREAM_OPENAI_MODEL / SLIPSTREAM_ANTHROPIC_MODEL say otherwise; the
# README's `slipstream serve` with no provider key answers only the bundled local model):
#
#   SLIPSTREAM_PROXY_URL=http://127.0.0.1:8080 SLIPSTREAM_TEAM_KEY=sk-slipstream-local \
#     SLIPSTREAM_OPENAI_MODEL=smollm2-135m-instruct SLIPSTREAM_ANTHROPIC_MODEL=smollm2-135m-instruct examples/proxy_curl.sh
#
# `slipstream` is looked up on PATH, then in .venv/bin (the README's install).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${SLIPSTREAM_PROXY_URL:-}" ]; then
  slipstream=$(command -v slipstream || echo .venv/bin/slipstream)
  work=$(mktemp -d)
  trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
  free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  emulator_port=$(free_port)
  proxy_port=$(free_port)
  "$slipstream" emulate --port "$emulator_port" > "$work/emulator.log" 2>&1 &
  cat > "$work/curl.yaml" <<POLICY
team: curl
api_keys: [{value: "sk-curl-example"}]
providers:
  claude: {kind: anthropic, base_url: "http://127.0.0.1:$emulator_port", api_key: "emulator-key"}
  gpt: {kind: openai, base_url: "http://127.0.0.1:$emulator_port/v1", api_key: "emulator-key"}
routes:
  - match: {model: "claude-*"}
    targets: [{provider: claude}]
  - match: {model: "*"}
    targets: [{provider: gpt}]
POLICY
  "$slipstream" serve --policy "$work/curl.yaml" --port "$proxy_port" > "$work/proxy.log" 2>&1 &
  SLIPSTREAM_PROXY_URL="http://127.0.0.1:$proxy_port"
  SLIPSTREAM_TEAM_KEY=sk-curl-example
  for _ in $(seq 300); do  # up to 30 s: until the proxy says it is ready
    curl -sf "$SLIPSTREAM_PROXY_URL/readyz" > /dev/null 2>&1 && break
    sleep 0.1
  done
fi
URL=$SLIPSTREAM_PROXY_URL
KEY=${SLIPSTREAM_TEAM_KEY:-sk-slipstream-local}
OPENAI_MODEL=${SLIPSTREAM_OPENAI_MODEL:-gpt-4o}
ANTHROPIC_MODEL=${SLIPSTREAM_ANTHROPIC_MODEL:-claude-sonnet-5}

echo "# ready"
curl -sS "$URL/readyz"; echo

echo "# OpenAI-shaped chat completion (headers shown)"
curl -sS -D - "$URL/v1/chat/completions" -H "authorization: Bearer $KEY" -H "content-type: application/json" \
  -d "{\"model\": \"$OPENAI_MODEL\", \"max_tokens\": 32, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}" \
  | grep -i -E '^x-slipstream|^\{'

echo "# Anthropic-shaped streaming message"
curl -sS -N "$URL/v1/messages" -H "x-api-key: $KEY" -H "anthropic-version: 2023-06-01" -H "content-type: application/json" \
  -d "{\"model\": \"$ANTHROPIC_MODEL\", \"max_tokens\": 32, \"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}" \
  | grep -E '^event:|^\{' | sort | uniq -c  # an error is one JSON body, not events: shown too

echo "# a bad request gets a provider-shaped error"
curl -sS "$URL/v1/messages" -H "x-api-key: $KEY" -H "content-type: application/json" -d '{not json'; echo
