#!/usr/bin/env bash
# The same statements here and on a Ballista cluster of one scheduler and
# two executor processes on this machine (release build, feature
# `cluster`), timed in the same run: PROMOTE's proof and rules (dry run) of
# an upload against a large target, CREATE DOWNLOAD of a join and an
# aggregate, COPY INTO of many CSV files. Prints seconds and the ratio
# cluster / here. On one machine the cluster adds its overhead (planning
# through the scheduler, shuffles through Arrow Flight) to the same cores:
# the ratio is that overhead, not a speed-up.
#
#   ./scripts/bench-cluster.sh [--target-rows N] [--upload-rows N] [--files N]
#
# The release build with the feature uses its own target directory, so the
# README's default build is not rebuilt by it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh

target_rows=2000000
upload_rows=500000
files=200
while [ $# -gt 0 ]; do
    case "$1" in
        --target-rows) target_rows="$2"; shift 2 ;;
        --upload-rows) upload_rows="$2"; shift 2 ;;
        --files) files="$2"; shift 2 ;;
        *) echo "usage: $0 [--target-rows N] [--upload-rows N] [--files N]" >&2; exit 2 ;;
    esac
done

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR%/}-cluster"
cargo build --locked --release --features cluster
bin="$CARGO_TARGET_DIR/release/icestage"

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
scheduler="127.0.0.1:$(port)"
# Every process of the cluster, and its clients, share one secret.
head -c 32 /dev/urandom | base64 >"$work/cluster.secret"
export ICESTAGE_CLUSTER_SECRET_FILE="$work/cluster.secret"
RUST_LOG=warn "$bin" scheduler --bind "$scheduler" 2>"$work/scheduler.log" &
pids+=($!)
for n in 1 2; do
    RUST_LOG=warn "$bin" executor --scheduler "$scheduler" --bind "127.0.0.1:$(port)" \
        --work-dir "$work/executor$n" 2>"$work/executor$n.log" &
    pids+=($!)
done
sleep 3

sql() { "$bin" --warehouse "$work/warehouse" -q --format csv -c "$1"; }
on_cluster="SET icestage.cluster = 'df://$scheduler';"
# Runs $1, keeps its output in $work/out, prints the seconds it took.
seconds() {
    local start end
    start=$(date +%s.%N)
    sql "$1" >"$work/out"
    end=$(date +%s.%N)
    echo "$end - $start" | bc
}
# The value of column $1 in the last result row of $work/out.
column() {
    python3 - "$1" "$work/out" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[2])))
header = max(i for i, r in enumerate(rows) if sys.argv[1] in r)
print(rows[-1][rows[header].index(sys.argv[1])])
EOF
}
# Fails the benchmark when $1 (what) is $2 rather than $3.
expect() {
    if [ "$2" != "$3" ]; then
        echo "error: $1 is $2, expected $3" >&2
        exit 1
    fi
}

echo "==> data: target $target_rows rows, upload $upload_rows rows, $files CSV files"
sql "CREATE SCHEMA bench;
     CREATE TABLE bench.t (id BIGINT NOT NULL, account VARCHAR NOT NULL, amount BIGINT NOT NULL);
     ALTER TABLE bench.t ADD CONSTRAINT one_id UNIQUE (id);
     ALTER TABLE bench.t ADD CONSTRAINT positive CHECK (amount > 0);" >/dev/null
# Eight inserts each: eight or more files to spread over the executors.
id=$(sql "CREATE UPLOAD FOR bench.t" | tail -1 | cut -d, -f1)
for part in 0 1 2 3 4 5 6 7; do
    from=$((part * target_rows / 8)); to=$(((part + 1) * target_rows / 8))
    sql "INSERT INTO bench.t SELECT value, 'acct_' || (value % 1000), 1 + value % 997 FROM range($from, $to)" >/dev/null
    from=$((part * upload_rows / 8)); to=$(((part + 1) * upload_rows / 8))
    sql "INSERT INTO staging.upload_$id SELECT $target_rows + value, 'acct_' || (value % 1000), 1 + value % 991 FROM range($from, $to)" >/dev/null
done
mkdir -p "$work/files"
python3 - "$work/files" "$files" <<'EOF'
import sys
folder, count = sys.argv[1], int(sys.argv[2])
for n in range(count):
    with open(f"{folder}/part-{n:05}.csv", "w") as f:
        f.write("id,account,amount\n")
        for i in range(1000):
            f.write(f"{n * 1000 + i},acct_{i % 100},{i}\n")
EOF

printf '%-34s %10s %10s %8s\n' "statement" "here s" "cluster s" "ratio"
report() {
    printf '%-34s %10.2f %10.2f %8.2f\n' "$1" "$2" "$3" "$(echo "$3 / $2" | bc -l)"
}
promote="PROMOTE UPLOAD '$id' WITH (dry_run = true)"
here=$(seconds "$promote")
expect "rows proved here" "$(column rows)" "$upload_rows"
there=$(seconds "$on_cluster $promote")
expect "rows proved on the cluster" "$(column rows)" "$upload_rows"
expect "where the proof ran" "$(column ran_on)" "df://$scheduler"
report "PROMOTE (dry run, proof + rules)" "$here" "$there"

download="CREATE DOWNLOAD WITH (wait = true) AS SELECT t.account, count(*) AS n, sum(t.amount) AS total
          FROM bench.t t JOIN bench.t o ON t.id = o.id GROUP BY t.account"
here=$(seconds "$download")
expect "download rows here" "$(sql "SELECT rows FROM download_status('$(column download_id)')" | tail -1)" 1000
there=$(seconds "$on_cluster $download")
expect "download rows on the cluster" "$(sql "SELECT rows FROM download_status('$(column download_id)')" | tail -1)" 1000
expect "where the download ran" "$(column ran_on)" "df://$scheduler"
report "CREATE DOWNLOAD (join, aggregate)" "$here" "$there"

here=$(seconds "COPY INTO bench.copied_here FROM '$work/files/' WITH (all_files = true)")
expect "rows copied here" "$(column rows)" "$((files * 1000))"
there=$(seconds "$on_cluster COPY INTO bench.copied_there FROM '$work/files/' WITH (all_files = true)")
expect "rows copied on the cluster" "$(column rows)" "$((files * 1000))"
expect "where the copy ran" "$(column ran_on)" "df://$scheduler"
report "COPY INTO ($files files)" "$here" "$there"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
