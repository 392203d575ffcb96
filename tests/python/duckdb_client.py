"""DuckDB as a third Iceberg client of the service's REST catalog:

    duckdb_client.py API TOKEN TABLE

1. POST /uploads; ATTACH the REST catalog of its `connection` with the
   session token, INSERT two rows into the staging table, complete, poll;
2. POST /downloads of TABLE; once ready, ATTACH with the download's read
   token, count its rows and try an INSERT into it (refused).

The extensions load offline from the duckdb_ext package. Prints a JSON
object with what was seen.
"""

import json
import os
import sys

import duckdb
import duckdb_ext
import requests

from api_client import complete, poll


def attach(connection):
    extensions = os.path.join(list(duckdb_ext.__path__)[0], "extensions")
    con = duckdb.connect(config={"extension_directory": extensions, "autoinstall_known_extensions": False})
    con.execute("LOAD iceberg")
    con.execute(f"CREATE SECRET session (TYPE ICEBERG, TOKEN '{connection['token']}')")
    con.execute(f"ATTACH 'icestage' AS lake (TYPE ICEBERG, ENDPOINT '{connection['uri']}', SECRET session)")
    return con


def main(api, token, table):
    auth = {"Authorization": f"Bearer {token}"}
    seen = {}
    upload = requests.post(f"{api}/uploads", json={"table": table}, headers=auth, timeout=30)
    upload.raise_for_status()
    upload = upload.json()
    con = attach(upload["connection"])
    seen["tables"] = [list(row[:3]) for row in con.execute("SHOW ALL TABLES").fetchall()]
    con.execute(
        f"INSERT INTO lake.{upload['staging_table']} VALUES "
        "('txn_d1', 'acct_1', 700, 'usd', TIMESTAMPTZ '2026-07-01 12:00:00+00'), "
        "('txn_d2', 'acct_2', 800, 'eur', TIMESTAMPTZ '2026-07-01 13:00:00+00')"
    )
    con.close()
    seen["upload"] = complete(api, auth, upload["upload_id"])

    download = requests.post(f"{api}/downloads", json={"table": table}, headers=auth, timeout=30)
    download.raise_for_status()
    download = download.json()
    poll(api, auth, f"/downloads/{download['download_id']}", ("ready", "failed"))
    creds = requests.post(f"{api}/downloads/{download['download_id']}/credentials", headers=auth, timeout=30)
    creds.raise_for_status()
    con = attach(creds.json()["connection"])
    seen["download_rows"] = con.execute(f"SELECT count(*) FROM lake.{download['download_table']}").fetchone()[0]
    try:
        con.execute(
            f"INSERT INTO lake.{download['download_table']} "
            f"SELECT * FROM lake.{download['download_table']} LIMIT 1"
        )
        seen["download_insert"] = "allowed"
    except duckdb.Error as e:
        seen["download_insert"] = "refused" if "403" in str(e) or "Forbidden" in str(e) else str(e)[:300]
    print(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:])
