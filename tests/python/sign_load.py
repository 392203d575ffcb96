"""An open-loop load on the REST catalog's signer, for scripts/bench-signing.sh.

    sign_load.py API TOKEN URI RATE SECONDS

Sends RATE signing requests a second for SECONDS (a GET of URI, as a session
token's client asks for it), each at its scheduled time whether or not the
earlier ones were answered, then the same load on `GET /iceberg/v1/config`
with the same token (the baseline: a request that checks the session and
signs nothing). Latency runs from each request's scheduled time to its
answer, so a stall counts for every request it delays. Prints one JSON line
per load: requests, errors, p50, p99 and max in milliseconds.
"""

import asyncio
import json
import sys
import time

import aiohttp


async def load(session, method, url, body, headers, rate, seconds):
    latencies = []
    errors = 0
    start = time.perf_counter() + 0.2
    total = int(rate * seconds)

    async def one(at):
        nonlocal errors
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            async with session.request(method, url, json=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    errors += 1
        except aiohttp.ClientError:
            errors += 1
        latencies.append((time.perf_counter() - at) * 1000)

    await asyncio.gather(*(one(start + i / rate) for i in range(total)))
    latencies.sort()
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)
    return {"requests": total, "errors": errors, "p50_ms": pick(0.50), "p99_ms": pick(0.99),
            "max_ms": round(latencies[-1], 2)}


async def main(api, token, uri, rate, seconds):
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:
        sign = {"method": "GET", "region": "us-east-1", "uri": uri, "headers": {}}
        # Warm the connections and the service's caches first.
        await load(session, "POST", f"{api}/iceberg/v1/aws/s3/sign", sign, headers, 50, 1)
        signing = await load(session, "POST", f"{api}/iceberg/v1/aws/s3/sign", sign, headers,
                             rate, seconds)
        print(json.dumps({"load": "sign", **signing}))
        baseline = await load(session, "GET", f"{api}/iceberg/v1/config", None, headers,
                              rate, seconds)
        print(json.dumps({"load": "config", **baseline}))


if __name__ == "__main__":
    api, token, uri, rate, seconds = sys.argv[1:]
    asyncio.run(main(api, token, uri, float(rate), float(seconds)))
