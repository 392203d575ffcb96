#!/usr/bin/env bash
# The service load test (200 upload sessions at once into one target through
# the API, every batch landing exactly once) against a release build of
# `icestage serve`: prints throughput and p50/p99/max latency per endpoint.
# The clients (HTTP and the Iceberg writes) run in the debug test binary.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
./scripts/setup-venv.sh
cargo build --release --locked --bin icestage
echo "==> load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
ICESTAGE_SERVE_BIN="$CARGO_TARGET_DIR/release/icestage" \
    cargo test --locked --test it service::load::two_hundred_concurrent_upload_sessions -- --nocapture
