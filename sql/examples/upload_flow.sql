-- The whole upload flow on the embedded catalog:
--   cargo run --release -- -f sql/examples/upload_flow.sql
-- (a ./warehouse folder is created on first use; run it again and the target
-- gains one more batch of rows).

-- 1. The service owner's target table.
CREATE SCHEMA IF NOT EXISTS payments;
CREATE TABLE IF NOT EXISTS payments.transactions (
    transaction_id VARCHAR NOT NULL,
    account_id     VARCHAR NOT NULL,
    amount_cents   BIGINT  NOT NULL,
    currency       VARCHAR NOT NULL,
    created_at     TIMESTAMP WITH TIME ZONE NOT NULL
) PARTITIONED BY (day(created_at));

-- 2. Open an upload. \gset keeps the columns of its one result row as
--    variables: :upload_id, :staging_table, :connection, ...
CREATE UPLOAD FOR payments.transactions WITH (ttl = '2h') \gset
\echo upload :upload_id stages into :staging_table

-- 3. The client appends rows to the staging table (any Iceberg client can;
--    here icestage itself does).
INSERT INTO :staging_table VALUES
    ('txn_001', 'acct_123', 1299, 'usd', TIMESTAMP '2026-07-01 12:00:00Z'),
    ('txn_002', 'acct_456', 4200, 'usd', TIMESTAMP '2026-07-01 12:05:00Z'),
    ('txn_003', 'acct_123',  250, 'eur', TIMESTAMP '2026-07-02 08:30:00Z');

-- 4. Validate and promote, exactly once.
PROMOTE UPLOAD :'upload_id';

-- 5. The rows are in the target; the upload reports promoted.
SELECT transaction_id, account_id, amount_cents, currency, created_at
FROM payments.transactions
ORDER BY created_at, transaction_id;

SELECT upload_id, state, target_table, rows, files FROM upload_status(:'upload_id');
