"""The suite's REST catalog address, http://localhost:8181, forwarded to
`icestage serve`'s REST catalog under /iceberg (the suite's fixtures name
the catalog's root, and serve keeps its REST catalog beside its own API).

    proxy.py PORT TARGET TOKEN   # TARGET: http://127.0.0.1:<serve's port>/iceberg

The suite's catalogs are built for a catalog that asks no token (some of
them directly, `RestCatalog("rest", uri=...)`, where no configuration
reaches): a request without a token (PyIceberg sends "Bearer None") gets
TOKEN's. Prints
`proxy ready` once listening; forwards every method, header and body as
they come and answers what serve answered.
"""

import http.server
import sys
import urllib.error
import urllib.request

HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


def main(port: int, target: str, token: str) -> None:
    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            request = urllib.request.Request(target + self.path, data=body, method=self.command)
            for key, value in self.headers.items():
                if key.lower() not in HOP:
                    request.add_header(key, value)
            # PyIceberg without a token sends "Bearer None".
            if request.get_header("Authorization") in (None, "Bearer None"):
                request.add_header("Authorization", f"Bearer {token}")
            try:
                response = urllib.request.urlopen(request, timeout=300)
            except urllib.error.HTTPError as error:
                response = error
            payload = response.read()
            self.send_response(response.status)
            for key, value in response.headers.items():
                if key.lower() not in HOP:
                    self.send_header(key, value)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = forward

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Forward)
    print("proxy ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
