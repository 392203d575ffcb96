#!/usr/bin/env bash
# COPY INTO against DuckDB on the same files (benches/compare_ingest.py):
# 1M rows as 8 CSV files, gzip'd CSV and Parquet. Installs DuckDB into .venv
# (the tests do not need it), builds icestage in release mode and prints the
# times, peak memory and ratios. Extra arguments go to the script.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-baselines.sh
.venv/bin/python benches/compare_ingest.py --icestage "$CARGO_TARGET_DIR/release/icestage" "$@"
