"""Bulk loads at TPC-H size: icestage's COPY INTO against DuckDB on the same
files, in one run. TPC-H `lineitem` at scale factor --sf (1: 6,001,215
rows, about 725 MB as CSV), generated here with tpchgen-cli into 8 CSV files
and the same rows as 8 zstd Parquet files. Each side reads the 8 files and
writes zstd Parquet, with 2 threads, as a whole process:

    icestage  COPY INTO raw.lineitem FROM '<folder>' WITH (all_files = true)
              (an Iceberg table on the embedded catalog; the copy log and the
              commit included)
    DuckDB    SET threads = 2;
              COPY (SELECT * FROM read_csv('<folder>/*.csv')) TO 'out.parquet'
              (FORMAT parquet, COMPRESSION zstd)   (read_parquet for Parquet)

It prints seconds, rows per second and peak RSS of each and the ratio
(DuckDB time / icestage time: above 1, icestage is faster). The best of
--repeat runs counts.

    .venv/bin/python benches/compare_bulk.py --icestage target/release/icestage [--sf 1]

scripts/bench-bulk.sh installs what it needs, builds icestage and runs this.
"""

import os
import shutil
import subprocess
import sys
import tempfile

from compare_ingest import best, parquet_mib
from compare_promote import options

DUCKDB = r"""
import sys, duckdb
source, out = sys.argv[1], sys.argv[2]
reader = "read_parquet" if source.endswith(".parquet") else "read_csv"
con = duckdb.connect()
con.execute("SET threads = 2")
con.execute(f"COPY (SELECT * FROM {reader}('{source}')) TO '{out}' (FORMAT parquet, COMPRESSION zstd)")
print(con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0])
"""

# `lineitem`'s row count at a scale factor (TPC-H's generator is exact).
ROWS = {1: 6_001_215, 0.1: 600_572, 0.01: 60_175}


def scale_factor(text):
    """A TPC-H scale factor as the generator names it: 1, not 1.0."""
    value = float(text)
    return int(value) if value == int(value) else value


def generate(root, sf, formats=("csv", "parquet")):
    """lineitem in 8 files of each format (CSV, zstd Parquet); the folders."""
    tpchgen = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    folders = {}
    for fmt, extra in (("csv", []), ("parquet", ["--compression=ZSTD(1)"])):
        if fmt not in formats:
            continue
        out = os.path.join(root, fmt)
        subprocess.run([tpchgen, fmt, "-s", str(sf), "--tables=lineitem", "--parts=8",
                        f"--output-dir={out}", *extra], check=True, stdout=subprocess.DEVNULL)
        folders[fmt] = os.path.join(out, "lineitem")
    return folders


def main():
    parser = options(__doc__, 2)
    parser.add_argument("--sf", type=scale_factor, default=1)
    args = parser.parse_args()
    import duckdb

    sf = args.sf
    rows = ROWS.get(sf)
    if rows is None:
        sys.exit(f"--sf {sf}: the row count is known for {sorted(ROWS)} only")
    with tempfile.TemporaryDirectory() as root:
        folders = generate(root, sf)
        load = os.getloadavg()
        print(f"# machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; "
              f"DuckDB {duckdb.__version__}; TPC-H lineitem SF {sf}: {rows} rows in 8 files; "
              f"best of {args.repeat}; both with 2 threads")
        header = (f"{'input':>8} {'MiB':>7} | {'icestage s':>10} {'rows/s':>10} {'RSS MiB':>8} | "
                  f"{'DuckDB s':>8} {'rows/s':>10} {'RSS MiB':>8} | {'ratio':>6}")
        print(header)
        print("-" * len(header))
        warehouse = os.path.join(root, "warehouse")
        out = os.path.join(root, "out.parquet")
        for name, pattern in (("csv", "*.csv"), ("parquet", "*.parquet")):
            folder = folders[name]
            size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 2**20

            def fresh():
                shutil.rmtree(warehouse, ignore_errors=True)
                if os.path.exists(out):
                    os.remove(out)

            ours = best(lambda: [args.icestage, "--warehouse", warehouse, "-q", "--format", "csv", "-c",
                                 f"COPY INTO raw.lineitem FROM 'file://{folder}/' WITH (all_files = true)"],
                        args.repeat, rows, fresh)
            our_out = parquet_mib(warehouse)
            theirs = best(lambda: [sys.executable, "-c", DUCKDB, os.path.join(folder, pattern), out],
                          args.repeat, rows, fresh)
            their_out = parquet_mib(out)
            print(f"{name:>8} {size:>7.1f} | {ours[0]:>10.2f} {rows / ours[0]:>10.0f} {ours[1]:>8.1f} | "
                  f"{theirs[0]:>8.2f} {rows / theirs[0]:>10.0f} {theirs[1]:>8.1f} | {theirs[0] / ours[0]:>5.2f}x"
                  f"   (output MiB: icestage {our_out:.1f}, DuckDB {their_out:.1f})", flush=True)
        print("ratio = DuckDB time / icestage time (1 or above: icestage is as fast or faster)")


if __name__ == "__main__":
    main()
