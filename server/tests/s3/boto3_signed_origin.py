"""Write-back to an S3 origin that checks every request's signature and every checksum (another
hydrant, started with credentials). Run by server/tests/s3.rs in phases, with the FLUSH (a
native-protocol request) between them:

    python3 THIS PHASE HYDRANT_ENDPOINT ORIGIN_ENDPOINT ORIGIN_BUCKET BUCKET ACCESS_KEY SECRET

PHASE is `write` (make the origin's bucket, put through hydrant into its write-back bucket
BUCKET, whose origin is s3://ORIGIN_BUCKET) or `flushed` (after FLUSH: the origin holds each
object byte-exact, with its headers and the checksum its writer sent)."""

import random
import sys

import boto3
from botocore import UNSIGNED
from botocore.config import Config

phase, hydrant_endpoint, origin_endpoint, origin_bucket, bucket, access_key, secret = sys.argv[1:]

hydrant = boto3.client(
    "s3",
    endpoint_url=hydrant_endpoint,
    region_name="us-east-1",
    config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
)
origin = boto3.client(
    "s3",
    endpoint_url=origin_endpoint,
    region_name="us-east-1",
    aws_access_key_id=access_key,
    aws_secret_access_key=secret,
    config=Config(s3={"addressing_style": "path"}),
)

# key: (seed, size, checksum algorithm (None: boto3's default, CRC32), attributes). Each goes to
# the origin in one PUT. (CRC32C and CRC64NVME need botocore's CRT, which the tests do not
# install; hydrant's PUT sends them the same way.)
WRITTEN = {
    "ckpt/step-100/rank-0": (1, 1_000_003, "SHA256", {"ContentType": "application/octet-stream", "Metadata": {"step": "100", "rank": "0"}}),
    "ckpt/step-100/rank-1": (2, (5 << 20) + 17, "CRC32", {"CacheControl": "no-cache", "ContentDisposition": "attachment"}),
    "ckpt/step-100/manifest.json": (3, 4_000, None, {"ContentType": "application/json", "ContentLanguage": "en"}),
    "ckpt/step-100/notes": (4, 777, "SHA1", {"ContentEncoding": "identity", "Metadata": {"by": "test"}}),
}


def contents(seed, size):
    return random.Random(seed).randbytes(size)


def checksums_of(answer):
    return {field: value for field, value in answer.items() if field.startswith("Checksum") and field != "ChecksumType"}


def write_phase():
    origin.create_bucket(Bucket=origin_bucket)
    for key, (seed, size, algorithm, attributes) in WRITTEN.items():
        extra = {"ChecksumAlgorithm": algorithm} if algorithm else {}
        hydrant.put_object(Bucket=bucket, Key=key, Body=contents(seed, size), **extra, **attributes)
    print("written through hydrant")


def flushed_phase():
    for key, (seed, size, algorithm, attributes) in WRITTEN.items():
        got = origin.get_object(Bucket=origin_bucket, Key=key)
        assert got["Body"].read() == contents(seed, size), key
        for field, value in attributes.items():
            assert got.get(field) == value, (key, field, got.get(field), value)
        sent = checksums_of(hydrant.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"))
        assert list(sent) == [f"Checksum{algorithm or 'CRC32'}"], (key, sent)
        kept = checksums_of(origin.head_object(Bucket=origin_bucket, Key=key, ChecksumMode="ENABLED"))
        assert kept == sent, (key, kept, sent)
    print("flushed: every object at the origin, byte-exact, with its headers and checksum")


{"write": write_phase, "flushed": flushed_phase}[phase]()
