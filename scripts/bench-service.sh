#!/usr/bin/env bash
# The service load test (200 upload sessions at once into one target through
# the API, every batch landing exactly once) against `icestage serve` built
# with the profile named by PROFILE (default: release, what ships;
# `PROFILE=quick` measures the development profile): prints throughput and
# p50/p99/max latency per endpoint. The clients (HTTP and the Iceberg writes
# through DataFusion) run in the test binary, always built with the release
# profile: a debug build of them takes as much CPU as the service, on the
# same 2 cores, and one client build keeps profiles comparable. It runs twice, one
# after the other: on the embedded SQLite catalog, then on a fresh database
# of the PostgreSQL server ICESTAGE_TEST_POSTGRES names (default
# postgres://postgres@127.0.0.1:5432/postgres).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
./scripts/setup-venv.sh
profile="${PROFILE:-release}"
cargo build --profile "$profile" --locked --bin icestage
export ICESTAGE_TEST_POSTGRES="${ICESTAGE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/postgres}"
cargo test --release --locked --test it --no-run
echo "==> profile $profile; load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
ICESTAGE_SERVE_BIN="$CARGO_TARGET_DIR/$profile/icestage" \
    cargo test --release --locked --test it service::load::two_hundred_concurrent_upload_sessions -- --nocapture --test-threads 1
