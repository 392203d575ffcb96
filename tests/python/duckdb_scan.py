"""DuckDB reading an Iceberg table of the embedded catalog from the metadata
file the catalog points at:

    duckdb_scan.py CONNECTION NAMESPACE TABLE COLUMN

CONNECTION is the embedded catalog's connection JSON (its `uri` the SQLite
file). Prints a JSON object with the row count and the sum of COLUMN. The
iceberg extension loads offline from the duckdb_ext package.
"""

import json
import os
import sqlite3
import sys

import duckdb
import duckdb_ext


def metadata_location(connection, namespace, table):
    path = json.loads(connection)["uri"].removeprefix("sqlite://")
    with sqlite3.connect(path) as db:
        (location,) = db.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
            (namespace, table),
        ).fetchone()
    return location


def main(connection, namespace, table, column):
    extensions = os.path.join(list(duckdb_ext.__path__)[0], "extensions")
    con = duckdb.connect(config={"extension_directory": extensions, "autoinstall_known_extensions": False})
    con.execute("LOAD iceberg")
    rows, total = con.execute(
        f'SELECT count(*), sum("{column}") FROM iceberg_scan(?)',
        [metadata_location(connection, namespace, table)],
    ).fetchone()
    print(json.dumps({"rows": rows, "sum": total}))


if __name__ == "__main__":
    main(*sys.argv[1:])
