"""PyIceberg as a real third-party client of icestage's staging tables.

Each sub-command takes the `connection` JSON that CREATE UPLOAD returns and
does what a client of the upload API does with it; results are printed as
JSON for the Rust test to check.

    pyiceberg_client.py append   CONNECTION STAGING_TABLE ROWS
    pyiceberg_client.py read     CONNECTION TABLE UPLOAD_ID
    pyiceberg_client.py read-table CONNECTION TABLE   (a download: row count, columns, rows)
    pyiceberg_client.py create   CONNECTION TABLE ROWS (the table, its namespace and ROWS
                                 transactions, written by PyIceberg first)
    pyiceberg_client.py create-repartitioned CONNECTION TABLE ROWS VERSION (as `create`,
                                 a format VERSION table partitioned by account_id
                                 whose partition field is removed after the rows)
    pyiceberg_client.py rename-partition-field CONNECTION TABLE NAME NEW_NAME
    pyiceberg_client.py field-ids CONNECTION TABLE
    pyiceberg_client.py evolve   CONNECTION TABLE     (add 'note', drop 'currency')
    pyiceberg_client.py retype   CONNECTION TABLE COLUMN
    pyiceberg_client.py rogue-nulls CONNECTION TABLE COLUMN
    pyiceberg_client.py delete   CONNECTION TABLE FILTER   (rows matching FILTER)
    pyiceberg_client.py add-file CONNECTION TABLE PATH ROW  (ROW, a JSON object, written
                                 to a Parquet file at PATH and appended as it is)
    pyiceberg_client.py put-files CONNECTION STAGING_TABLE FILES_LOCATION COUNT
                                 (COUNT PNG images written under FILES_LOCATION with the
                                 table's own file IO, and one row per image naming it)
    pyiceberg_client.py open-files CONNECTION TABLE  (every row's photo opened by its uri
                                 and hashed)
"""

import hashlib
import json
import random
import sys
import tempfile
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType


def catalog(connection: str):
    props = json.loads(connection)
    return load_catalog(props.pop("name"), **props)


def transactions(rows: int, names: list[str]) -> list[dict]:
    """`rows` payment transactions, with the columns among `names`."""
    start = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    records = [
        {
            "transaction_id": f"txn_{i:03}",
            "account_id": f"acct_{i % 7}",
            "amount_cents": 100 + i,
            "currency": "usd",
            "created_at": start + timedelta(minutes=i),
        }
        for i in range(rows)
    ]
    return [{k: v for k, v in r.items() if k in names} for r in records]


def append(connection: str, staging_table: str, rows: int) -> None:
    staging = catalog(connection).load_table(staging_table)
    # The schema comes from the staging table the service created.
    schema = staging.schema().as_arrow()
    records = transactions(rows, schema.names)
    for r in records:
        if "note" in schema.names:
            r["note"] = "from pyiceberg"
    staging.append(pa.Table.from_pylist(records, schema=schema))
    print(json.dumps({"appended": rows}))


def create(connection: str, table: str, rows: int) -> None:
    c = catalog(connection)
    c.create_namespace_if_not_exists(table.rsplit(".", 1)[0])
    schema = pa.schema([
        pa.field("transaction_id", pa.string(), nullable=False),
        pa.field("account_id", pa.string(), nullable=False),
        pa.field("amount_cents", pa.int64(), nullable=False),
        pa.field("currency", pa.string(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ])
    t = c.create_table(table, schema=schema)
    t.append(pa.Table.from_pylist(transactions(rows, schema.names), schema=schema))
    print(json.dumps({"created": table, "rows": rows}))


def create_repartitioned(connection: str, table: str, rows: int, version: str) -> None:
    """Once its partition field is removed, a v2 table's default spec is a
    new one without fields; a v1 table's keeps the field as a `void` one
    under its old name (here its column's), as Java's library does."""
    c = catalog(connection)
    c.create_namespace_if_not_exists(table.rsplit(".", 1)[0])
    schema = Schema(
        NestedField(1, "transaction_id", StringType(), required=True),
        NestedField(2, "account_id", StringType(), required=True),
        NestedField(3, "amount_cents", LongType(), required=True),
        NestedField(4, "currency", StringType(), required=True),
        NestedField(5, "created_at", TimestamptzType(), required=True),
    )
    by_account = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "account_id"))
    t = c.create_table(
        table, schema=schema, partition_spec=by_account, properties={"format-version": version}
    )
    arrow = t.schema().as_arrow()
    t.append(pa.Table.from_pylist(transactions(rows, arrow.names), schema=arrow))
    with t.update_spec() as update:
        update.remove_field("account_id")
    print(json.dumps({"spec_id": t.spec().spec_id, "spec": spec_fields(t)}))


def rename_partition_field(connection: str, table: str, name: str, new_name: str) -> None:
    t = catalog(connection).load_table(table)
    with t.update_spec() as update:
        update.rename_field(name, new_name)
    print(json.dumps({"spec": spec_fields(t)}))


def spec_fields(t) -> list[list[str]]:
    """The name and transform of each field of `t`'s current spec."""
    return [[f.name, str(f.transform)] for f in t.spec().fields]


def read(connection: str, table: str, upload_id: str) -> None:
    target = catalog(connection).load_table(table)
    rows = target.scan().to_arrow().sort_by("transaction_id").to_pylist()
    evidence = [
        s.snapshot_id
        for s in target.metadata.snapshots
        if s.summary is not None and s.summary["upload-id"] == upload_id
    ]
    print(json.dumps({
        "rows": len(rows),
        "ids": [r["transaction_id"] for r in rows],
        "evidence_snapshots": evidence,
    }))


def read_table(connection: str, table: str) -> None:
    rows = catalog(connection).load_table(table).scan().to_arrow()
    print(json.dumps({
        "rows": rows.num_rows,
        "columns": rows.column_names,
        "values": sorted(rows.to_pylist(), key=lambda r: json.dumps(r, default=str)),
    }, default=str))


def tagged(connection: str, table: str, name: str) -> None:
    t = catalog(connection).load_table(table)
    snapshot = t.snapshot_by_name(name)
    rows = t.scan(snapshot_id=snapshot.snapshot_id).to_arrow().num_rows
    print(json.dumps({"snapshot_id": snapshot.snapshot_id, "rows": rows}))


def delete(connection: str, table: str, row_filter: str) -> None:
    t = catalog(connection).load_table(table)
    t.delete(delete_filter=row_filter)
    summary = t.refresh().current_snapshot().summary
    print(json.dumps({
        "operation": summary.operation.value,
        "deleted_data_files": summary.get("deleted-data-files"),
    }))


def field_ids(connection: str, table: str) -> None:
    t = catalog(connection).load_table(table)
    print(json.dumps({f.name: f.field_id for f in t.schema().fields}))


def evolve(connection: str, table: str) -> None:
    t = catalog(connection).load_table(table)
    with t.update_schema() as update:
        update.add_column("note", StringType())
    with t.update_schema() as update:
        update.delete_column("currency")
    print(json.dumps({f.name: f.field_id for f in t.schema().fields}))


def retype(connection: str, table: str, column: str) -> None:
    t = catalog(connection).load_table(table)
    with t.update_schema() as update:
        update.update_column(column, field_type=LongType())
    print(json.dumps({"retyped": column}))


def data_file(table, path: str, **overrides) -> DataFile:
    """The data file PyIceberg would register for `path`, with `overrides`
    replacing its statistics (the lie)."""
    schema = table.schema()
    metadata = pq.read_metadata(table.io.new_input(path).open())
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    serialized = stats.to_serialized_dict()
    for key, value in overrides.items():
        serialized[key].update(value) if isinstance(value, dict) else serialized.__setitem__(key, value)
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=stats.partition(table.metadata.spec(), schema),
        file_size_in_bytes=len(table.io.new_input(path)),
        sort_order_id=None,
        spec_id=table.metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **serialized,
    )


def register(table, data: DataFile) -> None:
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            append.append_data_file(data)


def arrow_schema_of(schema, nullable) -> pa.Schema:
    """`schema` as Arrow, with field ids; `nullable(field)` says which
    columns may hold nulls."""
    return pa.schema([
        pa.field(f.name, schema.as_arrow().field(f.name).type, nullable=nullable(f),
                 metadata={"PARQUET:field_id": str(f.field_id)})
        for f in schema.fields
    ])


def add_file(connection: str, table: str, path: str, row: str) -> None:
    """Appends a file at `path`, wherever it is, as a writer that places
    files itself would (PyIceberg's add_files does)."""
    t = catalog(connection).load_table(table)
    arrow_schema = arrow_schema_of(t.schema(), lambda f: not f.required)
    with t.io.new_output(path).create() as out:
        pq.write_table(pa.Table.from_pylist([json.loads(row)], schema=arrow_schema), out)
    register(t, data_file(t, path))
    print(json.dumps({"added": path}))


def rogue_nulls(connection: str, table: str, column: str) -> None:
    """Adds a file holding a NULL in a required column, as a writer that does
    not check nullability would (Spark with check-nullability disabled)."""
    t = catalog(connection).load_table(table)
    schema = t.schema()
    arrow_schema = arrow_schema_of(schema, lambda f: True)
    row = {f.name: None for f in schema.fields}
    for f in schema.fields:
        if f.name != column and f.required:
            row[f.name] = 1 if pa.types.is_integer(arrow_schema.field(f.name).type) else "x"
    path = f"{t.location()}/data/rogue-{next(tempfile._get_candidate_names())}.parquet"
    with t.io.new_output(path).create() as out:
        pq.write_table(pa.Table.from_pylist([row], schema=arrow_schema), out)
    register(t, data_file(t, path))
    print(json.dumps({"rogue_file": path}))


def png(seed: int, size: int) -> bytes:
    """A PNG's signature followed by `size - 8` bytes from `seed`."""
    return b"\x89PNG\r\n\x1a\n" + random.Random(seed).randbytes(size - 8)


def put_files(connection: str, staging_table: str, files_location: str, count: int) -> None:
    staging = catalog(connection).load_table(staging_table)
    rows = []
    for n in range(count):
        data = png(n, 2000 + 997 * n)
        uri = f"{files_location}/camera/{n:04}.png"
        with staging.io.new_output(uri).create() as out:
            out.write(data)
        rows.append({
            "id": n,
            "photo": {
                "uri": uri,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "content_type": "image/png",
            },
            "caption": f"picture {n}",
        })
    # The schema, with its required/optional flags, comes from the table.
    staging.append(pa.Table.from_pylist(rows, schema=staging.schema().as_arrow()))
    print(json.dumps({"files": count}))


def open_files(connection: str, table: str) -> None:
    t = catalog(connection).load_table(table)
    rows = t.scan().to_arrow().to_pylist()
    opened = []
    for row in rows:
        photo = row["photo"]
        with t.io.new_input(photo["uri"]).open() as f:
            data = f.read()
        opened.append({
            "id": row["id"],
            "uri": photo["uri"],
            "matches": len(data) == photo["size"]
            and hashlib.sha256(data).hexdigest() == photo["sha256"]
            and data == png(row["id"], 2000 + 997 * row["id"]),
        })
    print(json.dumps({"rows": len(rows), "opened": sorted(opened, key=lambda r: r["id"])}))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {
        "append": lambda c, t, n: append(c, t, int(n)),
        "read": read,
        "read-table": read_table,
        "tagged": tagged,
        "create": lambda c, t, n: create(c, t, int(n)),
        "create-repartitioned": lambda c, t, n, v: create_repartitioned(c, t, int(n), v),
        "rename-partition-field": rename_partition_field,
        "field-ids": field_ids,
        "evolve": evolve,
        "retype": retype,
        "rogue-nulls": rogue_nulls,
        "delete": delete,
        "add-file": add_file,
        "put-files": lambda c, t, loc, n: put_files(c, t, loc, int(n)),
        "open-files": open_files,
    }[command](*args)
