#!/usr/bin/env bash
# The REST catalog's signer under load: a release build of `icestage serve`
# on an S3 warehouse in the emulator (moto's server, checking every
# signature), one open upload, and RATE signing requests a second (default
# 500) for SECONDS (default 20) from tests/python/sign_load.py, open loop;
# then the same load on GET /iceberg/v1/config with the same session token
# as the baseline (the session check alone). Prints p50/p99/max of each and
# the ratio of the p99s. Target: p99 under 5 ms at 500 signatures/s.
#
#   scripts/bench-signing.sh [RATE] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-500}"
seconds="${2:-20}"
. scripts/cargo-env.sh
./scripts/setup-venv.sh
cargo build --release --locked --bin icestage
bin="$CARGO_TARGET_DIR/release/icestage"
python=.venv/bin/python
work=$(mktemp -d)
cleanup() {
    [ -n "${serve_pid:-}" ] && kill "$serve_pid" 2>/dev/null || true
    exec 3>&- || true
    rm -rf "$work"
}
trap cleanup EXIT

# The emulator: it stops when its standard input closes (fd 3 here).
mkfifo "$work/moto.in"
"$python" tests/python/moto_server.py 0 < "$work/moto.in" > "$work/moto.out" 2>/dev/null &
exec 3> "$work/moto.in"
for _ in $(seq 1 600); do
    grep -q "listening on" "$work/moto.out" 2>/dev/null && break
    sleep 0.1
done
port=$(sed -n 's/^listening on //p' "$work/moto.out")
endpoint="http://127.0.0.1:$port"
keys=$("$python" tests/python/aws_setup.py signing-identity "$endpoint" lake)
key=$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["access_key_id"])' "$keys")
secret=$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["secret_access_key"])' "$keys")

cat > "$work/catalogs.toml" <<TOML
[[catalogs]]
name = "lake"
type = "sql"
[catalogs.config]
uri = "sqlite:$work/catalog.db?mode=rwc"
warehouse = "s3://lake/wh"
region = "us-east-1"
"s3.endpoint" = "$endpoint"
access_key_id = "$key"
secret_access_key = "$secret"
TOML
cat "$work/catalogs.toml" - > "$work/service.toml" <<TOML

[service]
listen = "127.0.0.1:0"
requests_per_minute = 1000000
require_remote_signing = true
log_format = "json"
[[service.tokens]]
name = "bench"
token = "sk_bench"
tables = ["payments.transactions"]
operations = ["upload"]
TOML
"$bin" --catalog-config "$work/catalogs.toml" -q -c "CREATE SCHEMA payments" \
    -c "CREATE TABLE payments.transactions (id BIGINT NOT NULL, amount BIGINT)" > /dev/null

ICESTAGE_LOG=warn "$bin" serve --config "$work/service.toml" 2> "$work/serve.err" &
serve_pid=$!
for _ in $(seq 1 600); do
    grep -q "listening on" "$work/serve.err" 2>/dev/null && break
    sleep 0.1
done
api=$(sed -n 's/^icestage serve: listening on //p' "$work/serve.err" | head -1)
created=$(curl -sf -X POST "$api/uploads" -H "Authorization: Bearer sk_bench" \
    -H 'content-type: application/json' -d '{"table": "payments.transactions"}')
id=$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["upload_id"])' "$created")
access=$(curl -sf -X POST "$api/uploads/$id/credentials" -H "Authorization: Bearer sk_bench")
token=$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["connection"]["token"])' "$access")
uri="$endpoint/lake/wh/staging/upload_$id/data/part-0.parquet"

echo "==> $rate signatures/s for ${seconds}s; load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
"$python" tests/python/sign_load.py "$api" "$token" "$uri" "$rate" "$seconds" | tee "$work/result.json"
echo "==> load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" - "$work/result.json" <<'PY'
import json, sys
loads = {r["load"]: r for r in map(json.loads, open(sys.argv[1]))}
sign, base = loads["sign"], loads["config"]
print(f"signer p99 {sign['p99_ms']} ms (target < 5 ms), errors {sign['errors']}; "
      f"baseline (session check, GET /v1/config) p99 {base['p99_ms']} ms; "
      f"ratio {sign['p99_ms'] / base['p99_ms']:.2f}")
PY
