#!/usr/bin/env bash
# Promotion of an upload whose rows reference 1,000 files of 100 KB to 1 MB
# (benches/compare_files.py): builds icestage in release mode, prepares
# .venv, prints the promotion's time, throughput and peak RSS beside
# coreutils copying and hashing the same files in the same run.
# Extra arguments go to the script, e.g. --files 200.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
./scripts/setup-venv.sh
cargo build --release --locked --bin icestage
.venv/bin/python benches/compare_files.py --icestage "$CARGO_TARGET_DIR/release/icestage" "$@"
