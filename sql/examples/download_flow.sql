-- The download flow on the embedded catalog:
--   cargo run --release -- -f sql/examples/download_flow.sql
-- (uses the table the upload example fills; run that first).

-- The service writes a query's result into a table of its own, reading one
-- snapshot of each source table, and fills it in the background.
CREATE DOWNLOAD WITH (ttl = '2h') AS
SELECT transaction_id, account_id, amount_cents, created_at
FROM payments.transactions
WHERE currency = 'usd' \gset
\echo download :download_id fills :download_table

-- The client waits for it without polling by hand...
SELECT state, rows, files FROM wait_download(:'download_id', '5m');

-- ...and reads it: with PyIceberg through the connection properties, or here.
SELECT mode, table_name FROM vend_credentials(:'download_id');
SELECT * FROM :download_table ORDER BY transaction_id;

-- Done with it.
DROP DOWNLOAD :'download_id';
