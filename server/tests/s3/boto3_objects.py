"""The S3 endpoint through boto3, unchanged: every object and bucket operation it serves, checked
byte for byte. Run by server/tests/s3.rs against a real hydrant-server: python3 THIS ENDPOINT."""

import hashlib
import os
import sys

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint = sys.argv[1]
anonymous = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}),
)
# An SDK that signs with whatever keys it has: served as the loopback client it is.
signing = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="any",
    aws_secret_access_key="anything-at-all",
)


def error_code(call):
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"]
    raise AssertionError("the call succeeded")


bucket = "s3-boto3"
anonymous.create_bucket(Bucket=bucket)
anonymous.head_bucket(Bucket=bucket)

# Small and large (several chunks) objects, both clients; GET whole and by ranges.
small = b"hello, hydrant"
anonymous.put_object(Bucket=bucket, Key="dir/small.txt", Body=small)
assert anonymous.get_object(Bucket=bucket, Key="dir/small.txt")["Body"].read() == small
large = os.urandom((20 << 20) + 12345)
put = signing.put_object(Bucket=bucket, Key="large.bin", Body=large)
got = signing.get_object(Bucket=bucket, Key="large.bin")
assert got["ContentLength"] == len(large)
assert got["ETag"] == put["ETag"], (got["ETag"], put["ETag"])
assert hashlib.sha256(got["Body"].read()).digest() == hashlib.sha256(large).digest()
for header, expected in [
    ("bytes=0-0", large[:1]),
    ("bytes=5000000-9000000", large[5000000:9000001]),
    ("bytes=-100", large[-100:]),
    (f"bytes={len(large) - 10}-", large[-10:]),
]:
    part = anonymous.get_object(Bucket=bucket, Key="large.bin", Range=header)
    assert part["Body"].read() == expected, header
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206, header
assert error_code(lambda: anonymous.get_object(Bucket=bucket, Key="large.bin", Range=f"bytes={len(large) + 5}-")) == "InvalidRange"

# HEAD and the conditions.
head = anonymous.head_object(Bucket=bucket, Key="large.bin")
assert head["ContentLength"] == len(large)
etag = head["ETag"]
assert anonymous.get_object(Bucket=bucket, Key="large.bin", IfMatch=etag, Range="bytes=0-3")["Body"].read() == large[:4]
assert error_code(lambda: anonymous.get_object(Bucket=bucket, Key="large.bin", IfMatch='"other"')) == "PreconditionFailed"
assert error_code(lambda: anonymous.get_object(Bucket=bucket, Key="large.bin", IfNoneMatch=etag)) == "304"
assert error_code(lambda: anonymous.head_object(Bucket=bucket, Key="missing")) == "404"
assert error_code(lambda: anonymous.get_object(Bucket=bucket, Key="missing")) == "NoSuchKey"

# Conditional writes: create-only, and replace-only-this-version.
assert error_code(lambda: anonymous.put_object(Bucket=bucket, Key="dir/small.txt", Body=b"x", IfNoneMatch="*")) == "PreconditionFailed"
anonymous.put_object(Bucket=bucket, Key="fresh.txt", Body=b"first", IfNoneMatch="*")
first = anonymous.head_object(Bucket=bucket, Key="fresh.txt")["ETag"]
anonymous.put_object(Bucket=bucket, Key="fresh.txt", Body=b"second", IfMatch=first)
assert error_code(lambda: anonymous.put_object(Bucket=bucket, Key="fresh.txt", Body=b"third", IfMatch=first)) == "PreconditionFailed"
assert anonymous.get_object(Bucket=bucket, Key="fresh.txt")["Body"].read() == b"second"

# Integrity: boto3's checksums are verified; a wrong Content-MD5 or checksum stores nothing.
for algorithm in ["CRC32", "SHA1", "SHA256"]:
    key = f"sum-{algorithm}"
    answer = anonymous.put_object(Bucket=bucket, Key=key, Body=small * 100, ChecksumAlgorithm=algorithm)
    assert answer.get(f"Checksum{algorithm}"), answer
    assert anonymous.get_object(Bucket=bucket, Key=key)["Body"].read() == small * 100
assert error_code(lambda: anonymous.put_object(Bucket=bucket, Key="bad-md5", Body=small, ContentMD5="AAAAAAAAAAAAAAAAAAAAAA==")) in ("BadDigest", "InvalidDigest")
assert error_code(lambda: anonymous.put_object(Bucket=bucket, Key="bad-sha", Body=small, ChecksumSHA256="A" * 43 + "=")) in ("BadDigest", "InvalidRequest")
assert error_code(lambda: anonymous.head_object(Bucket=bucket, Key="bad-md5")) == "404"
assert error_code(lambda: anonymous.head_object(Bucket=bucket, Key="bad-sha")) == "404"

# Copy within hydrant.
anonymous.copy_object(Bucket=bucket, Key="copy.bin", CopySource={"Bucket": bucket, "Key": "large.bin"})
assert anonymous.get_object(Bucket=bucket, Key="copy.bin")["Body"].read() == large

# Listings: v2 with delimiter and pages, v1 with markers.
for index in range(25):
    anonymous.put_object(Bucket=bucket, Key=f"many/{index:03}", Body=b"%d" % index)
listing = anonymous.list_objects_v2(Bucket=bucket, Delimiter="/")
assert [p["Prefix"] for p in listing["CommonPrefixes"]] == ["dir/", "many/"], listing
assert sorted(o["Key"] for o in listing["Contents"]) == sorted(
    ["copy.bin", "fresh.txt", "large.bin", "sum-CRC32", "sum-SHA1", "sum-SHA256"]
), listing
keys = []
token = None
while True:
    args = {"Bucket": bucket, "Prefix": "many/", "MaxKeys": 10}
    if token:
        args["ContinuationToken"] = token
    page = anonymous.list_objects_v2(**args)
    keys += [o["Key"] for o in page.get("Contents", [])]
    if not page["IsTruncated"]:
        break
    token = page["NextContinuationToken"]
assert keys == [f"many/{index:03}" for index in range(25)], keys
after = anonymous.list_objects_v2(Bucket=bucket, Prefix="many/", StartAfter="many/020")
assert [o["Key"] for o in after["Contents"]] == [f"many/{index:03}" for index in range(21, 25)]
paginator = anonymous.get_paginator("list_objects")
v1 = [o["Key"] for page in paginator.paginate(Bucket=bucket, Prefix="many/", PaginationConfig={"PageSize": 7}) for o in page["Contents"]]
assert v1 == keys, v1
assert bucket in [b["Name"] for b in anonymous.list_buckets()["Buckets"]]

# Keys that URL encoding changes come back as they were written.
odd = ["odd/a b+c%d.txt", "odd/ünïcode €", "odd/semi;colon&amp=eq"]
for key in odd:
    anonymous.put_object(Bucket=bucket, Key=key, Body=key.encode())
assert [o["Key"] for o in anonymous.list_objects_v2(Bucket=bucket, Prefix="odd/")["Contents"]] == sorted(odd)
for key in odd:
    assert anonymous.get_object(Bucket=bucket, Key=key)["Body"].read() == key.encode()

# Deletes, one and many; a bucket with objects is not deleted.
assert error_code(lambda: anonymous.delete_bucket(Bucket=bucket)) == "BucketNotEmpty"
anonymous.delete_object(Bucket=bucket, Key="copy.bin")
assert error_code(lambda: anonymous.get_object(Bucket=bucket, Key="copy.bin")) == "NoSuchKey"
everything = [o["Key"] for o in anonymous.list_objects_v2(Bucket=bucket)["Contents"]]
deleted = anonymous.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in everything]})
assert sorted(d["Key"] for d in deleted["Deleted"]) == sorted(everything)
assert anonymous.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
anonymous.delete_bucket(Bucket=bucket)

# What is not served answers NotImplemented.
assert error_code(lambda: anonymous.get_bucket_tagging(Bucket=bucket)) == "NotImplemented"
print("boto3: every operation checked")
