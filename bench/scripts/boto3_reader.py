"""Read every object under a prefix with boto3, as a data loader would, and say how long it took.

    python3 boto3_reader.py ENDPOINT BUCKET PREFIX OBJECTS THREADS

Prints `seconds=S bytes=B crc=C`: the wall time of reading objects PREFIX00000..PREFIX{OBJECTS-1}
with THREADS threads (one boto3 client each), the bytes read, and a CRC32 over the objects'
CRC32s in key order (the same bytes give the same value whichever server answered).
"""

import sys
import threading
import time
import zlib

import boto3
from botocore.config import Config


def main():
    endpoint, bucket, prefix, objects, threads = sys.argv[1:6]
    objects, threads = int(objects), int(threads)
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
                    max_pool_connections=threads)
    crcs = [0] * objects
    sizes = [0] * objects
    errors = []

    def reader(index):
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench",
                              config=config)
        try:
            for number in range(index, objects, threads):
                body = client.get_object(Bucket=bucket, Key=f"{prefix}{number:05}")["Body"].read()
                crcs[number] = zlib.crc32(body)
                sizes[number] = len(body)
        except Exception as error:  # reported below, with the others
            errors.append(repr(error))

    workers = [threading.Thread(target=reader, args=(index,)) for index in range(threads)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.monotonic() - started
    if errors:
        sys.exit(f"boto3 reader: {errors[0]}")
    crc = 0
    for value in crcs:
        crc = zlib.crc32(value.to_bytes(4, "little"), crc)
    print(f"seconds={seconds:.4f} bytes={sum(sizes)} crc={crc:08x}")


if __name__ == "__main__":
    main()
