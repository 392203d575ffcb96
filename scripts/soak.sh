#!/usr/bin/env bash
# The soak (tests/it/service/soak.rs) for longer: clients uploading,
# completing, aborting, leaving uploads to expire and reading downloads
# through two `icestage serve` replicas, replicas SIGKILLed at random; then
# every promoted upload's rows are checked in the target, exactly once.
#   ./scripts/soak.sh [--minutes N] [--clients N]    (default 10 minutes, 6 clients)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=10
clients=6
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --clients) clients="$2"; shift 2 ;;
    *) echo "usage: $0 [--minutes N] [--clients N]" >&2; exit 2 ;;
  esac
done
. scripts/cargo-env.sh
./scripts/setup-venv.sh
ICESTAGE_SOAK_SECS=$((minutes * 60)) ICESTAGE_SOAK_CLIENTS="$clients" \
  cargo test --locked --test it service::soak -- --nocapture
