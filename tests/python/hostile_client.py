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
        "set-property": set_property,
        "relocate": relocate,
    }[command](*args)
