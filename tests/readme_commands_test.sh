#!/usr/bin/env bash
# The README's set-up commands from a fresh clone (issue 31): in a copy of the tracked files only (what
# `git clone` gives), each `make ...` the README's "Set-up" section quotes must parse (`make -n`), every
# repository path its commands use must exist there, and `make run`'s generate command, run with the
# built CLI from the copy, must answer with the pass key (models/slimkv-llama-15m/passkey_prompt.json).
# Not run: the package installation and the build themselves (no network, and minutes: CI's own
# `make test` from a clean clone does those). Usage: readme_commands_test.sh SLIMKV_BINARY SOURCE_DIR
set -u
slimkv=$(realpath "$1") src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0 passes=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

clone=$work/clone
mkdir -p "$clone"
(cd "$src" && git ls-files -z | xargs -0 cp --parents -t "$clone") || { echo "FAIL copying the tracked files"; exit 1; }

# The commands: `make ...` lines of the fenced block under "## Set-up", and `make ...` quoted in it.
setup=$(awk '/^## Set-up/{on=1; next} on && /^## /{exit} on' "$clone/README.md")
mapfile -t commands < <({ grep -oE '^make [^#]*' <<<"$setup"; grep -oE '`make [^`]*`' <<<"$setup" | tr -d '`'; } |
                        sed 's/ *$//' | sort -u)
((${#commands[@]} >= 2)) || fail "README's Set-up section quotes ${#commands[@]} make commands, expected make run and make test"
expected=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["expected_answer"])' \
           "$clone/models/slimkv-llama-15m/passkey_prompt.json")

for command in "${commands[@]}"; do
  read -ra args <<<"$command"
  if ! (cd "$clone" && make -n "${args[@]:1}") >"$work/plan" 2>"$work/err"; then
    fail "'$command' does not parse: $(head -c 400 "$work/err")"; continue
  fi
  passes=$((passes + 1))
  # Every path the commands name inside the repository (not the build outputs they make) exists.
  for path in $(grep -oE '(^|[ "=])(\.ci|scripts|models|tests|fuzz|docs|examples|src|bench)/[^ ";]*' "$work/plan" |
                sed 's/^[ "=]//' | sort -u); do
    [ -e "$clone/$path" ] && passes=$((passes + 1)) || fail "'$command' uses $path, which a fresh clone lacks"
  done
  # make run's last step: the built CLI, from the clone, must find the pass key.
  generate=$(grep -E '/slimkv generate ' "$work/plan")
  if [ "${args[1]}" = run ]; then
    [ -n "$generate" ] || { fail "'$command' runs no slimkv generate"; continue; }
    read -ra run <<<"$generate"
    run[0]=$slimkv
    if (cd "$clone" && timeout 300 "${run[@]}") >"$work/out" 2>"$work/err" && grep -qF -- "$expected" "$work/out"; then
      passes=$((passes + 1))
    else
      fail "'$command': '${generate}' did not answer '$expected': $(head -c 300 "$work/out") $(tail -c 300 "$work/err")"
    fi
  fi
done

echo "readme_commands: $passes checks passed, $failures failed (${commands[*]})"
[ "$failures" -eq 0 ]
