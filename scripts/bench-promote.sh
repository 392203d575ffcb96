#!/usr/bin/env bash
# Promotion against the reference PyIceberg flow at 1M, 5M and 10M rows
# (benches/compare_promote.py): builds icestage in release mode, prepares
# .venv, prints time and peak RSS of both with their ratios.
# Extra arguments go to the script, e.g. --rows 100000.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
./scripts/setup-venv.sh
cargo build --release --locked --bin icestage
.venv/bin/python benches/compare_promote.py --icestage "$CARGO_TARGET_DIR/release/icestage" "$@"
