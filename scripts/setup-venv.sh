#!/usr/bin/env bash
# Creates (or completes) .venv with what the tests drive: PyIceberg, moto's
# server and DuckDB, pinned in tests/python/requirements.txt. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $("$python" --version)" >&2
    "$python" -m venv .venv
fi
echo "==> installing tests/python/requirements.txt into .venv" >&2
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
.venv/bin/python -c "import pyiceberg, pyiceberg_core, moto, duckdb, psycopg, s3fs; print('    pyiceberg', pyiceberg.__version__, '| moto', moto.__version__, '| duckdb', duckdb.__version__)" >&2
