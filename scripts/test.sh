#!/usr/bin/env bash
# Runs icestage's whole test suite from a fresh clone.
#
# It installs what the tests need first: a Python virtual environment in
# .venv (ignored by git) with PyIceberg, the third-party Iceberg client the
# tests drive, and moto's server, the local AWS emulator. Then it runs every
# Rust test: unit tests, the sqllogictest files under sql/, the shell and
# PyIceberg integration tests, the Ballista cluster tests (the `cluster`
# feature) and the doctests; then checks that the default build compiles.
#
# The cargo target directory defaults to a folder outside the clone so that
# repeated runs (and CI on this machine, from any clone) reuse the build;
# set CARGO_TARGET_DIR to choose another (see scripts/cargo-env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/cargo-env.sh

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo is not installed: install Rust from https://rustup.rs" >&2
    exit 1
fi

./scripts/setup-venv.sh

# The `cluster` feature (Ballista) is off in the README's build and on here:
# its tests start a scheduler and executor processes on 127.0.0.1.
echo "==> cargo test --features cluster (target dir: $CARGO_TARGET_DIR)"
cargo test --locked --features cluster "$@"

# The parser fuzz harness, briefly: every target runs FUZZ_SECONDS (default
# 10) on fresh mutations of its seeds; a panic fails the run and saves the
# input under fuzz/findings/ (see fuzz/main.rs).
echo "==> fuzz/run.sh ${FUZZ_SECONDS:-10}"
./fuzz/run.sh "${FUZZ_SECONDS:-10}"

# The default build (no cluster) must keep compiling: its code paths
# answer a cluster setting with how to get the feature.
echo "==> cargo check (default features)"
cargo check --locked --lib --bins
