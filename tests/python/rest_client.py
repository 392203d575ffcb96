"""PyIceberg with `type="rest"` against icestage's REST catalog, as a client
holding one upload's connection would use it, and as one trying to reach
beyond it:

    rest_client.py API TOKEN TABLE ROWS

1. POST /uploads: the `connection` is a REST catalog with a session token;
2. what the token may not do, each refused by the server: load the target
   table or a table of another namespace, change the staging table's schema
   or properties, commit a snapshot whose files lie outside its location;
3. ROWS rows (the staging table's own schema) appended by two writers that
   loaded the same version: the second gets a conflict, reloads and lands;
   then POST /uploads/{id}/complete and poll until promoted.

4. a download of the target, read through the catalog with its read-only
   token, which can neither reach another table nor append.

Prints a JSON object: the refusals seen (exception class and HTTP-derived
message) and the final status.
"""

import json
import sys

import pyarrow as pa
import requests
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.types import StringType

from api_client import complete, poll
from pyiceberg_client import transactions


def refused(what, action):
    try:
        action()
    except Exception as e:  # the server's refusal, as PyIceberg raises it
        return {"what": what, "error": type(e).__name__, "message": str(e)[:300]}
    return {"what": what, "error": None, "message": "allowed"}


def main(api, token, table, rows):
    auth = {"Authorization": f"Bearer {token}"}
    session = requests.post(f"{api}/uploads", json={"table": table}, headers=auth, timeout=30)
    session.raise_for_status()
    session = session.json()
    props = dict(session["connection"])
    assert props["type"] == "rest", props
    catalog = load_catalog(props.pop("name"), **props)

    seen = {
        "namespaces": [list(ns) for ns in catalog.list_namespaces()],
        "tables": [list(t) for t in catalog.list_tables("staging")],
    }
    staging = catalog.load_table(session["staging_table"])
    refusals = [
        refused("load the target table", lambda: catalog.load_table(table)),
        refused("load another namespace's table", lambda: catalog.load_table("icestage.upload_log")),
        refused(
            "add a column",
            lambda: staging.update_schema().add_column("note", StringType()).commit(),
        ),
        refused(
            "set a property",
            lambda: staging.transaction().set_properties({"icestage.target": "payments.refunds"}).commit_transaction(),
        ),
    ]
    seen["refusals"] = refusals
    seen["not_found_is_no_such_table"] = isinstance(
        _error(lambda: catalog.load_table(table)), NoSuchTableError
    )

    # Two writers that loaded the same version: the first append lands, the
    # second is refused as a conflict (409) and lands once it reloads.
    schema = staging.schema().as_arrow()
    records = transactions(rows, schema.names)
    half = rows // 2
    other = catalog.load_table(session["staging_table"])
    staging.append(pa.Table.from_pylist(records[:half], schema=schema))
    try:
        other.append(pa.Table.from_pylist(records[half:], schema=schema))
        seen["race"] = "both committed without a conflict"
    except CommitFailedException as e:
        seen["race"] = type(e).__name__
        other.refresh()
        other.append(pa.Table.from_pylist(records[half:], schema=schema))

    seen["status"] = complete(api, auth, session["upload_id"])
    # Once promoted the session is over: its token opens nothing.
    seen["after"] = refused("load the staging table after promotion", lambda: catalog.load_table(session["staging_table"]))

    # A download of what landed, read through the catalog with a read token.
    download = requests.post(f"{api}/downloads", json={"table": table}, headers=auth, timeout=30)
    download.raise_for_status()
    download = download.json()
    ready = poll(api, auth, f"/downloads/{download['download_id']}", ("ready", "failed"))
    assert ready["state"] == "ready", ready
    creds = requests.post(f"{api}/downloads/{download['download_id']}/credentials", headers=auth, timeout=30)
    creds.raise_for_status()
    props = dict(creds.json()["connection"])
    reader = load_catalog(props.pop("name"), **props)
    ready = reader.load_table(download["download_table"])
    seen["download_rows"] = ready.scan().to_arrow().num_rows
    seen["download_refusals"] = [
        refused("load the target with a read token", lambda: reader.load_table(table)),
        refused(
            "append to the download table",
            lambda: ready.append(ready.scan().to_arrow()),
        ),
    ]
    print(json.dumps(seen))


def _error(action):
    try:
        action()
    except Exception as e:
        return e
    return None


if __name__ == "__main__":
    api, token, table, rows = sys.argv[1:]
    main(api, token, table, int(rows))
