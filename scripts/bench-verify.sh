#!/usr/bin/env bash
# Verification at volume (benches/compare_verify.py): TPC-H lineitem (scale
# factor 6 by default: about 1.2 GB of zstd Parquet) staged into an upload,
# then PROMOTE UPLOAD ... WITH (dry_run = true) against DuckDB decoding the
# same files. Installs DuckDB and the TPC-H generator into .venv, builds
# icestage in release mode and prints seconds, MB/s per core, peak RSS and
# the ratio. Usage: scripts/bench-verify.sh [--sf N] [--repeat N]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-baselines.sh
.venv/bin/python benches/compare_verify.py --icestage "$CARGO_TARGET_DIR/release/icestage" "$@"
