# Sourced by the scripts that run cargo: one build directory and one linker
# for every clone on this machine, so that a fresh clone (CI) reuses the
# build instead of redoing it.
#
# * CARGO_TARGET_DIR defaults to a folder outside the clone.
# * The linker driver (scripts/cc-link: mold when installed, cc otherwise)
#   is copied next to it and named by that stable path. Cargo fingerprints
#   the linker's path, so a path inside the clone would make every clone
#   rebuild all dependencies.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/icestage/target}"
mkdir -p "$CARGO_TARGET_DIR"
if ! cmp -s scripts/cc-link "$CARGO_TARGET_DIR/cc-link"; then
    cp scripts/cc-link "$CARGO_TARGET_DIR/cc-link.new"
    chmod +x "$CARGO_TARGET_DIR/cc-link.new"
    mv "$CARGO_TARGET_DIR/cc-link.new" "$CARGO_TARGET_DIR/cc-link"
fi
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER="$CARGO_TARGET_DIR/cc-link"
# * As the binary does, no backtraces are captured for iceberg-rust's
#   discarded error values (see `no_library_backtraces` in
#   src/bin/icestage/main.rs); a panic still prints its own.
export RUST_LIB_BACKTRACE="${RUST_LIB_BACKTRACE:-0}"
