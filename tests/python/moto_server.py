"""moto's server (a local AWS emulator: S3, STS, IAM, S3 Tables) for the tests.

    moto_server.py [PORT]

Listens on 127.0.0.1 (PORT 0 or none: a free port), prints
`listening on <port>` once ready, and stops when its standard input closes,
so it never outlives the test process that started it.

moto 5.2 answers three S3 Tables calls in shapes the AWS SDK for Rust cannot
parse; they are corrected here before the server starts:
- GetTable: `modifiedBy` is null before the first update (AWS returns the
  creator), and `managedByService` is a boolean (AWS returns a string, absent
  for tables the caller manages);
- UpdateTableMetadataLocation: `namespace` is a string (AWS returns a list).
"""

import json
import sys

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.s3tables.responses import S3TablesResponse


def corrected(method, fix):
    def wrapper(self):
        status, headers, body = method(self)
        if status == 200 and body:
            body = json.dumps(fix(json.loads(body)))
        return status, headers, body

    return wrapper


def fix_get_table(data):
    if data.get("modifiedBy") is None:
        data["modifiedBy"] = data.get("createdBy")
    managed = data.pop("managedByService", None)
    if isinstance(managed, str):
        data["managedByService"] = managed
    return data


def fix_update_location(data):
    if isinstance(data.get("namespace"), str):
        data["namespace"] = [data["namespace"]]
    return data


S3TablesResponse.get_table = corrected(S3TablesResponse.get_table, fix_get_table)
S3TablesResponse.update_table_metadata_location = corrected(
    S3TablesResponse.update_table_metadata_location, fix_update_location
)

if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print(f"listening on {server.get_host_and_port()[1]}", flush=True)
    sys.stdin.read()
    server.stop()
