#!/usr/bin/env bash
# The service load test (200 upload sessions at once into one target through
# the API, every batch landing exactly once) against a release build of
# `icestage serve`: prints throughput and p50/p99/max latency per endpoint.
# The clients (HTTP and the Iceberg writes through DataFusion) run in the
# test binary, built with the release profile too: a debug build of them
# takes as much CPU as the service, on the same 2 cores. It runs twice, one
# after the other: on the embedded SQLite catalog, then on a fresh database
# of the PostgreSQL server ICESTAGE_TEST_POSTGRES names (default
# postgres://postgres@127.0.0.1:5432/postgres).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
./scripts/setup-venv.sh
cargo build --release --locked --bin icestage
export ICESTAGE_TEST_POSTGRES="${ICESTAGE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/postgres}"
echo "==> load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
ICESTAGE_SERVE_BIN="$CARGO_TARGET_DIR/release/icestage" \
    cargo test --release --locked --test it service::load::two_hundred_concurrent_upload_sessions -- --nocapture --test-threads 1
