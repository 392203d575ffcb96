"""Small AWS set-up steps for the tests, against an emulator endpoint.

    aws_setup.py create-bucket ENDPOINT BUCKET
    aws_setup.py create-table-bucket ENDPOINT NAME    (prints its ARN)
    aws_setup.py put-object ENDPOINT BUCKET KEY TEXT
    aws_setup.py count-objects ENDPOINT BUCKET PREFIX (prints how many)
    aws_setup.py etags ENDPOINT BUCKET PREFIX         (each object's key, size and ETag)
    aws_setup.py signing-identity ENDPOINT BUCKET     (the bucket and an IAM user
        allowed everything, whose keys it prints as JSON; from then on the
        emulator checks the signature and policy of every request)
"""

import json
import sys

import boto3
import requests


def client(service, endpoint):
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="AKIASERVICEIDENTITY",
        aws_secret_access_key="service-secret-never-printed",
    )


if __name__ == "__main__":
    command, endpoint, *args = sys.argv[1:]
    if command == "create-bucket":
        client("s3", endpoint).create_bucket(Bucket=args[0])
        print(f"created {args[0]}")
    elif command == "create-table-bucket":
        print(client("s3tables", endpoint).create_table_bucket(name=args[0])["arn"])
    elif command == "put-object":
        bucket, key, text = args
        client("s3", endpoint).put_object(Bucket=bucket, Key=key, Body=text.encode())
        print(f"put s3://{bucket}/{key}")
    elif command == "count-objects":
        bucket, prefix = args
        pages = client("s3", endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        print(sum(len(page.get("Contents", [])) for page in pages))
    elif command == "etags":
        bucket, prefix = args
        pages = client("s3", endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                print(item["Key"], item["Size"], item["ETag"].strip('"'))
    elif command == "signing-identity":
        client("s3", endpoint).create_bucket(Bucket=args[0])
        iam = client("iam", endpoint)
        iam.create_user(UserName="icestage-signer")
        iam.put_user_policy(
            UserName="icestage-signer",
            PolicyName="everything",
            PolicyDocument=json.dumps({
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
            }),
        )
        key = iam.create_access_key(UserName="icestage-signer")["AccessKey"]
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0").raise_for_status()
        print(json.dumps({
            "access_key_id": key["AccessKeyId"],
            "secret_access_key": key["SecretAccessKey"],
        }))
    else:
        sys.exit(f"unknown command {command}")
