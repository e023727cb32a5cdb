"""What the S3 endpoint says of an object beside its bytes, through boto3: ETags as S3 makes them
(the MD5 of the bytes; the MD5 of the parts' MD5s and their count for a multipart upload; the MD5
of the bytes for a copy), Last-Modified as the time of the write (the same from PUT's answer,
GET, HEAD and LIST, and later), and the read conditions on time. Run by server/tests/s3.rs in
two phases with the server killed and started again between them:

    python3 THIS PHASE ENDPOINT STATE_FILE

PHASE `write` stores the objects and checks them, writing what it saw to STATE_FILE; `check`
(after the restart) checks that the same ETags and times come back.

Beside them, each object's attributes: Content-Type (S3's binary/octet-stream where none was
given), Content-Encoding, Content-Disposition, Content-Language, Cache-Control, Expires and
user metadata, from PUT, a streamed PUT, a multipart upload and copies (kept, or replaced with
x-amz-metadata-directive: REPLACE), the same from GET and HEAD and after the restart; metadata
over S3's 2 KB is MetadataTooLarge and nothing is stored."""

import datetime
import hashlib
import json
import os
import random
import sys
import time

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

phase, endpoint, state_file = sys.argv[1:]
s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}),
)
bucket = "s3-metadata"
PART_BYTES = 5 << 20


def contents(seed, size):
    return random.Random(seed).randbytes(size)


def md5_etag(data):
    return '"' + hashlib.md5(data).hexdigest() + '"'


def multipart_etag(parts):
    digests = b"".join(hashlib.md5(part).digest() for part in parts)
    return '"' + hashlib.md5(digests).hexdigest() + f'-{len(parts)}"'


def status_of(call):
    try:
        return call()["ResponseMetadata"]["HTTPStatusCode"]
    except ClientError as error:
        return int(error.response["ResponseMetadata"]["HTTPStatusCode"])


def seen(key):
    """(ETag, Last-Modified as epoch seconds) from HEAD, GET and LIST, which must agree."""
    head = s3.head_object(Bucket=bucket, Key=key)
    got = s3.get_object(Bucket=bucket, Key=key)
    got["Body"].read()
    listed = [o for o in s3.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"] if o["Key"] == key]
    assert len(listed) == 1, listed
    etags = {head["ETag"], got["ETag"], listed[0]["ETag"]}
    times = {head["LastModified"], got["LastModified"], listed[0]["LastModified"]}
    assert len(etags) == 1, (key, etags)
    assert len(times) == 1, (key, times)
    return etags.pop(), times.pop().timestamp()


ATTRIBUTE_FIELDS = ["ContentType", "ContentEncoding", "ContentDisposition", "ContentLanguage", "CacheControl", "Metadata"]


def described(key):
    """The object's attributes from HEAD and GET, which must agree."""
    head = s3.head_object(Bucket=bucket, Key=key)
    got = s3.get_object(Bucket=bucket, Key=key)
    got["Body"].read()
    answers = []
    for answer in (head, got):
        fields = {field: answer.get(field) for field in ATTRIBUTE_FIELDS}
        fields["Expires"] = answer.get("ExpiresString") or (answer["Expires"].isoformat() if "Expires" in answer else None)
        answers.append(fields)
    assert answers[0] == answers[1], (key, answers)
    return answers[0]


small = contents(1, 100_001)
large = contents(2, (9 << 20) + 77)  # more than a chunk: stored as a streamed put
parts = [contents(3, PART_BYTES), contents(4, PART_BYTES), contents(5, 1234)]

if phase == "write":
    s3.create_bucket(Bucket=bucket)
    before = time.time()
    expected = {}
    for key, data in [("small", small), ("large", large)]:
        put = s3.put_object(Bucket=bucket, Key=key, Body=data)
        assert put["ETag"] == md5_etag(data), (key, put["ETag"], md5_etag(data))
        expected[key] = md5_etag(data)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="multi")["UploadId"]
    done = []
    for number, part in enumerate(parts, start=1):
        answer = s3.upload_part(Bucket=bucket, Key="multi", UploadId=upload, PartNumber=number, Body=part)
        assert answer["ETag"] == md5_etag(part), answer["ETag"]
        done.append({"PartNumber": number, "ETag": answer["ETag"]})
    completed = s3.complete_multipart_upload(
        Bucket=bucket, Key="multi", UploadId=upload, MultipartUpload={"Parts": done}
    )
    assert completed["ETag"] == multipart_etag(parts), (completed["ETag"], multipart_etag(parts))
    expected["multi"] = multipart_etag(parts)
    copied = s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "multi"})
    assert copied["CopyObjectResult"]["ETag"] == md5_etag(b"".join(parts)), copied
    expected["copy"] = md5_etag(b"".join(parts))
    after = time.time()

    state = {}
    for key, etag in expected.items():
        got_etag, modified = seen(key)
        assert got_etag == etag, (key, got_etag, etag)
        # The time of the write, to the second (HTTP dates have no finer unit).
        assert int(before) - 1 <= modified <= after + 1, (key, before, modified, after)
        state[key] = [got_etag, modified]
    # The time is the write's, not the answer's: the same a while later.
    time.sleep(1.2)
    for key, (etag, modified) in state.items():
        assert seen(key) == (etag, modified), (key, seen(key), etag, modified)

    # Read conditions on time, as HTTP orders them.
    modified = datetime.datetime.fromtimestamp(state["small"][1], tz=datetime.timezone.utc)
    earlier = modified - datetime.timedelta(seconds=10)
    later = modified + datetime.timedelta(seconds=10)
    for call in (s3.get_object, s3.head_object):
        assert status_of(lambda: call(Bucket=bucket, Key="small", IfModifiedSince=modified)) == 304
        assert status_of(lambda: call(Bucket=bucket, Key="small", IfModifiedSince=later)) == 304
        assert status_of(lambda: call(Bucket=bucket, Key="small", IfModifiedSince=earlier)) == 200
        assert status_of(lambda: call(Bucket=bucket, Key="small", IfUnmodifiedSince=earlier)) == 412
        assert status_of(lambda: call(Bucket=bucket, Key="small", IfUnmodifiedSince=modified)) == 200
        # If-Match decides where it is given, If-None-Match likewise.
        etag = state["small"][0]
        assert status_of(lambda: call(Bucket=bucket, Key="small", IfMatch=etag, IfUnmodifiedSince=earlier)) == 200
        assert status_of(lambda: call(Bucket=bucket, Key="small", IfNoneMatch='"other"', IfModifiedSince=later)) == 200
        assert status_of(lambda: call(Bucket=bucket, Key="small", IfNoneMatch=etag)) == 304
    # A conditional write on the MD5 ETag: the version the writer read, and only it.
    replaced = s3.put_object(Bucket=bucket, Key="cas", Body=b"one")
    assert s3.put_object(Bucket=bucket, Key="cas", Body=b"two", IfMatch=replaced["ETag"])["ETag"] == md5_etag(b"two")
    assert status_of(lambda: s3.put_object(Bucket=bucket, Key="cas", Body=b"three", IfMatch=replaced["ETag"])) == 412
    state["cas"] = [md5_etag(b"two"), seen("cas")[1]]

    # Attributes.
    full = dict(
        ContentType="application/x-tar",
        ContentEncoding="gzip",
        ContentDisposition='attachment; filename="shard-0.tar"',
        ContentLanguage="en",
        CacheControl="max-age=600",
        Expires=datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        Metadata={"epoch": "3", "written-by": "rank-0"},
    )
    s3.put_object(Bucket=bucket, Key="described/small", Body=small, **full)
    s3.put_object(Bucket=bucket, Key="described/large", Body=large, ContentType="application/json", Metadata={"big": "yes"})
    upload = s3.create_multipart_upload(Bucket=bucket, Key="described/multi", ContentType="text/csv", Metadata={"parts": "3"})["UploadId"]
    done = []
    for number, part in enumerate(parts, start=1):
        answer = s3.upload_part(Bucket=bucket, Key="described/multi", UploadId=upload, PartNumber=number, Body=part)
        done.append({"PartNumber": number, "ETag": answer["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key="described/multi", UploadId=upload, MultipartUpload={"Parts": done})
    s3.copy_object(Bucket=bucket, Key="described/kept", CopySource={"Bucket": bucket, "Key": "described/small"})
    s3.copy_object(
        Bucket=bucket, Key="described/replaced", CopySource={"Bucket": bucket, "Key": "described/small"},
        MetadataDirective="REPLACE", ContentType="image/png", Metadata={"copied": "1"},
    )
    # A copy onto itself changes its attributes only with REPLACE (as S3 requires).
    s3.put_object(Bucket=bucket, Key="described/self", Body=b"x", ContentType="text/plain")
    assert status_of(lambda: s3.copy_object(Bucket=bucket, Key="described/self", CopySource={"Bucket": bucket, "Key": "described/self"})) == 400
    s3.copy_object(
        Bucket=bucket, Key="described/self", CopySource={"Bucket": bucket, "Key": "described/self"},
        MetadataDirective="REPLACE", ContentType="text/markdown",
    )
    # A new version without attributes has none (S3's default type), whatever the older had.
    s3.put_object(Bucket=bucket, Key="described/plain", Body=b"old", ContentType="text/plain", Metadata={"old": "1"})
    s3.put_object(Bucket=bucket, Key="described/plain", Body=b"new")
    # Over S3's 2 KB of user metadata: refused, and nothing is stored.
    try:
        s3.put_object(Bucket=bucket, Key="described/too-much", Body=b"x", Metadata={"k": "v" * 2100})
        raise AssertionError("2 KB of metadata was taken")
    except ClientError as error:
        assert error.response["Error"]["Code"] == "MetadataTooLarge", error.response
    assert status_of(lambda: s3.head_object(Bucket=bucket, Key="described/too-much")) == 404
    # The response-* parameters change one answer only.
    overridden = s3.get_object(Bucket=bucket, Key="described/small", ResponseContentType="text/plain", ResponseCacheControl="no-store")
    assert (overridden["ContentType"], overridden["CacheControl"]) == ("text/plain", "no-store"), overridden
    assert overridden["Metadata"] == full["Metadata"], overridden

    def expect(**fields):
        want = {field: None for field in ATTRIBUTE_FIELDS}
        want["ContentType"] = "binary/octet-stream"
        want["Metadata"] = {}
        want["Expires"] = None
        want.update(fields)
        return want

    expires = "Wed, 02 Jan 2030 03:04:05 GMT"
    small_attributes = expect(**{**full, "Expires": expires})
    attributes = {
        "described/small": small_attributes,
        "described/large": expect(ContentType="application/json", Metadata={"big": "yes"}),
        "described/multi": expect(ContentType="text/csv", Metadata={"parts": "3"}),
        "described/kept": small_attributes,
        "described/replaced": expect(ContentType="image/png", Metadata={"copied": "1"}),
        "described/self": expect(ContentType="text/markdown"),
        "described/plain": expect(),
    }
    for key, want in attributes.items():
        got = described(key)
        if got["Expires"] not in (None, want["Expires"]):
            # botocore without ExpiresString parses it into a time.
            got["Expires"] = expires if got["Expires"].startswith("2030-01-02T03:04:05") else got["Expires"]
        assert got == want, (key, got, want)
    state["attributes"] = {key: described(key) for key in attributes}
    with open(state_file, "w") as out:
        json.dump(state, out)
    print("ETags and times: as S3 makes them, from every answer, and stable")
elif phase == "check":
    with open(state_file) as saved:
        state = json.load(saved)
    for key, want in state.pop("attributes").items():
        assert described(key) == want, (key, described(key), want)
    for key, (etag, modified) in state.items():
        assert seen(key) == (etag, modified), (key, seen(key), etag, modified)
    assert hashlib.md5(s3.get_object(Bucket=bucket, Key="large")["Body"].read()).hexdigest() == hashlib.md5(large).hexdigest()
    print("ETags, times and attributes: the same after the server was killed and started again")
else:
    raise SystemExit(f"unknown phase {phase}")
