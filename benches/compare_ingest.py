"""Landing files: icestage's COPY INTO against DuckDB on the same files, in
one run: 1M rows in 8 CSV files, the same files gzip'd, and the same rows as
8 Parquet files. Each side reads all 8 files and writes them as Parquet:

    icestage  COPY INTO raw.t FROM '<folder>' WITH (all_files = true)
              (an Iceberg table on the embedded catalog: Parquet files plus
              the commit and the file log)
    DuckDB    COPY (SELECT * FROM read_csv_auto('<folder>/*.csv')) TO 'out.parquet'
              (FORMAT parquet, COMPRESSION zstd)
              (read_parquet for Parquet; one Parquet file, no table)

Both write zstd, Iceberg's default codec, so the outputs compare.

Each run is a whole process (start-up included, both sides), timed by the
same launcher as compare_promote.py; the best of --repeat runs counts.

    .venv/bin/python benches/compare_ingest.py --icestage target/release/icestage [--rows 1000000]
        [--before <an earlier icestage build>]

After the table it prints what row-by-row loading costs on the same clean
CSV files (`on_error = 'continue'`, which reads each row as text to reject
malformed ones alone) against the plain load, and, with --before, the plain
CSV load of an earlier build against this one: both in the same run.

scripts/bench-ingest.sh installs DuckDB into .venv, builds icestage and runs this.
"""

import gzip
import os
import shutil
import sys
import tempfile
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from compare_promote import measured, options

FILES = 8

DUCKDB = r"""
import sys, duckdb
source, out = sys.argv[1], sys.argv[2]
reader = "read_parquet" if source.endswith(".parquet") else "read_csv_auto"
con = duckdb.connect()
con.execute(f"COPY (SELECT * FROM {reader}('{source}')) TO '{out}' (FORMAT parquet, COMPRESSION zstd)")
print(con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0])
"""


def rows_table(offset, n):
    ids = pa.array(range(offset, offset + n), pa.int64())
    start = int(datetime(2026, 7, 1, tzinfo=UTC).timestamp() * 1e6)
    return pa.table({
        "order_id": ids,
        "customer": pc.binary_join_element_wise("cust_", pc.cast(pc.bit_wise_and(ids, 4095), pa.string()), ""),
        "amount": pc.divide(pc.cast(pc.bit_wise_and(ids, 65535), pa.float64()), 100.0),
        "currency": pa.array(["usd", "eur", "gbp", "jpy"] * (n // 4) + ["usd"] * (n % 4)),
        "express": pc.equal(pc.bit_wise_and(ids, 7), 0),
        "ordered_at": pc.cast(pc.add(pc.multiply(ids, 1_000_000), start), pa.timestamp("us", tz="UTC")),
    })


def write_files(root, rows):
    """The three folders: csv/, csv_gz/, parquet/."""
    folders = {name: os.path.join(root, name) for name in ("csv", "csv_gz", "parquet")}
    for folder in folders.values():
        os.makedirs(folder)
    per_file = rows // FILES
    for i in range(FILES):
        n = per_file if i < FILES - 1 else rows - per_file * (FILES - 1)
        table = rows_table(i * per_file, n)
        csv_path = os.path.join(folders["csv"], f"part-{i}.csv")
        pacsv.write_csv(table, csv_path)
        with open(csv_path, "rb") as src, gzip.open(os.path.join(folders["csv_gz"], f"part-{i}.csv.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        pq.write_table(table, os.path.join(folders["parquet"], f"part-{i}.parquet"))
    return folders


def parquet_mib(path):
    """Size of the Parquet files at or under `path`."""
    if os.path.isfile(path):
        return os.path.getsize(path) / 2**20
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files if f.endswith(".parquet")) / 2**20


def best(command, repeat, expect_rows, fresh):
    """Fastest of `repeat` runs of `command()`; `fresh()` resets between runs."""
    times = []
    for _ in range(repeat):
        fresh()
        seconds, rss, out = measured(command())
        if str(expect_rows) not in out:
            sys.exit(f"{command()[0]} did not land {expect_rows} rows: {out}")
        times.append((seconds, rss))
    return min(times)


def main():
    parser = options(__doc__, 3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--before", help="an earlier icestage build to compare the plain CSV load with")
    args = parser.parse_args()
    import duckdb

    with tempfile.TemporaryDirectory() as root:
        folders = write_files(root, args.rows)
        load = os.getloadavg()
        print(f"# machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; "
              f"DuckDB {duckdb.__version__}; {args.rows} rows in {FILES} files; best of {args.repeat}")
        header = (f"{'input':>8} {'MiB':>6} | {'icestage s':>10} {'DuckDB s':>8} {'ratio':>6} | "
                  f"{'icestage RSS':>12} {'DuckDB RSS':>10} | {'icestage out':>12} {'DuckDB out':>10}")
        print(header)
        print("-" * len(header))
        warehouse = os.path.join(root, "warehouse")
        out = os.path.join(root, "out.parquet")
        for name, pattern in (("csv", "*.csv"), ("csv.gz", "*.csv.gz"), ("parquet", "*.parquet")):
            folder = folders[name.replace(".", "_")]
            size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 2**20

            def fresh():
                shutil.rmtree(warehouse, ignore_errors=True)
                if os.path.exists(out):
                    os.remove(out)

            def copy(binary, options=""):
                return lambda: [binary, "--warehouse", warehouse, "-q", "--format", "csv", "-c",
                                f"COPY INTO raw.t FROM 'file://{folder}/' WITH (all_files = true{options})"]

            ours = best(copy(args.icestage), args.repeat, args.rows, fresh)
            if name == "csv":
                plain_csv = ours
                continuing = best(copy(args.icestage, ", on_error = 'continue'"), args.repeat, args.rows, fresh)
                before = best(copy(args.before), args.repeat, args.rows, fresh) if args.before else None
            our_out = parquet_mib(warehouse)
            theirs = best(lambda: [sys.executable, "-c", DUCKDB, os.path.join(folder, pattern), out],
                          args.repeat, args.rows, fresh)
            their_out = parquet_mib(out)
            print(f"{name:>8} {size:>6.1f} | {ours[0]:>10.3f} {theirs[0]:>8.3f} {theirs[0] / ours[0]:>5.2f}x | "
                  f"{ours[1]:>12.1f} {theirs[1]:>10.1f} | {our_out:>12.1f} {their_out:>10.1f}", flush=True)
        print("ratio = DuckDB time / icestage time (above 1: icestage is faster); RSS and output in MiB;")
        print("both write zstd: Iceberg's default codec (icestage, level 3), and DuckDB's COMPRESSION zstd")
        print()
        print(f"csv, on_error = 'continue': {continuing[0]:.3f} s against {plain_csv[0]:.3f} s plain "
              f"({(continuing[0] / plain_csv[0] - 1) * 100:+.1f}%), RSS {continuing[1]:.1f} MiB")
        if before:
            print(f"csv, plain, the earlier build: {before[0]:.3f} s against {plain_csv[0]:.3f} s now "
                  f"(now / before = {plain_csv[0] / before[0]:.2f}), RSS {before[1]:.1f} MiB")


if __name__ == "__main__":
    main()
