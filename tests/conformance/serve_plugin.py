"""Points PyIceberg's integration suite at `icestage serve` (a pytest plugin,
loaded by scripts/conformance-pyiceberg.sh with `-p serve_plugin`).

The suite's own fixtures reach a REST catalog at localhost:8181 and S3 at
localhost:9000 with no token; the runner serves icestage there (through
proxy.py, which adds the runner's catalog token), so no fixture of the
suite is replaced. What this plugin adds is the list of what is left out,
each with its reason:

- tests that take the `spark` fixture (a Spark Connect server writes or reads
  there) or `session_catalog_hive` / `hive_catalog` (a Hive metastore);
- tests that read tables upstream's Spark provisioning creates
  (`dev/provision.py`), named in PROVISIONED below.

Tests that fail against icestage today are listed in KNOWN_FAILURES, each
with why; they are expected to fail, strictly, so that one that starts
passing fails the run until it is taken off the list.
"""

import os

import pytest

# Tables `dev/provision.py` creates with Spark before upstream's suite runs
# (`default.<name>`; a name ending in `_` or `_v` is a family, e.g. one per
# format version).
PROVISIONED = (
    "test_positional_mor_deletes_v",
    "test_positional_mor_double_deletes_v",
    "test_null_nan",
    "test_null_nan_rewritten",
    "test_limit",
    "test_all_types",
    "test_promote_",
    "test_table_version",
    "test_table_sanitized_character",
    "test_table_empty_list_and_map",
    "test_uuid_and_fixed_unpartitioned",
    "test_incremental_read",
    "test_table_snapshot_operations",
    "test_partitioned_by_",
    "test_empty_scan_ordered_str",
    "test_table_add_column",
)


def provisioned(constant) -> bool:
    """Whether `constant` (a string in a test's code) names a provisioned
    table, with its namespace or without (`f"default.{name}"`)."""
    if not isinstance(constant, str):
        return False
    name = constant.removeprefix("default.")
    return any(
        name.startswith(table) if table.endswith(("_", "_v")) else name == table
        for table in PROVISIONED
    )


LEFT_OUT = {
    "spark": "needs a Spark Connect server",
    "session_catalog_hive": "needs a Hive metastore",
    "hive_catalog": "needs a Hive metastore",
    "table_test_all_types": "reads a table Spark provisions upstream (default.test_all_types)",
}


def requested(item) -> set:
    """The fixtures `item` takes, those its parameters name lazily included."""
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    names.update(getattr(value, "name", None) for value in params.values())
    return names


def constants(values) -> list:
    """`values` (a code object's constants) with the tuples among them
    opened: a test's table names may sit in a tuple of a loop's list."""
    found = []
    for value in values:
        if isinstance(value, tuple):
            found.extend(constants(value))
        else:
            found.append(value)
    return found


def known_failures() -> dict:
    """KNOWN_FAILURES beside this file: test id -> why it fails against
    icestage today (`<test id>  # <reason>` per line)."""
    path = os.path.join(os.path.dirname(__file__), "KNOWN_FAILURES")
    known = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.lstrip().startswith("#"):
                    continue
                test, _, reason = line.partition("#")
                if test.strip():
                    known[test.strip()] = reason.strip() or "fails against icestage today"
    return known


def pytest_collection_modifyitems(config, items):
    # A known failure is expected to fail, strictly: one that passes fails
    # the run, so the list only shrinks.
    known = known_failures()
    for item in items:
        for fixture, reason in LEFT_OUT.items():
            if fixture in requested(item):
                item.add_marker(pytest.mark.skip(reason=reason))
                break
        else:
            source = getattr(getattr(item, "function", None), "__code__", None)
            names = constants(source.co_consts) if source is not None else []
            if any(provisioned(c) for c in names):
                item.add_marker(pytest.mark.skip(reason="reads a table Spark provisions upstream"))
            elif item.nodeid in known:
                item.add_marker(pytest.mark.xfail(reason=known[item.nodeid], strict=True))


def pytest_configure(config):
    """DuckDB's default connection (the suite's `duckdb.sql(...)`) finds its
    extensions in the duckdb-ext packages the runner installs: the suite's
    `INSTALL iceberg` needs no extension server."""
    try:
        import duckdb
        import duckdb_ext
    except ImportError:
        return
    extensions = os.path.join(list(duckdb_ext.__path__)[0], "extensions")
    duckdb.sql(f"SET extension_directory = '{extensions}'")
    duckdb.sql("SET autoinstall_known_extensions = false")
