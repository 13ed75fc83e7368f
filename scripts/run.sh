#!/usr/bin/env bash
# Sets up .venv (if needed) and runs the main job: the whole loop on the whole stack
# (`agentrl loop`). nats-server, the reward service, the warehouse, the training service and
# the deployment controller with its OpenAI-compatible gateway start in one process; agents
# play text FrozenLake through the gateway with SmolLM2-135M as a valid-action policy; every
# episode is published, rewarded, and the threshold trigger starts training jobs on the
# logged trajectories; each new version is validated, ramped by canary and promoted or rolled
# back, for four generations (up to nine while the live version scores below 0.6 on its own
# validation maps). At the end every version is played greedily on 50 held-out maps (never
# trained on): a table (success with a 95 % interval, mean reward, traffic, decision), the
# HTML report, and as the last line one JSON object with base_heldout_success,
# trained_heldout_success, heldout_seeds, wall_s (and versions, promoted, rolled_back,
# best_heldout_success, trajectories, rewards, lost). 7.5-9 minutes on 2 cores; measured in
# five fresh-clone runs in a row on an AVX2-only CPU (2026-11-28, thirteenth session): the
# live version at 0.74-0.86 held-out success vs the base at 0.00 in all five, in 456-548 s
# (BENCHMARKS.md).
# Extra arguments go to `agentrl loop` (e.g. --quick, --bad-candidate). The stand-alone
# learning run (no services, ~2 minutes) is `.venv/bin/agentrl learn`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
.venv/bin/python -m compileall -q -j 0 src >/dev/null 2>&1 || true  # as scripts/test.sh does
exec .venv/bin/agentrl loop "$@"
