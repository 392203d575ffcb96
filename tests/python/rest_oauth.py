"""PyIceberg on icestage's REST catalog with OAuth2 client credentials, the
way Spark, Trino and PyIceberg deployments configure it: `credential` and
no `token`. It lists and loads, waits past its first token's expiry, then
appends and reads again (PyIceberg fetches a new token when the catalog
answers 401).

    rest_oauth.py URI CREDENTIAL TABLE ROWS WAIT_SECONDS

Prints JSON: the tables it listed and the rows it read after its append.
"""

import json
import sys
import time

import pyarrow as pa
from pyiceberg.catalog import load_catalog

from pyiceberg_client import transactions


def main(uri: str, credential: str, table: str, rows: int, wait: float) -> None:
    catalog = load_catalog("icestage", type="rest", uri=uri, credential=credential)
    namespace = table.rsplit(".", 1)[0]
    listed = [".".join(t) for t in catalog.list_tables(namespace)]
    target = catalog.load_table(table)
    time.sleep(wait)
    schema = target.schema().as_arrow()
    target.append(pa.Table.from_pylist(transactions(rows, schema.names), schema=schema))
    read = catalog.load_table(table).scan().to_arrow().num_rows
    print(json.dumps({"tables": listed, "rows": read}))


if __name__ == "__main__":
    uri, credential, table, rows, wait = sys.argv[1:]
    main(uri, credential, table, int(rows), float(wait))
