#!/usr/bin/env bash
# Builds gateway-front/ (agentrl's compiled gateway front) offline from Debian's packaged
# crate sources: never crates.io. As root it apt-installs the librust-*-dev packages the
# crate needs (their dependencies come along); the binary lands in
# gateway-front/target/release/gateway-front, where `agentrl.serving.front` finds it.
# FRONT_PROFILE=quick: an unoptimised build in target/quick/ (the tests' build, half the CPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# apt-get one at a time: scripts/test.sh builds the gateway front (its crates may need
# apt-get too) beside the setup, and a second apt-get would fail on dpkg's lock
apt_get() { if command -v flock >/dev/null 2>&1; then flock /tmp/agentrl-apt.lock apt-get "$@"; else apt-get "$@"; fi; }
crates=(
  'librust-hyper+full-dev' 'librust-tokio+full-dev' librust-serde-json-dev
  'librust-serde+derive-dev' librust-blake2b-simd-dev librust-bytes-dev
  librust-futures-util-dev librust-rand-dev
)
missing=0
for c in hyper-0.14 tokio-1 serde_json-1 serde_derive-1 blake2b_simd-1 futures-util-0.3 rand-0.8; do
  compgen -G "/usr/share/cargo/registry/$c.*" >/dev/null || missing=1
done
if [ "$missing" = 1 ] || [ "${FRONT_APT:-}" = 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[front] apt-get install ${crates[*]}"
    DEBIAN_FRONTEND=noninteractive apt_get install -y -qq --no-install-recommends "${crates[@]}" \
      || { apt_get update -qq && DEBIAN_FRONTEND=noninteractive apt_get install -y -qq \
             --no-install-recommends "${crates[@]}"; }
  else
    echo "[front] Debian's Rust crate sources are missing: as root, apt-get install ${crates[*]}" >&2
    exit 1
  fi
fi
cargo="$(command -v cargo || echo "$HOME/.cargo/bin/cargo")"
[ -x "$cargo" ] || { echo "[front] cargo not found (rustup or apt-get install cargo)" >&2; exit 1; }
cd "$root/gateway-front"
# .cargo/config.toml points crates-io at /usr/share/cargo/registry; --offline: no network
profile="${FRONT_PROFILE:-release}"
"$cargo" build --profile "$profile" --offline
echo "[front] built $root/gateway-front/target/$profile/gateway-front"
