#!/usr/bin/env bash
# Query planning in the shipped binary against DataFusion's Python wheel of
# the same major version (benches/compare_plan.py), in one run. Builds
# icestage with the profile named by PROFILE (default: release, what ships;
# `PROFILE=quick` measures the development profile) and installs the wheel
# into .venv. Extra arguments go to the script, e.g. --plans 500.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
./scripts/setup-venv.sh
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r benches/requirements.txt
profile="${PROFILE:-release}"
cargo build --profile "$profile" --locked --bin icestage
.venv/bin/python benches/compare_plan.py --icestage "$CARGO_TARGET_DIR/$profile/icestage" "$@"
