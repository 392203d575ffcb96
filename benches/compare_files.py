"""Promotion of files referenced from rows: an upload of 1,000 files of
100 KB to 1 MB (about 550 MB) plus one row per file, promoted by
icestage's PROMOTE UPLOAD (every file's size, SHA-256 and content type
verified, copied into the target's files folder, the rows' URIs rewritten),
against the floor of the same work done by coreutils in the same run:
`cp -r` of the files and `sha256sum` of the copies.

Both run as their own processes on the same embedded warehouse, each
measured for wall time and peak RSS (see compare_promote.measured).

    .venv/bin/python benches/compare_files.py --icestage target/release/icestage [--files 1000]

scripts/bench-files.sh builds icestage and runs this with the defaults.
"""

import argparse
import hashlib
import os
import random
import sys
import tempfile

import pyarrow as pa
from pyiceberg.catalog import load_catalog

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_promote import icestage, measured  # noqa: E402

SIZES = (100_000, 1_000_000)


def stage(binary, warehouse, count, seed):
    """The target, an upload, `count` files under its files folder and one
    row per file; the upload's id and the files' total bytes."""
    icestage(binary, warehouse, "CREATE SCHEMA media")
    icestage(binary, warehouse,
             "CREATE TABLE media.photos (id BIGINT NOT NULL, photo FILE NOT NULL, caption VARCHAR)")
    upload = icestage(binary, warehouse, "CREATE UPLOAD FOR media.photos")[0]
    location = upload["files_location"]
    folder = location.removeprefix("file://")
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(seed)
    rows, total = [], 0
    for n in range(count):
        size = rng.randint(*SIZES)
        data = b"\x89PNG\r\n\x1a\n" + rng.randbytes(size - 8)
        with open(f"{folder}/{n:05}.png", "wb") as f:
            f.write(data)
        total += size
        rows.append({"id": n, "caption": f"photo {n}", "photo": {
            "uri": f"{location}/{n:05}.png", "size": size,
            "sha256": hashlib.sha256(data).hexdigest(), "content_type": "image/png"}})
    props = dict(upload["connection"])
    catalog = load_catalog(props.pop("name"), **props)
    staging = catalog.load_table(upload["staging_table"])
    staging.append(pa.Table.from_pylist(rows, schema=staging.schema().as_arrow()))
    os.sync()
    return upload["upload_id"], folder, total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--icestage", required=True)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as warehouse:
        upload_id, folder, total = stage(args.icestage, warehouse, args.files, 7)
        mb = total / 1e6
        print(f"{args.files} files, {mb:.0f} MB, on {os.cpu_count()} cores")

        copies = os.path.join(warehouse, "baseline-copies")
        floor_s, floor_rss, _ = measured(
            ["sh", "-c", f"cp -r '{folder}' '{copies}' && sha256sum '{copies}'/*.png > /dev/null"])
        os.sync()

        seconds, rss, out = measured(
            [args.icestage, "--warehouse", warehouse, "-q", "--format", "json", "-c",
             f"PROMOTE UPLOAD '{upload_id}'"])
        if '"promoted"' not in out:
            sys.exit(f"the promotion did not promote: {out}")
        landed = icestage(args.icestage, warehouse, "SELECT count(*) AS n FROM media.photos")[0]["n"]
        if landed != args.files:
            sys.exit(f"{landed} rows landed, {args.files} expected")

        print(f"{'':32}{'seconds':>10}{'MB/s':>10}{'peak RSS MiB':>14}")
        print(f"{'cp -r + sha256sum (coreutils)':32}{floor_s:>10.2f}{mb / floor_s:>10.0f}{floor_rss:>14.0f}")
        print(f"{'icestage PROMOTE UPLOAD':32}{seconds:>10.2f}{mb / seconds:>10.0f}{rss:>14.0f}")
        print(f"ratio (icestage / coreutils): {seconds / floor_s:.2f}x time; "
              f"peak RSS {rss:.0f} MiB (target: at most 300 MiB)")


if __name__ == "__main__":
    main()
