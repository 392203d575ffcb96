-- The upload flow on Amazon S3 Tables (here: moto's emulator):
--   icestage --catalog-config sql/examples/s3tables-emulator.toml -f sql/examples/s3tables_flow.sql

CREATE SCHEMA IF NOT EXISTS payments;
CREATE TABLE IF NOT EXISTS payments.transactions (
    transaction_id VARCHAR NOT NULL,
    account_id     VARCHAR NOT NULL,
    amount_cents   BIGINT  NOT NULL,
    created_at     TIMESTAMP WITH TIME ZONE NOT NULL
);

CREATE UPLOAD FOR payments.transactions \gset

-- Credentials that reach this one staging table (sts:AssumeRole with a
-- session policy); the secret columns are left out of this printout.
-- catalog_config holds a catalog file a client can use as is.
SELECT id, mode, table_name, access_key_id, expiration, region
FROM vend_credentials(:'upload_id', 'write', '1h');

-- A client holding only those credentials appends; here the service's own
-- session stands in for it.
INSERT INTO :staging_table VALUES
    ('txn_001', 'acct_123', 1299, TIMESTAMP '2026-07-01 12:00:00Z'),
    ('txn_002', 'acct_456', 4200, TIMESTAMP '2026-07-01 12:05:00Z');

-- S3 Tables deletes a table's storage with the table: promotion copies the
-- staged files into the target's storage (path = copy).
SELECT state, rows, files, path FROM promote_upload(:'upload_id');

SELECT transaction_id, amount_cents FROM payments.transactions ORDER BY transaction_id;
