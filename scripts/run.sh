#!/usr/bin/env bash
# Sets up .venv (if needed) and runs the main job: SmolLM2 learns text FrozenLake as a
# valid-action policy (configs/frozenlake-valid-action.yaml), then the base and the trained
# model are compared on 50 held-out maps. Ends with the table, a PNG of held-out success per
# iteration (runs/learning/heldout_success.png) and, as the last line, one JSON object:
# base_heldout_success, trained_heldout_success, heldout_seeds, wall_s.
# Extra arguments go to `agentrl learn` (e.g. --iterations 20, --model tiny). The whole loop on
# the whole stack is `agentrl loop` (about 15 minutes); it stays off run.sh until it reaches
# the learning target reliably: in 2 measured runs its fourth version reached 0.70 once and
# 0.00 once (BENCHMARKS.md, "agentrl loop").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/agentrl learn "$@"
