"""Verification at volume: how fast PROMOTE UPLOAD proves a large staged
upload from its bytes, against DuckDB reading the same files.

TPC-H `lineitem` at scale factor --sf (6 by default: about 36M rows, about
1.2 GB of zstd Parquet once staged) is generated with tpchgen-cli, landed
with COPY INTO as `raw.lineitem`, and staged into an upload of that table
by `INSERT INTO <staging table> SELECT * FROM raw.lineitem` (icestage's own
writer, zstd). Then, each as a whole process with 2 threads, on the same
staged files:

    icestage  PROMOTE UPLOAD '<id>' WITH (dry_run = true)
              (every check of a real promotion: footers, every row's
              values, the rules and the metrics recomputed from the bytes;
              nothing written)
    DuckDB    SET threads = 2; SELECT count(*), min(c), max(c),
              count(*) - count(c) for every column c FROM read_parquet(<files>)
              (the bounds and null counts of every column: a full decode)

It prints the staged bytes, each side's seconds, MB/s per core and peak RSS,
and the ratio. The median of --repeat runs counts.

    .venv/bin/python benches/compare_verify.py --icestage target/release/icestage [--sf 6]

scripts/bench-verify.sh installs what it needs, builds icestage and runs this.
"""

import json
import os
import statistics
import sys
import tempfile

from compare_bulk import generate, scale_factor
from compare_promote import icestage, measured, options

DUCKDB = r"""
import sys, duckdb
files = sys.argv[1:]
con = duckdb.connect()
con.execute("SET threads = 2")
con.execute("SET enable_progress_bar = false")
source = f"read_parquet({files!r})"
columns = [row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()]
checks = ", ".join(f'min("{c}"), max("{c}"), count(*) - count("{c}")' for c in columns)
print(con.execute(f"SELECT count(*), {checks} FROM {source}").fetchone()[0])
"""


def staged_files(warehouse, upload_id):
    """The Parquet files under the staging table's folder."""
    found = []
    for folder, _, files in os.walk(warehouse):
        if upload_id in folder:
            found += [os.path.join(folder, f) for f in files if f.endswith(".parquet")]
    return sorted(found)


def main():
    parser = options(__doc__, 3)
    parser.add_argument("--sf", type=scale_factor, default=6)
    args = parser.parse_args()
    import duckdb

    sf = args.sf
    with tempfile.TemporaryDirectory() as root:
        folder = generate(root, sf, formats=("parquet",))["parquet"]
        warehouse = os.path.join(root, "warehouse")
        binary = args.icestage
        icestage(binary, warehouse, f"COPY INTO raw.lineitem FROM 'file://{folder}/' WITH (all_files = true)")
        upload = icestage(binary, warehouse, "CREATE UPLOAD FOR raw.lineitem")[0]
        icestage(binary, warehouse, f"INSERT INTO {upload['staging_table']} SELECT * FROM raw.lineitem")
        files = staged_files(warehouse, upload["upload_id"])
        staged = sum(os.path.getsize(f) for f in files)
        os.sync()

        load = os.getloadavg()
        print(f"# machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
              f"at start; DuckDB {duckdb.__version__}; TPC-H lineitem SF {sf} staged by INSERT ... SELECT: "
              f"{len(files)} files, {staged / 1e6:.1f} MB of zstd Parquet; median of {args.repeat}; 2 threads each")
        ours, theirs = [], []
        for _ in range(args.repeat):
            seconds, rss, out = measured([binary, "--warehouse", warehouse, "-q", "--format", "json", "-c",
                                          f"PROMOTE UPLOAD '{upload['upload_id']}' WITH (dry_run = true)"])
            result = json.loads(out)[0]
            ours.append((seconds, rss, result["rows"]))
            seconds, rss, out = measured([sys.executable, "-c", DUCKDB, *files])
            theirs.append((seconds, rss, int(out)))
        rows = ours[0][2]
        assert all(r[2] == rows for r in ours + theirs), (ours, theirs)
        cores = os.cpu_count()
        header = f"{'':>9} | {'seconds':>7} {'MB/s per core':>13} {'peak RSS MiB':>12} | runs"
        print(header)
        print("-" * len(header))
        for name, runs in (("icestage", ours), ("DuckDB", theirs)):
            median = statistics.median(r[0] for r in runs)
            print(f"{name:>9} | {median:>7.2f} {staged / median / cores / 1e6:>13.0f} "
                  f"{max(r[1] for r in runs):>12.1f} | {', '.join(f'{r[0]:.2f}' for r in runs)} s", flush=True)
        ratio = statistics.median(r[0] for r in theirs) / statistics.median(r[0] for r in ours)
        print(f"{rows} rows; ratio {ratio:.2f}x (DuckDB time / icestage time: above 1, icestage is faster)")


if __name__ == "__main__":
    main()
