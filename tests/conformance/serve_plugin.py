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
"""

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
    """Whether `constant` (a string in a test's code) names a provisioned table."""
    if not isinstance(constant, str) or not constant.startswith("default."):
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
}


def requested(item) -> set:
    """The fixtures `item` takes, those its parameters name lazily included."""
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    names.update(getattr(value, "name", None) for value in params.values())
    return names


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, reason in LEFT_OUT.items():
            if fixture in requested(item):
                item.add_marker(pytest.mark.skip(reason=reason))
                break
        else:
            source = getattr(getattr(item, "function", None), "__code__", None)
            names = source.co_consts if source is not None else ()
            if any(provisioned(c) for c in names):
                item.add_marker(pytest.mark.skip(reason="reads a table Spark provisions upstream"))
