#!/usr/bin/env bash
# Runs icestage's whole test suite from a fresh clone.
#
# It installs what the tests need first: a Python virtual environment in
# .venv (ignored by git) with PyIceberg, the third-party Iceberg client the
# tests drive, and moto's server, the local AWS emulator; it checks that the
# PostgreSQL server of the PostgreSQL catalog's tests answers
# (ICESTAGE_TEST_POSTGRES, default postgres://postgres@127.0.0.1:5432), and
# installs curl and jq where missing. Then it runs every
# Rust test: unit tests, the sqllogictest files under sql/, the shell and
# PyIceberg integration tests, the Ballista cluster tests (the `cluster`
# feature) and the doctests; then PyIceberg's own integration suite against
# `serve` (scripts/conformance-pyiceberg.sh), the fuzz targets briefly, and
# that the default build compiles.
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

# The manual's shell walk-throughs (tests/it/docs.rs) run curl and jq as a
# reader does.
for tool in curl jq; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            echo "==> installing $tool (Debian package)" >&2
            apt-get install -y -qq "$tool" >/dev/null
        else
            echo "error: $tool is not installed: the manual's walk-throughs use it; install it (apt-get install $tool)" >&2
            exit 1
        fi
    fi
done

# The PostgreSQL catalog's tests create a fresh database per test on this
# server (and drop it after); without one they would fail one by one, so
# say it once, here.
export ICESTAGE_TEST_POSTGRES="${ICESTAGE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/postgres}"
if ! .venv/bin/python - "$ICESTAGE_TEST_POSTGRES" <<'EOF'
import sys

import psycopg

try:
    psycopg.connect(sys.argv[1], connect_timeout=5).close()
except Exception as e:
    print(f"error: no PostgreSQL answers at {sys.argv[1]}: {str(e).strip()}", file=sys.stderr)
    sys.exit(1)
EOF
then
    echo "  start a PostgreSQL server there, or set ICESTAGE_TEST_POSTGRES=postgres://user@host:port/database" >&2
    echo "  to one where that user may create databases" >&2
    exit 1
fi

# The `cluster` feature (Ballista) is off in the README's build and on here:
# its tests start a scheduler and executor processes on 127.0.0.1.
echo "==> cargo test --features cluster (target dir: $CARGO_TARGET_DIR)"
cargo test --locked --features cluster "$@"

# PyIceberg's own integration suite (fetched at its pinned version) against
# serve's REST catalog, on the debug binary the tests just built; what fails
# today is listed, with why, in tests/conformance/KNOWN_FAILURES.
echo "==> PyIceberg 0.12.0's integration suite against icestage serve"
ICESTAGE_BIN="$CARGO_TARGET_DIR/debug/icestage" ./scripts/conformance-pyiceberg.sh -p no:cacheprovider

# The parser fuzz harness, briefly: every target runs FUZZ_SECONDS (default
# 10) on fresh mutations of its seeds; a panic fails the run and saves the
# input under fuzz/findings/ (see fuzz/main.rs).
echo "==> fuzz/run.sh ${FUZZ_SECONDS:-10}"
./fuzz/run.sh "${FUZZ_SECONDS:-10}"

# The default build (no cluster) must keep compiling: its code paths
# answer a cluster setting with how to get the feature.
echo "==> cargo check (default features)"
cargo check --locked --lib --bins
