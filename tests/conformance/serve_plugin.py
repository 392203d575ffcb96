"""Points PyIceberg's integration suite at `icestage serve` (a pytest plugin,
loaded by scripts/conformance-pyiceberg.sh with `-p serve_plugin`).

The suite's own `session_catalog` fixture reaches a REST catalog at
localhost:8181 and S3 at localhost:9000 with no token; the runner serves
icestage and moto's S3 there, and gives the token through PyIceberg's
environment configuration (PYICEBERG_CATALOG__LOCAL__TOKEN), so no fixture of
the suite is replaced. What this plugin adds is the list of what is left out,
each with its reason:

- tests that take the `spark` fixture (a Spark Connect server writes or reads
  there) or `session_catalog_hive` (a Hive metastore);
- tests that read tables upstream's Spark provisioning creates
  (`dev/provision.py`), named in PROVISIONED below.
"""

import pytest

# Tables `dev/provision.py` creates with Spark before upstream's suite runs.
PROVISIONED = (
    "test_positional_mor",
    "test_positional_mor_double",
    "test_null_nan",
    "test_null_nan_rewritten",
    "test_limit",
    "test_all_types",
    "test_promote",
    "test_table_version",
    "test_table_sanitized_character",
    "test_table_empty_list_and_map",
    "test_uuid_and_fixed_unpartitioned",
    "test_deletes",
    "test_table_add_column",
)

LEFT_OUT = {
    "spark": "needs a Spark Connect server",
    "session_catalog_hive": "needs a Hive metastore",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, reason in LEFT_OUT.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.skip(reason=reason))
                break
        else:
            source = getattr(getattr(item, "function", None), "__code__", None)
            names = source.co_consts if source is not None else ()
            if any(isinstance(c, str) and c.split(".")[-1] in PROVISIONED for c in names):
                item.add_marker(pytest.mark.skip(reason="reads a table Spark provisions upstream"))
