"""Query planning: icestage's shell against DataFusion's Python wheel of the
same major version, on one query with several CTEs, joins and subqueries
over inline VALUES (so no table or catalog is read: only parsing, analysis,
optimisation and physical planning are timed).

    compare_plan.py --icestage PATH [--plans N] [--runs R]

Each side plans the query N times in one process (EXPLAIN, whose result is
the plan); a process planning it once is timed too and subtracted, so
start-up is left out. Prints the per-plan time of each side, best of R
runs, and their ratio (icestage / DataFusion)."""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERY = """
WITH orders AS (
    SELECT * FROM (VALUES (1, 10, 'open', 120.5), (2, 11, 'paid', 80.0),
                          (3, 10, 'paid', 42.0), (4, 12, 'void', 7.5))
        AS o(order_id, customer_id, status, amount)
), customers AS (
    SELECT * FROM (VALUES (10, 'ada', 'eu'), (11, 'bob', 'us'), (12, 'cy', 'eu'))
        AS c(customer_id, name, region)
), payments AS (
    SELECT * FROM (VALUES (1, 100.0), (2, 80.0), (3, 40.0), (3, 2.0))
        AS p(order_id, paid)
), paid_orders AS (
    SELECT o.order_id, o.customer_id, o.amount, sum(p.paid) AS paid
    FROM orders o JOIN payments p ON o.order_id = p.order_id
    WHERE o.status <> 'void'
    GROUP BY o.order_id, o.customer_id, o.amount
), by_region AS (
    SELECT c.region, count(*) AS orders, sum(po.paid) AS paid,
           avg(po.amount) AS average
    FROM paid_orders po JOIN customers c ON po.customer_id = c.customer_id
    GROUP BY c.region
)
SELECT r.region, r.orders, r.paid, r.average,
       (SELECT max(amount) FROM orders o2
         WHERE o2.customer_id IN (SELECT customer_id FROM customers c2
                                  WHERE c2.region = r.region)) AS largest
FROM by_region r
WHERE r.paid > (SELECT avg(paid) / 2 FROM paid_orders)
  AND EXISTS (SELECT 1 FROM customers c3 WHERE c3.region = r.region
              AND c3.name LIKE '%a%')
ORDER BY r.paid DESC
LIMIT 10
"""


def icestage_seconds(binary: str, plans: int) -> float:
    with tempfile.TemporaryDirectory() as work:
        script = Path(work) / "plan.sql"
        script.write_text(("EXPLAIN " + QUERY.strip() + ";\n") * plans)
        start = time.perf_counter()
        subprocess.run(
            [binary, "--warehouse", str(Path(work) / "warehouse"), "-q",
             "--format", "csv", "-f", str(script)],
            check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def datafusion_seconds(plans: int) -> float:
    code = (
        "import datafusion\n"
        "ctx = datafusion.SessionContext()\n"
        f"query = {('EXPLAIN ' + QUERY.strip())!r}\n"
        f"for _ in range({plans}):\n"
        "    ctx.sql(query).collect()\n"
    )
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def per_plan(run, plans: int, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        best = min(best, (run(plans) - run(1)) / (plans - 1))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--icestage", required=True)
    parser.add_argument("--plans", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    import datafusion
    ours = per_plan(lambda n: icestage_seconds(args.icestage, n), args.plans, args.runs)
    theirs = per_plan(datafusion_seconds, args.plans, args.runs)
    print(f"planning one query ({args.plans} plans a process, best of {args.runs}):")
    print(f"  icestage           {ours * 1000:8.2f} ms")
    print(f"  datafusion {datafusion.__version__:7} {theirs * 1000:8.2f} ms")
    print(f"  ratio (icestage / DataFusion): {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
