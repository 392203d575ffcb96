"""The source design's download client, for real, against `icestage serve`:

    download_client.py API TOKEN TABLE [RESUME_FILE]

1. requests.post(/downloads) creates the download; its answer holds the
   connection the client configures its catalog with, at once;
2. before the download is ready, loading its table is refused as not ready;
3. it waits until GET /downloads/{id} says ready;
4. it reads the download table through the catalog it configured in 1.

Prints JSON: what the early load was told, and the rows read. With
RESUME_FILE, the test holds the download pending (a failpoint) until the
client has tried its early load; the client creates that file then.
"""

import json
import sys
import time

import requests
from pyiceberg.catalog import load_catalog


def main(api: str, token: str, table: str, resume: str | None = None) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    session = requests.post(f"{api}/downloads", json={"table": table}, headers=auth, timeout=30)
    session.raise_for_status()
    session = session.json()
    props = dict(session["connection"])
    catalog = load_catalog(props.pop("name"), **props)

    early = None
    try:
        catalog.load_table(session["download_table"])
    except Exception as e:  # the catalog's "not ready" (or the download was quick)
        early = str(e)
    if resume:
        open(resume, "w").close()

    deadline = time.time() + 60
    while True:
        status = requests.get(f"{api}/downloads/{session['download_id']}", headers=auth, timeout=30).json()
        if status["state"] != "pending" or time.time() > deadline:
            break
        time.sleep(0.2)

    rows = catalog.load_table(session["download_table"]).scan().to_arrow()
    print(json.dumps({"state": status["state"], "early": early, "rows": rows.num_rows}))


if __name__ == "__main__":
    main(*sys.argv[1:])
