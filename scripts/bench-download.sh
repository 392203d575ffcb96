#!/usr/bin/env bash
# CREATE DOWNLOAD of a 20M-row table against DuckDB's COPY ... TO zstd
# Parquet of the same rows from the same files (benches/compare_download.py).
# Installs DuckDB into .venv, builds icestage in release mode and prints
# time, rows/s, peak RSS and the ratio.
# Usage: scripts/bench-download.sh [--rows N] [--repeat N]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-baselines.sh
.venv/bin/python benches/compare_download.py --icestage "$CARGO_TARGET_DIR/release/icestage" "$@"
