"""Multipart uploads through boto3, unchanged: the low-level calls one by one (Create, UploadPart,
ListParts, ListMultipartUploads, Complete, Abort), the errors S3 gives for wrong parts, and
boto3's managed transfer of 100 MiB (upload_fileobj, which sends parts concurrently with its
default checksums). Run by server/tests/s3.rs against a real hydrant-server:

    python3 THIS ENDPOINT begin    starts uploads and leaves one half done (the server is then
                                   killed and started again on the same device)
    python3 THIS ENDPOINT finish   checks that the half-done upload survived and completes it
"""

import hashlib
import io
import os
import sys

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from boto3.s3.transfer import TransferConfig

endpoint, phase = sys.argv[1], sys.argv[2]
s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}),
)
bucket = "s3-multipart"
MIB = 1 << 20


def error_code(call):
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"]
    raise AssertionError("the call succeeded")


def part_bytes(seed, length):
    """Bytes that differ per part, so that a part put in the wrong place is caught."""
    block = hashlib.sha256(b"%d" % seed).digest()
    return (block * (length // len(block) + 1))[:length]


if phase == "begin":
    s3.create_bucket(Bucket=bucket)

    # The calls one by one: three parts (5 MiB, 6 MiB + 1, 7 bytes), sent out of order, part 2
    # sent twice (the second replaces the first).
    key = "checkpoints/step-100/model.pt"
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = {1: part_bytes(1, 5 * MIB), 2: part_bytes(2, 6 * MIB + 1), 3: b"the end"}
    etags = {}
    for number in (3, 1):
        etags[number] = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=parts[number])["ETag"]
    s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=2, Body=b"an earlier part 2")
    etags[2] = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=2, Body=parts[2])["ETag"]
    for number, data in parts.items():
        assert etags[number].strip('"') == hashlib.md5(data).hexdigest(), (number, etags[number])
    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload)
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed["Parts"]] == [
        (number, len(parts[number]), etags[number]) for number in (1, 2, 3)
    ], listed["Parts"]
    page = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload, MaxParts=2)
    assert page["IsTruncated"] and [p["PartNumber"] for p in page["Parts"]] == [1, 2]
    rest = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload, PartNumberMarker=page["NextPartNumberMarker"])
    assert [p["PartNumber"] for p in rest["Parts"]] == [3]

    # Wrong completions are refused and change nothing.
    named = [{"PartNumber": number, "ETag": etags[number]} for number in (1, 2, 3)]
    assert error_code(lambda: s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload,
        MultipartUpload={"Parts": [named[1], named[0], named[2]]})) == "InvalidPartOrder"
    assert error_code(lambda: s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload,
        MultipartUpload={"Parts": [named[0], {"PartNumber": 2, "ETag": '"0123456789abcdef0123456789abcdef"'}]})) == "InvalidPart"
    assert error_code(lambda: s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload,
        MultipartUpload={"Parts": [named[2], {"PartNumber": 4, "ETag": etags[3]}]})) in ("InvalidPart", "EntityTooSmall")
    assert error_code(lambda: s3.get_object(Bucket=bucket, Key=key)) == "NoSuchKey"
    assert error_code(lambda: s3.upload_part(Bucket=bucket, Key=key, UploadId="f" * 32, PartNumber=1, Body=b"x")) == "NoSuchUpload"
    assert error_code(lambda: s3.upload_part(Bucket=bucket, Key="other-key", UploadId=upload, PartNumber=1, Body=b"x")) == "NoSuchUpload"
    assert error_code(lambda: s3.upload_part(Bucket=bucket, Key=key, UploadId="../../x", PartNumber=1, Body=b"x")) == "NoSuchUpload"

    answer = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": named})
    whole = parts[1] + parts[2] + parts[3]
    got = s3.get_object(Bucket=bucket, Key=key)
    assert got["ContentLength"] == len(whole)
    assert got["ETag"] == answer["ETag"], (got["ETag"], answer["ETag"])
    assert got["Body"].read() == whole
    assert s3.get_object(Bucket=bucket, Key=key, Range="bytes=5242870-5242889")["Body"].read() == whole[5242870:5242890]
    assert error_code(lambda: s3.list_parts(Bucket=bucket, Key=key, UploadId=upload)) == "NoSuchUpload"

    # Abort: the parts go, the object never appears.
    aborted = s3.create_multipart_upload(Bucket=bucket, Key="aborted.bin")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="aborted.bin", UploadId=aborted, PartNumber=1, Body=part_bytes(9, MIB))
    s3.abort_multipart_upload(Bucket=bucket, Key="aborted.bin", UploadId=aborted)
    assert error_code(lambda: s3.list_parts(Bucket=bucket, Key="aborted.bin", UploadId=aborted)) == "NoSuchUpload"
    assert error_code(lambda: s3.head_object(Bucket=bucket, Key="aborted.bin")) == "404"

    # boto3's managed transfer: 100 MiB in 8 MiB parts, 10 at once, with its default checksum.
    data = os.urandom(100 * MIB)
    config = TransferConfig(multipart_threshold=8 * MIB, multipart_chunksize=8 * MIB, max_concurrency=10)
    s3.upload_fileobj(io.BytesIO(data), bucket, "datasets/shard-000.tar", Config=config)
    head = s3.head_object(Bucket=bucket, Key="datasets/shard-000.tar")
    assert head["ContentLength"] == len(data)
    out = io.BytesIO()
    s3.download_fileobj(bucket, "datasets/shard-000.tar", out, Config=config)
    assert hashlib.sha256(out.getvalue()).digest() == hashlib.sha256(data).digest()

    # One upload left half done across a restart: two parts in, listed.
    pending = s3.create_multipart_upload(Bucket=bucket, Key="pending/across-restart.bin")["UploadId"]
    for number in (1, 2):
        s3.upload_part(Bucket=bucket, Key="pending/across-restart.bin", UploadId=pending, PartNumber=number, Body=part_bytes(10 + number, 5 * MIB))
    other = s3.create_multipart_upload(Bucket=bucket, Key="elsewhere/x.bin")["UploadId"]
    uploads = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert sorted((u["Key"], u["UploadId"]) for u in uploads) == sorted(
        [("elsewhere/x.bin", other), ("pending/across-restart.bin", pending)]
    ), uploads
    only = s3.list_multipart_uploads(Bucket=bucket, Prefix="pending/")["Uploads"]
    assert [u["UploadId"] for u in only] == [pending]
    grouped = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert sorted(p["Prefix"] for p in grouped["CommonPrefixes"]) == ["elsewhere/", "pending/"], grouped
    s3.abort_multipart_upload(Bucket=bucket, Key="elsewhere/x.bin", UploadId=other)
    print(pending)
elif phase == "finish":
    pending = sys.argv[3]
    key = "pending/across-restart.bin"
    uploads = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [(key, pending)], uploads
    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=pending)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in listed] == [(1, 5 * MIB), (2, 5 * MIB)], listed
    third = s3.upload_part(Bucket=bucket, Key=key, UploadId=pending, PartNumber=3, Body=b"last")["ETag"]
    named = [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in listed] + [{"PartNumber": 3, "ETag": third}]
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=pending, MultipartUpload={"Parts": named})
    got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert got == part_bytes(11, 5 * MIB) + part_bytes(12, 5 * MIB) + b"last"
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    print("boto3 multipart: every operation checked, and an upload survived a restart")
else:
    raise SystemExit(f"unknown phase {phase}")
