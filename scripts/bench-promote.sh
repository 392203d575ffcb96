#!/usr/bin/env bash
# Promotion against the reference PyIceberg flow at 1M, 5M and 10M rows,
# staged by PyIceberg (a file per million rows) and by INSERT ... SELECT
# (benches/compare_promote.py): builds icestage with the profile named by
# PROFILE (default: release, what ships; `PROFILE=quick` measures the
# development profile), prepares .venv, prints time and peak RSS of both
# with their ratios.
# Extra arguments go to the script, e.g. --rows 100000.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
./scripts/setup-venv.sh
profile="${PROFILE:-release}"
cargo build --profile "$profile" --locked --bin icestage
.venv/bin/python benches/compare_promote.py --icestage "$CARGO_TARGET_DIR/$profile/icestage" "$@"
