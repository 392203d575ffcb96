#!/usr/bin/env bash
# Runs Apache PyIceberg 0.12.0's own integration suite (tests/integration)
# against a release build of `icestage serve`'s REST catalog.
#
# PyIceberg's test files are fetched from the package's source distribution
# on PyPI at run time (sha256-pinned) into the cache folder; none of them is
# kept in this repository. The suite's `session_catalog` fixture reaches
# http://localhost:8181 with S3 at http://localhost:9000: this script serves
# icestage there (a SQL catalog whose warehouse is s3://warehouse/ on moto's
# S3 emulator, and a catalog token reaching every table, given to PyIceberg
# as PYICEBERG_CATALOG__LOCAL__TOKEN) and loads tests/conformance/
# serve_plugin.py, which lists what is left out and why.
#
#   ./scripts/conformance-pyiceberg.sh                 # the whole suite
#   ./scripts/conformance-pyiceberg.sh -k namespace    # pytest arguments
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
[ -d "$suite/tests/integration" ] || tar xzf "$sdist" -C "$cache"

venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
echo "==> the suite's Python packages (PyIceberg $version from PyPI, pytest, pyspark for imports)"
# In two steps: s3fs pins a botocore that moto's boto3 is newer than, and
# one resolution of both is refused (the suite does not use s3fs's client).
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "pyiceberg[pyarrow,pandas,sql-sqlite,s3fs,pyiceberg-core]==$version"
"${pip[@]}" pytest==9.1.1 pytest-lazy-fixtures==1.4.1 pytest-mock==3.15.1 requests-mock==1.12.1 \
    fastavro==1.12.2 "moto[server]==5.2.5" pyspark==4.0.1 2>&1 | grep -v "dependency resolver\|aiobotocore" || true

echo "==> cargo build --release --bin icestage"
cargo build --release --locked --bin icestage

work=$(mktemp -d)
cleanup() {
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
warehouse = "s3://warehouse/wh"
region = "us-east-1"
"s3.endpoint" = "http://127.0.0.1:9000"
access_key_id = "admin"
secret_access_key = "password"

[service]
listen = "127.0.0.1:8181"
requests_per_minute = 1000000
max_body_bytes = 67108864

[[service.tokens]]
name = "conformance"
token = "$token"
tables = ["*"]
operations = ["catalog"]
TOML
ICESTAGE_LOG=warn "$CARGO_TARGET_DIR/release/icestage" serve --config "$work/serve.toml" > "$work/serve.log" 2>&1 &
serve_pid=$!
until grep -q "listening on" "$work/serve.log"; do
    kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    sleep 0.2
done

echo "==> PyIceberg $version's integration suite against icestage serve"
plugins="$PWD/tests/conformance"
status=0
(cd "$suite" &&
    PYTHONPATH="$plugins" \
    PYICEBERG_CATALOG__LOCAL__TOKEN="$token" \
    AWS_REGION=us-east-1 \
    "$venv/bin/python" -m pytest tests/integration -p serve_plugin -q -rs \
        --junitxml="$cache/results.xml" "$@") || status=$?
"$venv/bin/python" - "$cache/results.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

suites = ET.parse(sys.argv[1]).getroot()
suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
total, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(f"==> {total - failures - errors - skipped} passed, {failures} failed, {errors} errors, "
      f"{skipped} left out (reasons above) of {total}")
PY
exit "$status"
