"""The S3 endpoint through s3torchconnector (the AWS connector for PyTorch, on the CRT via
mountpoint-s3-client), unchanged: S3MapDataset and S3IterableDataset over 1,000 small objects,
each read back byte for byte through the dataset's reader (sequential, and range-based for a
sample), a DataLoader with worker processes over the map dataset, and S3Checkpoint writing and
reading torch state dicts (one part and several). The objects are put with boto3.
Needs `pip install torch s3torchconnector`. Run: python3 THIS ENDPOINT."""

import hashlib
import io
import os
import sys
import time

# The CRT signs by default and then insists on credentials: any keys do, as hydrant serves a
# loopback client that signs as the anonymous client it is. Set before any client exists.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "any")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "anything-at-all")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

import boto3
import torch
from botocore import UNSIGNED
from botocore.config import Config
from s3torchconnector import (
    S3Checkpoint,
    S3ClientConfig,
    S3IterableDataset,
    S3MapDataset,
    S3ReaderConstructor,
)
from torch.utils.data import DataLoader

endpoint = sys.argv[1]
region = "us-east-1"
bucket = "s3-torchconnector"
prefix = "datasets/train/"
count = 1000
started = time.monotonic()

# Signing with the keys above, and unsigned (S3ClientConfig(unsigned=True)); path style, as
# hydrant serves no virtual-hosted buckets.
signed = S3ClientConfig(force_path_style=True, max_attempts=1)
unsigned = S3ClientConfig(force_path_style=True, unsigned=True, max_attempts=1)

s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name=region,
    config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
)
s3.create_bucket(Bucket=bucket)


def content(i):
    """Object i's bytes: 0 to ~16 KiB, from a seed, so every object differs; object 0 is empty
    (the CRT asks for its first 8 MiB, is answered InvalidRange, and reads it without a range)."""
    size = (i * 7919) % 16411
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


# 1,000 objects under the prefix, a tenth of them a level deeper (a prefix lists them too); a
# few beside it that it must not list.
expected = {}
for i in range(count):
    key = f"{prefix}{'deep/' if i % 10 == 3 else ''}{i:05d}.bin"
    expected[key] = content(i)
    s3.put_object(Bucket=bucket, Key=key, Body=expected[key])
for decoy in ["datasets/train-extra/00000.bin", "datasets/other.bin", "datasets/trainee"]:
    s3.put_object(Bucket=bucket, Key=decoy, Body=b"not in the dataset")
assert len(expected) == count
uri = f"s3://{bucket}/{prefix}"


def check(reader, seen, how):
    data = reader.read()
    assert reader.bucket == bucket, (how, reader.bucket)
    assert reader.key in expected, (how, reader.key)
    assert data == expected[reader.key], (how, reader.key, len(data), len(expected[reader.key]))
    assert reader.tell() == len(data), (how, reader.key)
    assert reader.key not in seen, (how, "listed twice", reader.key)
    seen.add(reader.key)


# S3MapDataset: listed (ListObjectsV2) up front, each item read whole (sequential reader).
mapped = S3MapDataset.from_prefix(uri, region=region, endpoint=endpoint, s3client_config=signed)
assert len(mapped) == count, len(mapped)
seen = set()
for index in range(len(mapped)):
    check(mapped[index], seen, "map")
assert seen == set(expected)

# A prefix over more than one page of ListObjectsV2 (1,000 keys a page): the dataset follows
# the continuation token and lists the decoys beside the 1,000 too.
wider = S3MapDataset.from_prefix(
    f"s3://{bucket}/datasets/", region=region, endpoint=endpoint, s3client_config=signed
)
assert len(wider) == count + 3, len(wider)

# S3IterableDataset: listed as it goes, unsigned.
iterable = S3IterableDataset.from_prefix(uri, region=region, endpoint=endpoint, s3client_config=unsigned)
seen = set()
for reader in iterable:
    check(reader, seen, "iterable")
assert seen == set(expected), (len(seen), len(expected))

# The range-based reader (ranged GETs, and a HEAD for the size) on every tenth item: a
# middle slice after a seek, then the object whole after seeking back.
ranged = S3MapDataset.from_prefix(
    uri,
    region=region,
    endpoint=endpoint,
    s3client_config=signed,
    reader_constructor=S3ReaderConstructor.range_based(),
)
assert len(ranged) == count
ranged_reads = 0
for index in range(0, count, 10):
    reader = ranged[index]
    data = expected[reader.key]
    middle = len(data) // 3
    assert reader.seek(middle) == middle
    assert reader.read(100) == data[middle : middle + 100], reader.key
    assert reader.seek(0) == 0
    assert reader.read() == data, reader.key
    assert reader.seek(0, io.SEEK_END) == len(data), reader.key
    ranged_reads += 1

# A DataLoader with two worker processes over the map dataset, reading in the workers.
def key_and_bytes(reader):
    return reader.key, reader.read()


loaded = S3MapDataset.from_prefix(
    uri, region=region, endpoint=endpoint, s3client_config=signed, transform=key_and_bytes
)
seen = set()
for batch in DataLoader(loaded, batch_size=50, num_workers=2, collate_fn=list):
    for key, data in batch:
        assert data == expected[key], key
        assert key not in seen, key
        seen.add(key)
assert seen == set(expected)

# S3Checkpoint: torch.save into the writer (a multipart upload), torch.load from the reader.
# One state dict within a part, one of ~20 MiB (three parts of 8 MiB); signed and unsigned.
generator = torch.Generator().manual_seed(7)
small_state = {
    "layer.weight": torch.randn(64, 32, generator=generator),
    "layer.bias": torch.randn(64, generator=generator),
    "step": torch.tensor(1234),
    "mask": torch.rand(17, generator=generator) > 0.5,
    "half": torch.randn(9, 3, generator=generator).to(torch.float16),
}
large_state = {
    "embedding": torch.randn(5 << 20, generator=generator),
    "head": torch.randint(0, 1 << 30, (1000, 3), generator=generator),
}
checkpoints = 0
for config, how in [(signed, "signed"), (unsigned, "unsigned")]:
    checkpoint = S3Checkpoint(region=region, endpoint=endpoint, s3client_config=config)
    for name, state in [("small", small_state), ("large", large_state)]:
        uri_of = f"s3://{bucket}/checkpoints/{how}/{name}.pt"
        with checkpoint.writer(uri_of) as writer:
            torch.save(state, writer)
        with checkpoint.reader(uri_of) as reader:
            loaded_state = torch.load(reader, weights_only=True)
        assert loaded_state.keys() == state.keys(), (how, name)
        for key, tensor in state.items():
            assert loaded_state[key].dtype == tensor.dtype, (how, name, key)
            assert torch.equal(loaded_state[key], tensor), (how, name, key)
        # The reader's bytes are the object's, as any S3 client reads them.
        stored = s3.get_object(Bucket=bucket, Key=f"checkpoints/{how}/{name}.pt")["Body"].read()
        with checkpoint.reader(uri_of) as reader:
            assert reader.read() == stored, (how, name)
        checkpoints += 1

print(
    f"s3torchconnector: map and iterable datasets read {count} objects byte-exact, "
    f"{ranged_reads} through the range-based reader, {count} through a 2-worker DataLoader; "
    f"{checkpoints} checkpoints written and loaded equal ({time.monotonic() - started:.1f} s)"
)
