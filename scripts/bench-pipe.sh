#!/usr/bin/env bash
# Pipes against COPY INTO on the same 1,000 small files (benches/pipe.rs):
# the baseline statement, a pipe given the files at once, and a pipe fed
# 100 files a second (end-to-end lag per file). Release build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
cargo bench --locked --bench pipe
