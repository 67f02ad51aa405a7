#!/usr/bin/env bash
# slimkv serve through curl, as the docs show it: health, a completion, a stream ending in [DONE], the
# API key, an oversized body, and SIGTERM (exit 0). Usage: curl_test.sh SLIMKV_BINARY SOURCE_DIR
set -euo pipefail
slimkv=$1 source=$2
work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- server log:"; cat "$work/log"; exit 1; }

"$slimkv" serve --model "$source/models/slimkv-llama-15m" --port 0 --threads 2 --api-key sk-curl >"$work/log" 2>&1 &
server=$!
for _ in $(seq 600); do grep -q "listening on" "$work/log" && break; sleep 0.05; done
port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/log")
[ -n "$port" ] || fail "no port printed"
url=http://127.0.0.1:$port
for _ in $(seq 600); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break; sleep 0.1; done
auth=(-H "Authorization: Bearer sk-curl")

# A completion: OpenAI's shape, max_tokens honoured.
out=$(curl -sf "${auth[@]}" "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "The cat", "max_tokens": 5, "temperature": 0}')
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["object"]=="text_completion" and r["usage"]["completion_tokens"]==5 and r["choices"][0]["finish_reason"]=="length", r' "$out" \
  || fail "completion: $out"

# A stream: data: lines, the last one [DONE], the content type SSE's.
curl -sN "${auth[@]}" -D "$work/headers" "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "The cat", "max_tokens": 5, "temperature": 0, "stream": true}' >"$work/stream"
grep -qi '^content-type: text/event-stream' "$work/headers" || fail "stream content type: $(cat "$work/headers")"
[ "$(grep -c '^data: {' "$work/stream")" -ge 1 ] || fail "no data events: $(cat "$work/stream")"
[ "$(grep '^data: ' "$work/stream" | tail -1)" = "data: [DONE]" ] || fail "stream does not end with [DONE]"

# No key: 401 in OpenAI's envelope.
code=$(curl -s -o "$work/body" -w '%{http_code}' "$url/v1/completions" -d '{"prompt": "x"}')
[ "$code" = 401 ] && grep -q '"authentication_error"' "$work/body" || fail "no key gave $code: $(cat "$work/body")"

# 33 MiB body: 413.
head -c $((33 << 20)) /dev/zero | tr '\0' 'a' >"$work/big"
code=$(curl -s -o "$work/body" -w '%{http_code}' "${auth[@]}" "$url/v1/completions" --data-binary @"$work/big")
[ "$code" = 413 ] || fail "oversized body gave $code"

# Still serving; then SIGTERM: exit 0.
curl -sf "${auth[@]}" "$url/v1/models" | grep -q '"slimkv-llama-15m"' || fail "/v1/models"
kill -TERM $server
wait $server || fail "exit code $? after SIGTERM"
grep -q "stopped" "$work/log" || fail "no graceful stop in the log"
echo "curl_test: all checks passed"
