"""Writes the fuzz harness's seeds (fuzz/corpus/<target>/) from a real
writer: PyIceberg creates a table with nested columns on a SQL catalog in a
temporary folder, appends twice, and the files it wrote are kept as they
are (metadata JSON, manifest lists, manifests, Parquet footers).

    .venv/bin/python fuzz/make_corpus.py
"""

import os
import shutil
import struct
import tempfile
from datetime import UTC, datetime

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import (IntegerType, ListType, LongType, MapType, NestedField,
                             StringType, StructType, TimestamptzType)

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
work = tempfile.mkdtemp()
catalog = SqlCatalog("seed", uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}")
catalog.create_namespace("s")
schema = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "s", StructType(NestedField(4, "a", IntegerType(), required=True)), required=False),
    NestedField(5, "l", ListType(6, IntegerType(), element_required=False), required=False),
    NestedField(7, "m", MapType(8, StringType(), 9, LongType(), value_required=False), required=False),
    NestedField(10, "at", TimestamptzType(), required=False),
)
table = catalog.create_table("s.t", schema=schema)
for batch in range(2):
    rows = [{"id": batch * 10 + i, "name": f"n{i}", "s": {"a": i}, "l": [i, None],
             "m": {"k": i}, "at": datetime(2026, 7, 1, tzinfo=UTC)} for i in range(3)]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))

def keep(target, path):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    shutil.copy(path, os.path.join(root, target, os.path.basename(path)))

for folder, _, files in os.walk(work):
    for name in sorted(files):
        path = os.path.join(folder, name)
        if name.endswith(".metadata.json"):
            keep("table-metadata", path)
        elif name.startswith("snap-") and name.endswith(".avro"):
            keep("manifest-list", path)
            keep("avro-container", path)
        elif name.endswith(".avro"):
            keep("manifest", path)
        elif name.endswith(".parquet"):
            data = open(path, "rb").read()
            (length,) = struct.unpack("<I", data[-8:-4])
            os.makedirs(os.path.join(root, "parquet-footer"), exist_ok=True)
            with open(os.path.join(root, "parquet-footer", name + ".footer"), "wb") as out:
                out.write(data[-8 - length:-8])
shutil.rmtree(work)

# Column chunks as the page guard sees them (everything between the leading
# magic and the footer of a one-row-group file), one per codec a writer may
# use, data pages v1 and v2.
import pyarrow.parquet as pq

rows = pa.table({"id": list(range(200)), "name": [f"n{i % 7}" for i in range(200)]})
for codec in ["zstd", "gzip", "brotli", "snappy", "lz4", "none"]:
    for version in ["1.0", "2.0"]:
        path = os.path.join(tempfile.mkdtemp(), "f.parquet")
        pq.write_table(rows, path, compression=codec, data_page_version=version)
        data = open(path, "rb").read()
        (length,) = struct.unpack("<I", data[-8:-4])
        os.makedirs(os.path.join(root, "parquet-pages"), exist_ok=True)
        with open(os.path.join(root, "parquet-pages", f"{codec}-v{version}.chunks"), "wb") as out:
            out.write(data[4:-8 - length])
        shutil.rmtree(os.path.dirname(path))
print("seeds written under", root)
