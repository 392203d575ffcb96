#!/usr/bin/env bash
# Runs Apache PyIceberg 0.12.0's own integration suite (tests/integration)
# against a release build of `icestage serve`'s REST catalog.
#
# PyIceberg's test files are fetched from the package's source distribution
# on PyPI at run time (sha256-pinned) into the cache folder; none of them is
# kept in this repository. The suite's `session_catalog` fixture reaches a
# REST catalog at http://localhost:8181 with S3 at http://localhost:9000:
# this script serves icestage (a SQL catalog whose warehouse is
# s3://warehouse/ on moto's S3 emulator at :9000, and a catalog token reaching
# every table), puts tests/conformance/proxy.py on :8181 in front of its
# /iceberg (adding that token where a request has none), and loads
# tests/conformance/serve_plugin.py, which lists what is left out and why.
#
#   ./scripts/conformance-pyiceberg.sh                 # the whole suite
#   ./scripts/conformance-pyiceberg.sh -k namespace    # pytest arguments
#   ICESTAGE_BIN=path/to/icestage ./scripts/conformance-pyiceberg.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cargo-env.sh

version=0.12.0
sha256=19f165d298054f9436108691098b60fa0fa99d0eff5fb884700c43b29334a39d
cache="${XDG_CACHE_HOME:-$HOME/.cache}/icestage/conformance"
mkdir -p "$cache"

sdist="$cache/pyiceberg-$version.tar.gz"
if ! echo "$sha256  $sdist" | sha256sum -c --status 2>/dev/null; then
    echo "==> fetching PyIceberg $version's source distribution"
    url=$(curl -fsS -H 'Accept: application/vnd.pypi.simple.v1+json' https://pypi.org/simple/pyiceberg/ |
        python3 -c "import json, sys; print(next(f['url'] for f in json.load(sys.stdin)['files'] if f['filename'] == 'pyiceberg-$version.tar.gz'))")
    curl -fsS -o "$sdist.part" "$url"
    echo "$sha256  $sdist.part" | sha256sum -c --status || { echo "error: $url does not have the pinned sha256" >&2; exit 1; }
    mv "$sdist.part" "$sdist"
fi
suite="$cache/pyiceberg-$version"
if [ ! -d "$suite/tests/integration" ]; then
    tar xzf "$sdist" -C "$cache"
fi
# The tests only: the suite imports the installed PyIceberg (with its
# compiled Avro decoder), not these sources.
rm -rf "$suite/pyiceberg"

venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
echo "==> the suite's Python packages (PyIceberg $version from PyPI, pytest, pyspark for imports)"
# In two steps: s3fs pins a botocore that moto's boto3 is newer than, and
# one resolution of both is refused (the suite does not use s3fs's client).
# (`hive` brings thrift, which the suite's Hive modules import.)
pip() {
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 |
        grep -v "dependency resolver\|aiobotocore\|requires botocore" || true
}
pip "pyiceberg[pyarrow,pandas,sql-sqlite,s3fs,hive,pyiceberg-core]==$version"
pip pytest==9.1.1 pytest-lazy-fixtures==1.4.1 pytest-mock==3.15.1 requests-mock==1.12.1 \
    fastavro==1.12.2 "moto[server]==5.2.5" pyspark==4.0.1 pytz duckdb==1.4.4 \
    duckdb-ext-iceberg==1.4.4.20260205 duckdb-ext-avro==1.4.4.20260205 \
    duckdb-ext-httpfs==1.4.4.20260205

# ICESTAGE_BIN names a binary already built (the test script passes its
# debug build); otherwise the release build is made here.
binary="${ICESTAGE_BIN:-}"
if [ -z "$binary" ]; then
    echo "==> cargo build --release --bin icestage"
    cargo build --release --locked --bin icestage
    binary="$CARGO_TARGET_DIR/release/icestage"
fi

work=$(mktemp -d)
cleanup() {
    [ -n "${proxy_pid:-}" ] && kill "$proxy_pid" 2>/dev/null || true
    [ -n "${serve_pid:-}" ] && kill "$serve_pid" 2>/dev/null || true
    [ -n "${moto_pid:-}" ] && kill "$moto_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$venv/bin/python" -c "
from moto.server import ThreadedMotoServer
import boto3, signal, sys
server = ThreadedMotoServer(ip_address='127.0.0.1', port=9000)
server.start()
boto3.client('s3', endpoint_url='http://127.0.0.1:9000', region_name='us-east-1',
             aws_access_key_id='admin', aws_secret_access_key='password').create_bucket(Bucket='warehouse')
print('moto ready', flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
" > "$work/moto.log" 2>&1 &
moto_pid=$!
until grep -q "moto ready" "$work/moto.log"; do
    kill -0 "$moto_pid" 2>/dev/null || { cat "$work/moto.log" >&2; exit 1; }
    sleep 0.2
done

token="sk_conformance_$(date +%s)"
cat > "$work/serve.toml" <<TOML
[[catalogs]]
name = "local"
type = "sql"
[catalogs.config]
uri = "sqlite:$work/catalog.db?mode=rwc"
warehouse = "s3://warehouse"
region = "us-east-1"
"s3.endpoint" = "http://127.0.0.1:9000"
access_key_id = "admin"
secret_access_key = "password"

[service]
listen = "127.0.0.1:0"
requests_per_minute = 1000000
max_body_bytes = 67108864

[[service.tokens]]
name = "conformance"
token = "$token"
tables = ["*"]
operations = ["catalog"]
TOML
ICESTAGE_LOG=warn "$binary" serve --config "$work/serve.toml" > "$work/serve.log" 2>&1 &
serve_pid=$!
until grep -q "listening on" "$work/serve.log"; do
    kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    sleep 0.2
done
serve_url=$(sed -n 's/^icestage serve: listening on //p' "$work/serve.log")
# The port the suite's REST fixtures name.
catalog_port=8181
"$venv/bin/python" tests/conformance/proxy.py "$catalog_port" "$serve_url/iceberg" "$token" > "$work/proxy.log" 2>&1 &
proxy_pid=$!
until grep -q "proxy ready" "$work/proxy.log"; do
    kill -0 "$proxy_pid" 2>/dev/null || { cat "$work/proxy.log" >&2; exit 1; }
    sleep 0.2
done

# What upstream's Spark provisioning leaves that every test expects: the
# namespace `default`.
curl -fsS -o /dev/null -X POST http://127.0.0.1:$catalog_port/v1/namespaces \
    -H 'content-type: application/json' -d '{"namespace": ["default"]}'

echo "==> PyIceberg $version's integration suite against icestage serve"
plugins="$PWD/tests/conformance"
status=0
# test_catalog.py runs its cases on a second REST fixture too
# (`rest_test_catalog`), the catalog PYICEBERG_TEST_CATALOG names in
# PyIceberg's configuration; here it is serve again, through the proxy.
(cd "$suite" &&
    PYTHONPATH="$plugins" \
    AWS_REGION=us-east-1 \
    PYICEBERG_TEST_CATALOG=icestage \
    PYICEBERG_CATALOG__ICESTAGE__URI=http://localhost:$catalog_port \
    "$venv/bin/python" -m pytest tests/integration -p serve_plugin -q -rs \
        "$@") || status=$?
exit "$status"
