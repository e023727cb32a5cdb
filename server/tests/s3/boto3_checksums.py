"""The checksums boto3 sends with a PUT come back on GET and HEAD when it asks for them, as S3
returns them: the whole object's, for the algorithm it was sent with, with ChecksumType
FULL_OBJECT; none for a range, none when not asked. boto3 checks a returned checksum against the
bytes it read (and fails the read on a mismatch), so every GET here is also an end-to-end check.
Run by server/tests/s3.rs in two phases with the server killed and started again between them:

    python3 THIS PHASE ENDPOINT

An upload in parts whose parts were sent with checksums of one algorithm answers S3's COMPOSITE
checksum: the checksum of the parts' checksums, then `-` and their count (boto3 does not check
those against the bytes; this script does, from the parts). A Complete that names a part with
another checksum than it was sent with is InvalidPart.

PHASE `write` stores the objects and checks them; `check` (after the restart) checks that the
same checksums come back."""

import base64
import hashlib
import io
import random
import sys
import zlib

import boto3
from botocore import UNSIGNED
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

phase, endpoint = sys.argv[1:]


def client(**options):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}, **options),
    )


s3 = client()
# Asks for checksums only where an operation requires it (GetObject does not).
unasked = client(response_checksum_validation="when_required")
bucket = "s3-checksums"


def error_code(call):
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"]
    raise AssertionError("the call succeeded")


def contents(seed, size):
    return random.Random(seed).randbytes(size)


def crc32(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def digest(name):
    return lambda data: base64.b64encode(hashlib.new(name, data).digest()).decode()


COMPUTE = {"CRC32": crc32, "SHA1": digest("sha1"), "SHA256": digest("sha256")}
small = contents(1, 100_001)
large = contents(2, (9 << 20) + 77)  # more than a chunk: stored as a streamed put
# key: (bytes, algorithm sent, algorithm expected back). boto3 sends a CRC32 when told nothing.
objects = {f"{algorithm}-{size}": (data, algorithm, algorithm) for algorithm in COMPUTE for size, data in [("small", small), ("large", large)]}
objects["default"] = (small, None, "CRC32")


PART_BYTES = 5 << 20
parts = [contents(10 + number, size) for number, size in enumerate([PART_BYTES, PART_BYTES, 1234])]
assembled = b"".join(parts)


def composite(algorithm, pieces):
    """S3's COMPOSITE checksum of an upload of `pieces`."""
    raw = b"".join(base64.b64decode(COMPUTE[algorithm](piece)) for piece in pieces)
    return f"{COMPUTE[algorithm](raw)}-{len(pieces)}"


# key: (algorithm, the parts as uploaded).
uploads = {"multi-SHA256": ("SHA256", parts), "multi-transfer": ("CRC32", parts)}


def check_upload(key):
    algorithm, pieces = uploads[key]
    wanted = (algorithm, composite(algorithm, pieces))
    for answer in (
        s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"),
        s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"),
    ):
        if "Body" in answer:
            assert answer["Body"].read() == b"".join(pieces), key
        assert returned(answer) == wanted, (key, returned(answer), wanted)
        assert answer.get("ChecksumType") == "COMPOSITE", (key, answer.get("ChecksumType"))


def returned(answer):
    """(algorithm, value) of the checksum in a GET's or HEAD's answer, or None."""
    found = [(name[len("Checksum"):], value) for name, value in answer.items() if name.startswith("Checksum") and name != "ChecksumType"]
    assert len(found) <= 1, found
    return found[0] if found else None


def check(key):
    data, _, algorithm = objects[key]
    wanted = (algorithm, COMPUTE[algorithm](data))
    got = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert got["Body"].read() == data, key
    assert returned(got) == wanted, (key, returned(got), wanted)
    assert got.get("ChecksumType") == "FULL_OBJECT", (key, got.get("ChecksumType"))
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert returned(head) == wanted, (key, returned(head), wanted)
    # Not asked for: not sent. A range: not the range's, so none.
    plain = unasked.get_object(Bucket=bucket, Key=key)
    assert plain["Body"].read() == data, key
    assert returned(plain) is None, (key, returned(plain))
    assert returned(unasked.head_object(Bucket=bucket, Key=key)) is None, key
    ranged = s3.get_object(Bucket=bucket, Key=key, Range="bytes=0-99", ChecksumMode="ENABLED")
    assert ranged["Body"].read() == data[:100], key
    assert returned(ranged) is None, (key, returned(ranged))


if phase == "write":
    s3.create_bucket(Bucket=bucket)
    for key, (data, algorithm, expected) in objects.items():
        options = {"ChecksumAlgorithm": algorithm} if algorithm else {}
        put = s3.put_object(Bucket=bucket, Key=key, Body=data, **options)
        assert returned({k: v for k, v in put.items() if k.startswith("Checksum")}) == (expected, COMPUTE[expected](data)), (key, put)
        check(key)
    # A copy holds the source's bytes, and its checksum, whether it keeps the source's
    # metadata or replaces it.
    for directive in ["COPY", "REPLACE"]:
        key = f"copy-{directive}"
        s3.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": "SHA256-small"}, MetadataDirective=directive)
        objects[key] = objects["SHA256-small"]
        check(key)
    # Parts with checksums, by hand and by boto3's transfer manager (CRC32 by default).
    upload = s3.create_multipart_upload(Bucket=bucket, Key="multi-SHA256", ChecksumAlgorithm="SHA256")["UploadId"]
    done = []
    for number, part in enumerate(parts, start=1):
        answer = s3.upload_part(Bucket=bucket, Key="multi-SHA256", UploadId=upload, PartNumber=number, Body=part, ChecksumAlgorithm="SHA256")
        assert answer["ChecksumSHA256"] == COMPUTE["SHA256"](part), answer
        done.append({"PartNumber": number, "ETag": answer["ETag"], "ChecksumSHA256": answer["ChecksumSHA256"]})
    # A part named with a checksum it was not sent with: refused, nothing assembled.
    lying = [dict(part) for part in done]
    lying[1]["ChecksumSHA256"] = COMPUTE["SHA256"](b"other bytes")
    try:
        s3.complete_multipart_upload(Bucket=bucket, Key="multi-SHA256", UploadId=upload, MultipartUpload={"Parts": lying})
        raise AssertionError("a part named with another checksum was taken")
    except ClientError as error:
        assert error.response["Error"]["Code"] == "InvalidPart", error.response
    completed = s3.complete_multipart_upload(Bucket=bucket, Key="multi-SHA256", UploadId=upload, MultipartUpload={"Parts": done})
    assert completed["ChecksumSHA256"] == composite("SHA256", parts), (completed, composite("SHA256", parts))
    assert completed.get("ChecksumType") == "COMPOSITE", completed
    transfer = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES)
    s3.upload_fileobj(io.BytesIO(assembled), bucket, "multi-transfer", Config=transfer)
    for key in uploads:
        check_upload(key)
    # FULL_OBJECT: the checksum of the whole object, given with the Complete (checked against
    # the assembled bytes) or not (computed of them); a wrong one is BadDigest, nothing stored.
    for key, give in [("multi-full-given", True), ("multi-full-computed", False)]:
        upload = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT")["UploadId"]
        done = []
        for number, part in enumerate(parts, start=1):
            answer = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=part, ChecksumAlgorithm="CRC32")
            done.append({"PartNumber": number, "ETag": answer["ETag"], "ChecksumCRC32": answer["ChecksumCRC32"]})
        if give:
            try:
                s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}, ChecksumType="FULL_OBJECT", ChecksumCRC32=crc32(b"other bytes"))
                raise AssertionError("a wrong FULL_OBJECT checksum was taken")
            except ClientError as error:
                assert error.response["Error"]["Code"] == "BadDigest", error.response
            assert error_code(lambda: s3.head_object(Bucket=bucket, Key=key)) == "404", key
        extra = {"ChecksumCRC32": crc32(assembled)} if give else {}
        completed = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": done}, ChecksumType="FULL_OBJECT", **extra)
        assert completed.get("ChecksumCRC32") == crc32(assembled), (key, completed)
        assert completed.get("ChecksumType") == "FULL_OBJECT", completed
        objects[key] = (assembled, "CRC32", "CRC32")
        check(key)
    # A copy is stored whole: it has no parts, so no checksum of them.
    s3.copy_object(Bucket=bucket, Key="multi-copy", CopySource={"Bucket": bucket, "Key": "multi-SHA256"})
    copied = s3.get_object(Bucket=bucket, Key="multi-copy", ChecksumMode="ENABLED")
    assert copied["Body"].read() == assembled
    assert returned(copied) is None, returned(copied)
    # A new version without a checksum (sent as a plain body, no flexible checksum) has none.
    bare = client(request_checksum_calculation="when_required")
    bare.put_object(Bucket=bucket, Key="replaced", Body=small, ChecksumAlgorithm="SHA1")
    bare.put_object(Bucket=bucket, Key="replaced", Body=large[:1000])
    answer = s3.get_object(Bucket=bucket, Key="replaced", ChecksumMode="ENABLED")
    assert answer["Body"].read() == large[:1000]
    assert returned(answer) is None, returned(answer)
elif phase == "check":
    for key in ["multi-full-given", "multi-full-computed"]:
        objects[key] = (assembled, "CRC32", "CRC32")
    for key in list(objects) + ["copy-COPY", "copy-REPLACE"]:
        if key.startswith("copy-"):
            objects[key] = objects["SHA256-small"]
        check(key)
    for key in uploads:
        check_upload(key)
else:
    raise SystemExit(f"unknown phase {phase}")
print("boto3 checksums: ok")
