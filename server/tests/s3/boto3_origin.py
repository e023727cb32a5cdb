"""The S3 endpoint in front of an S3 origin (moto's server), through boto3: objects put straight
into the origin are read through hydrant, objects put through hydrant into a write-back bucket
reach the origin after FLUSH, and deletes through hydrant delete at the origin. Run by
server/tests/s3.rs in phases, with the FLUSH (a native-protocol request) between them:

    python3 THIS PHASE HYDRANT_ENDPOINT ORIGIN_ENDPOINT ORIGIN_BUCKET ORIGIN_PREFIX BUCKET

PHASE is `read` (put into the origin, read through hydrant), `write` (put through hydrant, while
hydrant's way to the origin fails every request) or `flushed` (after FLUSH: check the origin's
copies, then delete through hydrant). BUCKET is hydrant's bucket whose origin is
s3://ORIGIN_BUCKET/ORIGIN_PREFIX; ORIGIN_ENDPOINT is the origin itself, not hydrant's way to it."""

import base64
import hashlib
import random
import sys
import zlib

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

CHUNK_BYTES = 4 << 20  # hydrant's chunk: ranges are chosen to cross its boundaries
MULTIPART_ABOVE_BYTES = 16 << 20  # write-back uploads objects above this in parts

phase, hydrant_endpoint, origin_endpoint, origin_bucket, origin_prefix, bucket = sys.argv[1:]

# As docs/s3.md shows it: anonymous, and with boto3's default checksum behaviour.
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
    aws_access_key_id="test",
    aws_secret_access_key="test",
)

# Objects put straight into the origin: one smaller than a chunk, one of several chunks (and
# not a whole number of them).
READ = {"read/small": (1, 100_003), "read/large": (2, (20 << 20) + 12_345)}
# What the origin keeps of them beside their bytes, which hydrant answers too.
READ_ATTRIBUTES = {
    "read/small": {"ContentType": "text/csv", "ContentLanguage": "de", "Metadata": {"source": "origin"}},
    "read/large": {"ContentType": "application/x-tar", "CacheControl": "max-age=5", "Metadata": {"shard": "2"}},
}
# Objects put through hydrant: (seed, size, checksum algorithm or None for boto3's default).
WRITTEN = {
    "written/small-default": (11, 300_001, None),
    "written/medium-sha256": (14, (6 << 20) + 5, "SHA256"),
    "written/large-default": (12, (20 << 20) + 4_321, None),
    "written/large-sha256": (13, (18 << 20) + 77, "SHA256"),
}


# What the written objects say of themselves (none for the last): it reaches the origin with
# them, in one PUT and in parts alike.
ATTRIBUTES = {
    "written/small-default": {"ContentType": "application/json", "CacheControl": "max-age=60", "Metadata": {"epoch": "1"}},
    "written/large-default": {"ContentType": "application/x-tar", "ContentDisposition": "attachment", "Metadata": {"shard": "7", "rank": "0"}},
    "written/large-sha256": {},
    "written/medium-sha256": {"ContentType": "application/octet-stream", "Metadata": {"step": "100"}},
}


def contents(seed, size):
    """The same bytes in every phase (and every run), so that later phases can check them."""
    return random.Random(seed).randbytes(size)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def origin_key(key):
    return f"{origin_prefix}/{key}"


def error_code(call):
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"]
    raise AssertionError("the call succeeded")


def hydrant_listing(prefix):
    """Every (key, size) hydrant lists under prefix, through pages of 2 so that paging is used."""
    found = []
    paginator = hydrant.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix, PaginationConfig={"PageSize": 2}):
        found += [(entry["Key"], entry["Size"]) for entry in page.get("Contents", [])]
    return found


def origin_keys(prefix):
    listing = origin.list_objects_v2(Bucket=origin_bucket, Prefix=origin_key(prefix))
    return sorted(entry["Key"] for entry in listing.get("Contents", []))


def ranges_of(size):
    """(Range header, slice) pairs: the first byte, within a chunk, across chunk boundaries, a
    suffix and an open end."""
    pairs = [("bytes=0-0", slice(0, 1)), ("bytes=-100", slice(size - 100, size))]
    pairs.append((f"bytes={size - 10}-", slice(size - 10, size)))
    if size > 2 * CHUNK_BYTES:
        pairs.append(("bytes=100-5000", slice(100, 5001)))
        start, end = CHUNK_BYTES - 1000, CHUNK_BYTES + 1000
        pairs.append((f"bytes={start}-{end}", slice(start, end + 1)))
        start, end = CHUNK_BYTES + 7, 3 * CHUNK_BYTES + 9
        pairs.append((f"bytes={start}-{end}", slice(start, end + 1)))
    return pairs


def check_ranges(key, data):
    for header, expected in ranges_of(len(data)):
        part = hydrant.get_object(Bucket=bucket, Key=key, Range=header)
        assert part["ResponseMetadata"]["HTTPStatusCode"] == 206, (key, header)
        assert part["ContentLength"] == expected.stop - expected.start, (key, header, part["ContentLength"])
        assert part["Body"].read() == data[expected], (key, header)


def check_whole(key, data):
    got = hydrant.get_object(Bucket=bucket, Key=key)
    assert got["ContentLength"] == len(data), (key, got["ContentLength"], len(data))
    assert sha256(got["Body"].read()) == sha256(data), key


def read_phase():
    assert bucket in [entry["Name"] for entry in hydrant.list_buckets()["Buckets"]]
    hydrant.head_bucket(Bucket=bucket)
    assert origin_keys("") == [], f"the origin bucket starts empty: {origin_keys('')}"
    for key, (seed, size) in READ.items():
        origin.put_object(Bucket=origin_bucket, Key=origin_key(key), Body=contents(seed, size), **READ_ATTRIBUTES[key])

    def check_attributes(key, answer):
        got = {field: answer.get(field) for field in READ_ATTRIBUTES[key]}
        assert got == READ_ATTRIBUTES[key], (key, got, READ_ATTRIBUTES[key])

    for key, (seed, size) in READ.items():
        data = contents(seed, size)
        # What the origin says of the object, hydrant says too: its ETag (S3's MD5) and time,
        # before the object is cached and after.
        at_origin = origin.head_object(Bucket=origin_bucket, Key=origin_key(key))
        said = (at_origin["ETag"], at_origin["LastModified"])
        head = hydrant.head_object(Bucket=bucket, Key=key)
        assert head["ContentLength"] == size, key
        assert (head["ETag"], head["LastModified"]) == said, (key, head, said)
        check_attributes(key, head)
        # Ranges first, while the object is cold (only the chunks touched come from the
        # origin), then the whole object, then the ranges again from what is cached.
        check_ranges(key, data)
        check_whole(key, data)
        check_ranges(key, data)
        got = hydrant.get_object(Bucket=bucket, Key=key)
        got["Body"].read()
        assert (got["ETag"], got["LastModified"]) == said, (key, got, said)
        # From the copy here (the small one) or through again (the large one's chunks).
        check_attributes(key, got)
        check_attributes(key, hydrant.head_object(Bucket=bucket, Key=key))
        listed = hydrant.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"]
        assert [(o["ETag"], o["LastModified"]) for o in listed] == [said], (key, listed, said)
    # A GET with no HEAD before it answers them too, cold and then from the copy here.
    origin.put_object(Bucket=origin_bucket, Key=origin_key("cold/get"), Body=b"cold", ContentType="text/plain", Metadata={"first": "get"})
    for _ in range(2):
        got = hydrant.get_object(Bucket=bucket, Key="cold/get")
        assert got["Body"].read() == b"cold"
        assert (got["ContentType"], got["Metadata"]) == ("text/plain", {"first": "get"}), got
    hydrant.delete_object(Bucket=bucket, Key="cold/get")
    assert error_code(lambda: hydrant.get_object(Bucket=bucket, Key="read/missing")) == "NoSuchKey"
    expected = sorted((key, size) for key, (_, size) in READ.items())
    assert hydrant_listing("read/") == expected, hydrant_listing("read/")
    top = hydrant.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [entry["Prefix"] for entry in top.get("CommonPrefixes", [])] == ["read/"], top
    print("read through: every object, whole and by range, and the listing")


def expected_checksum(algorithm, data):
    if algorithm == "SHA256":
        return base64.b64encode(hashlib.sha256(data).digest()).decode()
    if algorithm == "CRC32":
        return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    return None


def write_phase():
    for key, (seed, size, algorithm) in WRITTEN.items():
        data = contents(seed, size)
        extra = {"ChecksumAlgorithm": algorithm} if algorithm else {}
        answer = hydrant.put_object(Bucket=bucket, Key=key, Body=data, **extra, **ATTRIBUTES[key])
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200, answer
        if algorithm:
            assert answer.get(f"Checksum{algorithm}") == expected_checksum(algorithm, data), answer
        # boto3's default (CRC32 since 1.36, none before): what hydrant verified is echoed.
        for sent in ["CRC32", "SHA256"]:
            if answer.get(f"Checksum{sent}"):
                assert answer[f"Checksum{sent}"] == expected_checksum(sent, data), (key, sent, answer)
        # Served from NVMe while the origin is down.
        check_whole(key, data)
    # Acknowledged without the origin: written back, not through.
    for key in WRITTEN:
        assert error_code(lambda: origin.head_object(Bucket=origin_bucket, Key=origin_key(key))) == "404", key
    print("written through hydrant with the origin down: every object acknowledged and read back")


def origin_object(key):
    """The origin's copy of key: (size, SHA-256, ETag)."""
    got = origin.get_object(Bucket=origin_bucket, Key=origin_key(key))
    body = got["Body"].read()
    assert got["ContentLength"] == len(body), key
    return len(body), sha256(body), got["ETag"].strip('"')


def checksums_of(answer):
    """The whole object's checksums an answer gives, by field name."""
    return {field: value for field, value in answer.items() if field.startswith("Checksum") and field != "ChecksumType"}


def flushed_phase():
    expected_at_origin = sorted(origin_key(key) for key in list(READ) + list(WRITTEN))
    assert origin_keys("") == expected_at_origin, origin_keys("")
    for key, (seed, size, _) in WRITTEN.items():
        data = contents(seed, size)
        at_origin_bytes, at_origin_sha256, etag = origin_object(key)
        assert (at_origin_bytes, at_origin_sha256) == (size, sha256(data)), (key, at_origin_bytes, size)
        if size > MULTIPART_ABOVE_BYTES:
            # S3's ETag of a multipart upload is MD5-of-MD5s, then "-" and the number of parts.
            parts = etag.rsplit("-", 1)
            assert len(parts) == 2 and int(parts[1]) >= 2, f"{key} reached the origin in parts: {etag}"
        else:
            assert etag == hashlib.md5(data).hexdigest(), f"{key} reached the origin in one PUT: {etag}"
        # Its attributes went with it.
        at_origin = origin.head_object(Bucket=origin_bucket, Key=origin_key(key))
        want = {"ContentType": "binary/octet-stream", "Metadata": {}, **ATTRIBUTES[key]}
        got = {field: at_origin.get(field) for field in want}
        assert got == want, (key, got, want)
        # An object that went in one PUT went with the checksum its writer sent, which the
        # origin verified and keeps.
        if size <= MULTIPART_ABOVE_BYTES:
            sent = checksums_of(hydrant.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"))
            assert sent, f"hydrant answers the checksum {key} was written with"
            kept = checksums_of(origin.head_object(Bucket=origin_bucket, Key=origin_key(key), ChecksumMode="ENABLED"))
            assert kept == sent, (key, kept, sent)
    # Every object is still served and listed through hydrant after the FLUSH.
    for key, (seed, size, _) in WRITTEN.items():
        check_whole(key, contents(seed, size))
    expected = sorted((key, size) for key, (_, size, _) in WRITTEN.items())
    assert hydrant_listing("written/") == expected, hydrant_listing("written/")
    expected = sorted([(key, size) for key, (_, size) in READ.items()] + expected)
    assert hydrant_listing("") == expected, hydrant_listing("")

    # Deletes through hydrant delete at the origin before they are answered
    # (docs/architecture.md: DELETE writes the tombstone, then deletes at the origin): no FLUSH.
    hydrant.delete_object(Bucket=bucket, Key="written/small-default")
    hydrant.delete_object(Bucket=bucket, Key="written/medium-sha256")
    hydrant.delete_object(Bucket=bucket, Key="read/small")
    many = ["written/large-default", "written/large-sha256", "read/large"]
    deleted = hydrant.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in many]})
    assert sorted(entry["Key"] for entry in deleted["Deleted"]) == sorted(many), deleted
    assert not deleted.get("Errors"), deleted
    for key in list(READ) + list(WRITTEN):
        assert error_code(lambda: origin.head_object(Bucket=origin_bucket, Key=origin_key(key))) == "404", key
        assert error_code(lambda: hydrant.get_object(Bucket=bucket, Key=key)) == "NoSuchKey", key
    assert origin_keys("") == [], origin_keys("")
    assert hydrant_listing("") == [], hydrant_listing("")
    print("flushed: every write at the origin byte-exact; deletes through hydrant deleted there")


{"read": read_phase, "write": write_phase, "flushed": flushed_phase}[phase]()
