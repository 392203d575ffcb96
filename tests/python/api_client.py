"""The source design's client, for real, against `icestage serve`:

    api_client.py API TOKEN TABLE ROWS

1. requests.post(/uploads) creates the upload session;
2. requests.post(/uploads/{id}/credentials) gets what reaches the staging table;
3. PyIceberg load_catalog(...) with those properties, append() of a pyarrow
   table built with the staging table's schema;
4. requests.post(/uploads/{id}/complete), then poll GET /uploads/{id} until
   it is promoted (or failed).

Prints the final status as JSON.
"""

import json
import sys
import time

import pyarrow as pa
import requests
from pyiceberg.catalog import load_catalog

from pyiceberg_client import transactions


def main(api, token, table, rows):
    auth = {"Authorization": f"Bearer {token}"}
    session = requests.post(f"{api}/uploads", json={"table": table, "idempotency_key": f"nightly-{rows}"},
                            headers=auth, timeout=30)
    session.raise_for_status()
    session = session.json()
    creds = requests.post(f"{api}/uploads/{session['upload_id']}/credentials", headers=auth, timeout=30)
    creds.raise_for_status()
    props = dict(creds.json()["connection"])
    catalog = load_catalog(props.pop("name"), **props)

    staging = catalog.load_table(session["staging_table"])
    # Use the schema from the staging table the API created for this upload.
    schema = staging.schema().as_arrow()
    staging.append(pa.Table.from_pylist(transactions(rows, schema.names), schema=schema))

    print(json.dumps(complete(api, auth, session["upload_id"])))


def poll(api, auth, path, states):
    """GET `path` every 200 ms until its `state` is one of `states` (or two
    minutes pass); the last body."""
    deadline = time.monotonic() + 120
    while True:
        status = requests.get(f"{api}{path}", headers=auth, timeout=30).json()
        if status["state"] in states or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def complete(api, auth, upload_id):
    """POST /uploads/{id}/complete, then the upload's status once promoted or failed."""
    done = requests.post(f"{api}/uploads/{upload_id}/complete", headers=auth, timeout=30)
    assert done.status_code == 202, done.text
    return poll(api, auth, f"/uploads/{upload_id}", ("promoted", "failed"))


if __name__ == "__main__":
    api, token, table, rows = sys.argv[1:]
    main(api, token, table, int(rows))
