-- Land the files under a prefix as an Iceberg table, each file exactly once,
-- on the embedded catalog:
--   cargo run --release -- -f sql/examples/prefix_ingest.sql
-- sql/data/orders/ ships with the repository (two CSV files, one gzip'd, and
-- a _SUCCESS marker). The same statements take s3://bucket/prefix/ URIs; the
-- README says how credentials are chosen.

-- 1. What is there? Markers and hidden files are listed but never read.
SELECT kind, uri, size FROM list_s3('sql/data/orders/') ORDER BY uri;

-- 2. The prefix holds three candidate files: reading it without choosing
--    fails and names them. Choose: pin files => '...' or all_files => true.
SELECT * FROM infer_s3_schema('sql/data/orders/', all_files => true);

-- 3. Read in place, without landing anything.
SELECT currency, count(*) AS orders, sum(amount) AS amount
FROM read_s3_prefix('sql/data/orders/', all_files => true)
GROUP BY currency ORDER BY currency;

-- 4. Land every file as the Iceberg table raw.orders (created from the
--    inferred schema), in one commit. Run the script again: the files
--    already loaded are skipped.
COPY INTO raw.orders FROM 'sql/data/orders/' WITH (all_files = true);
SELECT count(*) AS rows_in_raw_orders FROM raw.orders;
