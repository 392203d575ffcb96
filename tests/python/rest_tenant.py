"""PyIceberg on one tenant's catalog of a multi-tenant `icestage serve`:
`warehouse` chooses the catalog (the service answers its prefix in
/v1/config), as with Polaris or Lakekeeper.

    rest_tenant.py URI TOKEN WAREHOUSE TABLE

Prints JSON: the rows PyIceberg read, or the error it got.
"""

import json
import sys

from pyiceberg.catalog import load_catalog


def main(uri: str, token: str, warehouse: str, table: str) -> None:
    try:
        catalog = load_catalog("icestage", type="rest", uri=uri, token=token, warehouse=warehouse)
        rows = catalog.load_table(table).scan().to_arrow().num_rows
        print(json.dumps({"rows": rows}))
    except Exception as e:  # the test checks what the client was told
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))


if __name__ == "__main__":
    main(*sys.argv[1:])
