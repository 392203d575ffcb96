#!/usr/bin/env bash
# TPC-H lineitem (scale factor 1 by default: 6M rows, ~725 MB of CSV) loaded
# by COPY INTO against DuckDB on the same 8 CSV and 8 zstd Parquet files
# (benches/compare_bulk.py). Installs DuckDB and the TPC-H generator into
# .venv, builds icestage in release mode and prints time, rows/s, peak RSS
# and the ratio. Usage: scripts/bench-bulk.sh [--sf N] [--repeat N]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-baselines.sh
.venv/bin/python benches/compare_bulk.py --icestage "$CARGO_TARGET_DIR/release/icestage" "$@"
