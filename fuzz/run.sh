#!/usr/bin/env bash
# Runs each parser fuzz target (see fuzz/main.rs) for SECONDS (default 60)
# each; exits 1 when any input panicked (saved under fuzz/findings/).
#
#   ./fuzz/run.sh            # every target, 60 s each
#   ./fuzz/run.sh 10 manifest-list
#   FUZZ_PROFILE=release ./fuzz/run.sh 300
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
seconds="${1:-60}"
target="${2:-all}"
profile="${FUZZ_PROFILE:-dev}"
cargo run --locked --quiet --profile "$profile" --example fuzz -- "$target" "$seconds"
