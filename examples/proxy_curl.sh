#!/usr/bin/env bash
# A plain curl session against a running proxy.
#   slipstream emulate --port 8081 & ; slipstream serve --policy my-team.yaml &
#   SLIPSTREAM_PROXY_URL=http://127.0.0.1:8080 SLIPSTREAM_TEAM_KEY=... examples/proxy_curl.sh
set -euo pipefail
URL=${SLIPSTREAM_PROXY_URL:-http://127.0.0.1:8080}
KEY=${SLIPSTREAM_TEAM_KEY:-sk-slipstream-local}

echo "# health"
curl -sS "$URL/healthz"; echo

echo "# OpenAI-shaped chat completion (headers shown)"
curl -sS -D - "$URL/v1/chat/completions" -H "authorization: Bearer $KEY" -H "content-type: application/json" \
  -d '{"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello"}]}' | grep -i -E '^x-slipstream|^\{'

echo "# Anthropic-shaped streaming message"
curl -sS -N "$URL/v1/messages" -H "x-api-key: $KEY" -H "anthropic-version: 2023-06-01" -H "content-type: application/json" \
  -d '{"model": "claude-sonnet-5", "max_tokens": 32, "stream": true, "messages": [{"role": "user", "content": "Hello"}]}' | grep '^event:' | sort | uniq -c

echo "# a bad request gets a provider-shaped error"
curl -sS "$URL/v1/messages" -H "x-api-key: $KEY" -H "content-type: application/json" -d '{not json'; echo
