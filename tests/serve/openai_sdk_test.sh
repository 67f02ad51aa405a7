#!/usr/bin/env bash
# Runs openai_sdk_test.mjs against a slimkv serve on loopback (or, given BASE_URL, against a server
# already running there: the router's end-to-end test). The openai package is installed with npm into
# the build tree once; without a registry the test is skipped (exit 77), saying so.
# Usage: openai_sdk_test.sh SLIMKV_BINARY SOURCE_DIR NPM_FOLDER [BASE_URL]
set -euo pipefail
slimkv=$1 source=$2 npm_folder=$3 base_url=${4:-}
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node and npm are not installed (scripts/install_deps.sh installs them)"; exit 77
fi
if [ ! -d "$npm_folder/node_modules/openai" ]; then
  mkdir -p "$npm_folder"
  if ! timeout 120 npm install --silent --no-audit --no-fund --prefix "$npm_folder" openai@4 >"$npm_folder/install.log" 2>&1; then
    echo "SKIP: npm could not install the openai package (no registry?):"; tail -5 "$npm_folder/install.log"; exit 77
  fi
fi
# ESM resolves packages from the script's folder upwards: run a copy placed in the npm folder.
cp "$(dirname "$0")/openai_sdk_test.mjs" "$npm_folder/"
if [ -n "$base_url" ]; then
  exec node "$npm_folder/openai_sdk_test.mjs" "$base_url"
fi
work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
# The bundled model has no chat template: serve its files beside a ChatML one.
mkdir "$work/model"
ln -s "$source"/models/slimkv-llama-15m/* "$work/model/"
cp "$(dirname "$0")/chatml_template.jinja" "$work/model/chat_template.jinja"
"$slimkv" serve --model "$work/model" --served-model-name slimkv-llama-15m --port 0 --threads 2 --api-key sk-node >"$work/log" 2>&1 &
server=$!
for _ in $(seq 600); do grep -q "listening on" "$work/log" && break; sleep 0.05; done
port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/log")
for _ in $(seq 600); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && break; sleep 0.1; done
node "$npm_folder/openai_sdk_test.mjs" "http://127.0.0.1:$port/v1" || { cat "$work/log"; exit 1; }
kill -TERM $server
wait $server
