"""Downloads at volume: icestage's CREATE DOWNLOAD of every row of a 20M-row
table against DuckDB's `COPY (query) TO` zstd Parquet of the same rows from
the same data files, in one run, each as a whole process with 2 threads.

    icestage  CREATE DOWNLOAD WITH (wait = true) AS SELECT * FROM bench.events
              (the source pinned to its snapshot, a new Iceberg table on the
              embedded catalog filled with zstd Parquet and committed)
    DuckDB    SET threads = 2;
              COPY (SELECT * FROM read_parquet('<the table's data files>'))
              TO 'out.parquet' (FORMAT parquet, COMPRESSION zstd)

The table (id, account, amount_cents, currency, created_at, note) is
written by icestage itself before the timed runs. It prints seconds, rows
per second and peak RSS of each and the ratio (DuckDB time / icestage
time: above 1, icestage is faster). The best of --repeat runs counts.

    .venv/bin/python benches/compare_download.py --icestage target/release/icestage [--rows 20000000]

scripts/bench-download.sh installs what it needs, builds icestage and runs this.
"""

import glob
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_ingest import parquet_mib  # noqa: E402
from compare_promote import icestage, measured, options  # noqa: E402

DUCKDB = r"""
import sys, duckdb
files, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
con.execute("SET threads = 2")
con.execute(f"COPY (SELECT * FROM read_parquet({files})) TO '{out}' (FORMAT parquet, COMPRESSION zstd)")
print(con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0])
"""


def table(binary, warehouse, rows):
    """bench.events with `rows` rows; its data files."""
    icestage(binary, warehouse, "CREATE SCHEMA bench")
    icestage(binary, warehouse,
             "CREATE TABLE bench.events (id BIGINT NOT NULL, account VARCHAR, amount_cents BIGINT, "
             "currency VARCHAR, created_at TIMESTAMP, note VARCHAR)")
    step = 5_000_000
    for start in range(0, rows, step):
        end = min(rows, start + step)
        icestage(binary, warehouse,
                 "INSERT INTO bench.events SELECT value, concat('acct_', value % 10007), "
                 "(value * 7919) % 100000, CASE WHEN value % 3 = 0 THEN 'usd' ELSE 'eur' END, "
                 "to_timestamp_micros(1782864000000000 + value * 1000000), "
                 f"concat('order ', value, ' of batch ', value % 97) FROM range({start}, {end})")
    return sorted(glob.glob(os.path.join(warehouse, "bench", "events", "data", "**", "*.parquet"),
                            recursive=True))


def main():
    parser = options(__doc__, 2)
    parser.add_argument("--rows", type=int, default=20_000_000)
    args = parser.parse_args()
    import duckdb

    with tempfile.TemporaryDirectory() as root:
        warehouse = os.path.join(root, "warehouse")
        files = table(args.icestage, warehouse, args.rows)
        source_mib = parquet_mib(os.path.join(warehouse, "bench", "events"))
        os.sync()
        load = os.getloadavg()
        print(f"# machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; "
              f"DuckDB {duckdb.__version__}; {args.rows} rows in {len(files)} files ({source_mib:.1f} MiB zstd); "
              f"best of {args.repeat}; both with 2 threads")
        out = os.path.join(root, "out.parquet")
        downloads = os.path.join(warehouse, "downloads")

        def ours():
            shutil.rmtree(downloads, ignore_errors=True)
            icestage(args.icestage, warehouse, "EXPIRE STAGING")
            seconds, rss, text = measured([
                args.icestage, "--warehouse", warehouse, "-q", "--format", "json", "-c",
                "SET datafusion.execution.target_partitions = 2; "
                "CREATE DOWNLOAD WITH (wait = true) AS SELECT * FROM bench.events"])
            opened = icestage(args.icestage, warehouse, "SELECT * FROM downloads()")
            ready = [d for d in opened if d.get("state") == "ready"]
            if len(ready) != 1 or int(ready[0]["rows"]) != args.rows:
                sys.exit(f"icestage did not download {args.rows} rows: {text} {opened}")
            icestage(args.icestage, warehouse, f"DROP DOWNLOAD '{ready[0]['download_id']}'")
            return seconds, rss

        def theirs():
            if os.path.exists(out):
                os.remove(out)
            seconds, rss, text = measured([sys.executable, "-c", DUCKDB, repr(files), out])
            if str(args.rows) not in text:
                sys.exit(f"DuckDB did not write {args.rows} rows: {text}")
            return seconds, rss

        mine = min(ours() for _ in range(args.repeat))
        their = min(theirs() for _ in range(args.repeat))
        header = (f"{'rows':>10} | {'icestage s':>10} {'rows/s':>10} {'RSS MiB':>8} | "
                  f"{'DuckDB s':>8} {'rows/s':>10} {'RSS MiB':>8} | {'ratio':>6}")
        print(header)
        print("-" * len(header))
        print(f"{args.rows:>10} | {mine[0]:>10.2f} {args.rows / mine[0]:>10.0f} {mine[1]:>8.1f} | "
              f"{their[0]:>8.2f} {args.rows / their[0]:>10.0f} {their[1]:>8.1f} | {their[0] / mine[0]:>5.2f}x"
              f"   (output MiB: DuckDB {parquet_mib(out):.1f})", flush=True)
        print("ratio = DuckDB time / icestage time (1 or above: icestage is as fast or faster)")


if __name__ == "__main__":
    main()
