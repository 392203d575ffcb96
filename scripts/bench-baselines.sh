# Sourced by the comparison benchmarks whose baselines need more than the
# tests' .venv (DuckDB 2, the TPC-H generator: benches/requirements.txt),
# from the repository's root: the shared build settings, the .venv with
# those packages (./scripts/test.sh puts the tests' DuckDB back), and the
# release binary, at $CARGO_TARGET_DIR/release/icestage.
. scripts/cargo-env.sh
./scripts/setup-venv.sh
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r benches/requirements.txt
cargo build --release --locked --bin icestage
