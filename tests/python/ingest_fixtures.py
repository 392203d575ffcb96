"""Files under a prefix, as the ingestion tests read them.

    ingest_fixtures.py write DIR                    writes the fixtures below DIR
    ingest_fixtures.py upload ENDPOINT BUCKET DIR   puts every file below DIR into BUCKET (same keys)
    ingest_fixtures.py put ENDPOINT BUCKET KEY TEXT puts one object

Fixtures (each CSV-like file holds the same 3 rows unless said otherwise):
    csv/events-1.csv, csv/events-2.csv   rows 1-3 and 4-6
    csv/_SUCCESS                         a marker, never a candidate
    compressed/events.csv.gz .csv.bz2 .csv.xz .csv.zst, compressed/events.ndjson.gz
    json/events.ndjson
    mixed/a.csv, mixed/b.ndjson
    parquet/big.parquet                  300,000 rows, several MB
    empty/_SUCCESS
"""

import bz2
import gzip
import json
import lzma
import os
import sys

import boto3
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = [(1, "alpha", 10.5, "2026-07-01"), (2, "beta", 20.0, "2026-07-02"), (3, "gamma", 30.25, "2026-07-03")]


def csv_text(rows):
    return "id,name,amount,day\n" + "".join(f"{i},{n},{a},{d}\n" for i, n, a, d in rows)


def ndjson_text(rows):
    return "".join(json.dumps({"id": i, "name": n, "amount": a, "day": d}) + "\n" for i, n, a, d in rows)


def write(root):
    def put(path, data):
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())

    put("csv/events-1.csv", csv_text(ROWS))
    put("csv/events-2.csv", csv_text([(i + 3, n, a, d) for i, n, a, d in ROWS]))
    put("csv/_SUCCESS", "")
    text = csv_text(ROWS).encode()
    put("compressed/events.csv.gz", gzip.compress(text))
    put("compressed/events.csv.bz2", bz2.compress(text))
    put("compressed/events.csv.xz", lzma.compress(text))
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(text)
    put("compressed/events.csv.zst", sink.getvalue().to_pybytes())
    put("compressed/events.ndjson.gz", gzip.compress(ndjson_text(ROWS).encode()))
    put("json/events.ndjson", ndjson_text(ROWS))
    put("mixed/a.csv", csv_text(ROWS))
    put("mixed/b.ndjson", ndjson_text(ROWS))
    put("empty/_SUCCESS", "")
    n = 300_000
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "name": pa.array([f"name-{i:08d}-{'x' * 20}" for i in range(n)]),
        "amount": pa.array([i * 0.5 for i in range(n)]),
    })
    os.makedirs(os.path.join(root, "parquet"), exist_ok=True)
    pq.write_table(table, os.path.join(root, "parquet/big.parquet"), compression="none")


def client(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="AKIASERVICEIDENTITY",
                        aws_secret_access_key="service-secret-never-printed")


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "write":
        write(args[0])
    elif command == "upload":
        endpoint, bucket, root = args
        s3 = client(endpoint)
        s3.create_bucket(Bucket=bucket)
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                s3.upload_file(path, bucket, os.path.relpath(path, root))
    elif command == "notify":
        # A bucket whose created objects are announced on an SQS queue;
        # prints the queue's URL.
        endpoint, bucket, queue = args
        s3 = client(endpoint)
        s3.create_bucket(Bucket=bucket)
        sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="AKIASERVICEIDENTITY",
                           aws_secret_access_key="service-secret-never-printed")
        url = sqs.create_queue(QueueName=queue)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]})
        print(url)
    elif command == "queue-depth":
        endpoint, url = args
        sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="AKIASERVICEIDENTITY",
                           aws_secret_access_key="service-secret-never-printed")
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        print(int(attributes["ApproximateNumberOfMessages"])
              + int(attributes["ApproximateNumberOfMessagesNotVisible"]))
    elif command == "put":
        endpoint, bucket, key, text = args
        client(endpoint).put_object(Bucket=bucket, Key=key, Body=text.encode())
    else:
        sys.exit(f"unknown command {command}")
