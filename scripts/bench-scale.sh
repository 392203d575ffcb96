#!/usr/bin/env bash
# Per-upload cost as uploads accumulate in one target (benches/scale.rs):
# 1,000 uploads in rounds of 100, or 10,000 with --10k. Prints each round's
# time per upload, the warehouse's size, and the last round against the
# second. Release build. --maintain: the target maintained after each
# round; --rewrite: REWRITE DATA FILES at the end, a full scan timed before
# and after.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh
uploads=1000
if [[ "${1:-}" == "--10k" ]]; then uploads=10000; shift; fi
cargo bench --locked --bench scale -- --uploads "$uploads" "$@"
