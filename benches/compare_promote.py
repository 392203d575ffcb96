"""Promotion speed and memory: icestage's PROMOTE UPLOAD against the
reference flow of the design (PyIceberg: read the staging table into memory,
validate, append it to the target, purge the staging table).

Both flows promote the same rows, written into their staging tables on
the same embedded SQLite catalog, in the same run; each promotion runs in
its own process so its wall time and peak RSS (getrusage of the child) are
its own. The rows are staged two ways (`--staged-by`, both by default):

* `pyiceberg`: PyIceberg appends them a million at a time, one file per
  million rows (10 files for 10M);
* `insert`: icestage's `INSERT INTO <staging table> SELECT ... FROM
  range(N)` writes them, one file per core (2 files of several row groups
  on 2 cores).

    .venv/bin/python benches/compare_promote.py --icestage target/release/icestage [--rows 1000000 5000000 10000000] [--staged-by pyiceberg insert]

scripts/bench-promote.sh builds icestage and runs this with the defaults.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import load_catalog

TARGET_COLUMNS = (
    "(transaction_id VARCHAR NOT NULL, account_id VARCHAR NOT NULL, "
    "amount_cents BIGINT NOT NULL, currency VARCHAR NOT NULL, "
    "created_at TIMESTAMP WITH TIME ZONE NOT NULL)"
)
CHUNK = 1_000_000
# The rows both ways of staging write (`chunks`, `insert`): row i is
# transaction txn_i of account acct_(i mod ACCOUNTS), i cents, created i
# seconds after START.
ACCOUNTS = 1024  # a power of two: `chunks` takes the remainder as a mask
START = datetime(2026, 7, 1, tzinfo=UTC)
START_MICROS = int(START.timestamp()) * 1_000_000

# The reference implementation, as the design's source document writes it.
REFERENCE = r"""
import json, sys
import pyarrow.compute as pc
from pyiceberg.catalog import load_catalog
props, staging_name, target_name, upload_id = json.loads(sys.argv[1]), *sys.argv[2:5]
catalog = load_catalog(props.pop("name"), **props)
staging = catalog.load_table(staging_name)
rows = staging.scan().to_arrow()
errors = [f.name for f in staging.schema().fields if f.required and rows.column(f.name).null_count]
if errors:
    sys.exit(f"validation failed: {errors}")
target = catalog.load_table(target_name)
target.append(rows, snapshot_properties={"upload-id": upload_id})
catalog.purge_table(staging_name)
print(rows.num_rows)
"""


def icestage(binary, warehouse, sql):
    out = subprocess.run(
        [binary, "--warehouse", warehouse, "-q", "--format", "json", "-c", sql],
        capture_output=True, text=True,
    )
    if out.returncode != 0:
        sys.exit(f"icestage failed on {sql!r}: {out.stderr}")
    text = out.stdout.strip()
    return json.loads(text) if text else []


# Linux keeps a process's peak RSS across exec, so a child forked from this
# (large) process would report this process's memory. A small launcher
# process forks the measured command instead and reports its usage.
LAUNCHER = r"""
import json, os, sys, time
report, command = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(command[0], command)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as f:
    json.dump({"seconds": time.perf_counter() - start, "maxrss_kib": usage.ru_maxrss,
               "code": os.waitstatus_to_exitcode(status)}, f)
"""


def options(doc, repeat, repeat_help=None):
    """The options every comparison takes: the icestage binary and how many
    runs of each side; a script adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--icestage", required=True, help="path to the icestage binary (release build)")
    parser.add_argument("--repeat", type=int, default=repeat, help=repeat_help)
    return parser


def measured(command):
    """Runs `command`; returns (seconds, peak RSS in MiB, stdout)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".json") as report:
        subprocess.run([sys.executable, "-c", LAUNCHER, report.name, *command],
                       stdout=out, stderr=err, check=True)
        usage = json.load(open(report.name))
        out.seek(0)
        err.seek(0)
        if usage["code"] != 0:
            sys.exit(f"{command[0]} failed: {err.read().decode()}")
        return usage["seconds"], usage["maxrss_kib"] / 1024, out.read().decode()


def chunks(schema, rows):
    for offset in range(0, rows, CHUNK):
        n = min(CHUNK, rows - offset)
        ids = pa.array(range(offset, offset + n), pa.int64())
        yield pa.Table.from_arrays(
            [
                pc.binary_join_element_wise("txn_", pc.cast(ids, pa.string()), ""),
                pc.binary_join_element_wise("acct_", pc.cast(pc.bit_wise_and(ids, ACCOUNTS - 1), pa.string()), ""),
                ids,
                pa.array(["usd"] * n, pa.string()),
                pc.cast(pc.cast(pc.add(pc.multiply(ids, 1_000_000), START_MICROS), pa.int64()),
                        pa.timestamp("us", tz="UTC")),
            ],
            schema=schema,
        )


def fill(table, rows):
    schema = table.schema().as_arrow()
    for chunk in chunks(schema, rows):
        table.append(chunk)


def insert(binary, warehouse, table, rows):
    """The rows of `chunks`, written by icestage's INSERT ... SELECT."""
    icestage(binary, warehouse,
             f"INSERT INTO {table} SELECT concat('txn_', value), concat('acct_', value % {ACCOUNTS}), value, "
             f"'usd', to_timestamp_micros({START_MICROS} + value * 1000000) AT TIME ZONE 'UTC' FROM range({rows})")


STAGED_BY = ("pyiceberg", "insert")


def one_size(binary, rows, repeat, staged_by):
    with tempfile.TemporaryDirectory() as warehouse:
        icestage(binary, warehouse, "CREATE SCHEMA payments")
        icestage(binary, warehouse, f"CREATE TABLE payments.transactions {TARGET_COLUMNS}")
        icestage(binary, warehouse, f"CREATE TABLE payments.transactions_ref {TARGET_COLUMNS}")

        upload = icestage(binary, warehouse, "CREATE UPLOAD FOR payments.transactions")[0]
        props = upload["connection"]
        catalog = load_catalog(dict(props)["name"], **{k: v for k, v in props.items() if k != "name"})
        catalog.create_namespace_if_not_exists("staging_ref")
        reference_staging = "staging_ref.upload_" + upload["upload_id"]
        catalog.create_table(reference_staging, schema=catalog.load_table("payments.transactions_ref").schema())
        for table in (upload["staging_table"], reference_staging):
            if staged_by == "insert":
                insert(binary, warehouse, table, rows)
            else:
                fill(catalog.load_table(table), rows)
        staged = catalog.load_table(upload["staging_table"]).inspect.files()
        staged_bytes = sum(staged.column("file_size_in_bytes").to_pylist())

        # Each promotion runs `repeat` times on the same staged files: the
        # warehouse is put back as it was before each run, and written to
        # disk first, so that neither side pays for the other's writes.
        pristine = warehouse + ".pristine"
        shutil.copytree(warehouse, pristine)

        def afresh():
            shutil.rmtree(warehouse)
            shutil.copytree(pristine, warehouse)
            os.sync()

        def count(table):
            return icestage(binary, warehouse, f"SELECT count(*) AS n FROM {table}")[0]["n"]

        ours_runs, theirs_runs = [], []
        for _ in range(repeat):
            afresh()
            ours_runs.append(measured([binary, "--warehouse", warehouse, "-q", "--format", "json",
                                       "-c", f"PROMOTE UPLOAD '{upload['upload_id']}'"]))
            assert count("payments.transactions") == rows
            afresh()
            theirs_runs.append(measured([sys.executable, "-c", REFERENCE, json.dumps(props),
                                         reference_staging, "payments.transactions_ref",
                                         upload["upload_id"]]))
            assert count("payments.transactions_ref") == rows
        result = json.loads(ours_runs[-1][2])[0]
        shutil.rmtree(pristine)
        ours = (statistics.median(r[0] for r in ours_runs), max(r[1] for r in ours_runs))
        theirs = (statistics.median(r[0] for r in theirs_runs), max(r[1] for r in theirs_runs))
        spread = (min(r[0] for r in ours_runs), max(r[0] for r in ours_runs),
                  min(r[0] for r in theirs_runs), max(r[0] for r in theirs_runs))

        return {
            "rows": rows,
            "staged_by": staged_by,
            "files": result["files"],
            "path": result["path"],
            "icestage_s": ours[0],
            "reference_s": theirs[0],
            "icestage_rss_mb": ours[1],
            "reference_rss_mb": theirs[1],
            "spread": spread,
            "staged_bytes": staged_bytes,
        }


def main():
    parser = options(__doc__, 3, "promotions of each side per size; the median is shown")
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000, 10_000_000])
    parser.add_argument("--staged-by", nargs="+", choices=STAGED_BY, default=list(STAGED_BY),
                        help="who writes the staged files (see the module documentation)")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"# machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")
    header = (f"{'staged by':>9} {'rows':>10} {'files':>5} {'path':>9} | {'icestage s':>10} {'reference s':>11} {'speed-up':>8} | "
              f"{'icestage MiB':>12} {'reference MiB':>13} {'RSS ratio':>9}")
    print(header)
    print("-" * len(header))
    for staged_by, rows in ((s, n) for s in args.staged_by for n in args.rows):
        r = one_size(args.icestage, rows, args.repeat, staged_by)
        print(f"{r['staged_by']:>9} {r['rows']:>10} {r['files']:>5} {r['path']:>9} | {r['icestage_s']:>10.3f} {r['reference_s']:>11.3f} "
              f"{r['reference_s'] / r['icestage_s']:>7.1f}x | {r['icestage_rss_mb']:>12.1f} "
              f"{r['reference_rss_mb']:>13.1f} {r['reference_rss_mb'] / r['icestage_rss_mb']:>8.1f}x", flush=True)
        low, high, ref_low, ref_high = r["spread"]
        # The whole PROMOTE process (start-up, verification of every staged
        # byte, the commit) against the staged bytes: a floor on the
        # verification rate itself.
        per_core = r["staged_bytes"] / r["icestage_s"] / os.cpu_count() / 1e6
        print(f"{'':>37}   staged: {r['staged_bytes'] / 1e6:.1f} MB of zstd Parquet, verified and promoted at "
              f"{per_core:.0f} MB/s per core ({os.cpu_count()} cores)", flush=True)
        print(f"{'':>37}   runs: icestage {low:.3f}-{high:.3f} s, reference {ref_low:.3f}-{ref_high:.3f} s "
              f"(median shown; peak RSS the largest)", flush=True)


if __name__ == "__main__":
    main()
