"""GETs per second from Python threads, through hydrant's Python package or boto3.

    python3 python_client_bench.py hydrant HOST:PORT BUCKET OBJECTS SIZE THREADS SECONDS
    python3 python_client_bench.py boto3   http://HOST:PORT BUCKET OBJECTS SIZE THREADS SECONDS

Each thread reads objects obj-0..obj-{OBJECTS-1} of BUCKET at random for SECONDS: with one shared
hydrant.Client, each thread reading into a buffer of its own (get_into), or with a boto3 client
per thread (get_object, the body read whole). Prints `gets_per_second=R bytes_per_second=B`;
every answer's length is checked.
"""

import random
import sys
import threading
import time


def main():
    mode, endpoint, bucket, objects, size, threads, seconds = sys.argv[1:8]
    objects, size, threads, seconds = int(objects), int(size), int(threads), float(seconds)
    stop = threading.Event()
    counts = [0] * threads
    errors = []

    if mode == "hydrant":
        import hydrant

        client = hydrant.Client(endpoint)

        def reader(index):
            buffer = bytearray(size)
            chooser = random.Random(index)
            while not stop.is_set():
                read = client.get_into(f"{bucket}/obj-{chooser.randrange(objects)}", buffer)
                if read != size:
                    raise RuntimeError(f"{read} bytes, not {size}")
                counts[index] += 1
    elif mode == "boto3":
        import boto3
        from botocore.config import Config

        config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})

        def reader(index):
            s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench", config=config)
            chooser = random.Random(index)
            while not stop.is_set():
                body = s3.get_object(Bucket=bucket, Key=f"obj-{chooser.randrange(objects)}")["Body"].read()
                if len(body) != size:
                    raise RuntimeError(f"{len(body)} bytes, not {size}")
                counts[index] += 1
    else:
        sys.exit(f"unknown mode {mode}")

    def guarded(index):
        try:
            reader(index)
        except Exception as error:  # reported below
            errors.append(repr(error))
            stop.set()

    workers = [threading.Thread(target=guarded, args=(index,)) for index in range(threads)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    if errors:
        sys.exit(f"{mode} reader: {errors[0]}")
    total = sum(counts)
    print(f"gets_per_second={total / elapsed:.1f} bytes_per_second={total * size / elapsed:.0f}")


if __name__ == "__main__":
    main()
