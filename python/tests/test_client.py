"""hydrant.Client against a real hydrant-server process (conftest.py)."""

import io
import os
import pickle
import socket
import threading

import numpy
import pytest

import hydrant


def payload(seed: int, size: int) -> bytes:
    return numpy.random.default_rng(seed).integers(0, 256, size, dtype=numpy.uint8).tobytes()


def test_put_get_stat_delete_round_trip(client):
    data = payload(1, 300_000)
    info = client.put("pytest/round-trip", data)
    assert info.size == len(data) and info.version > 0
    assert client.get("pytest/round-trip") == data
    assert client.get("hydrant://pytest/round-trip") == data
    stat = client.stat("pytest/round-trip")
    assert (stat.size, stat.version) == (info.size, info.version)
    assert client.exists("pytest/round-trip")
    client.delete("pytest/round-trip")
    assert not client.exists("pytest/round-trip")
    with pytest.raises(hydrant.NotFound) as caught:
        client.get("pytest/round-trip")
    assert isinstance(caught.value, FileNotFoundError)
    assert caught.value.status == 0x11
    assert "round-trip" in str(caught.value) or caught.value.reason


def test_ranges(client):
    data = payload(2, 10_000)
    client.put("pytest/ranged", data)
    assert client.get("pytest/ranged", range=(100, 200)) == data[100:200]
    assert client.get("pytest/ranged", range=(9_000, None)) == data[9_000:]
    assert client.get("pytest/ranged", range=(0, 1)) == data[:1]
    with pytest.raises(hydrant.InvalidRange):
        client.get("pytest/ranged", range=(20_000, 20_010))
    with pytest.raises(hydrant.UsageError):
        client.get("pytest/ranged", range=(5, 1))


def test_get_into_places_a_64_mib_object_in_numpy_and_torch_without_a_copy(server, client):
    data = payload(3, 64 << 20)
    client.put("pytest/large", data)
    expected = numpy.frombuffer(data, dtype=numpy.uint8)
    copied_before = server.metric("hydrant_copied_bytes")

    array = numpy.zeros(64 << 20, dtype=numpy.uint8)
    assert client.get_into("pytest/large", array) == len(data)
    assert numpy.array_equal(array, expected)

    # Any dtype: the bytes land as they are.
    floats = numpy.zeros((64 << 20) // 4, dtype=numpy.float32)
    assert client.get_into("pytest/large", floats) == len(data)
    assert floats.tobytes() == data

    torch = pytest.importorskip("torch")
    tensor = torch.zeros(64 << 20, dtype=torch.uint8)
    assert client.get_into("pytest/large", tensor) == len(data)
    assert bytes(tensor.numpy().tobytes()) == data

    # The server read the object from NVMe into its pinned buffers and sent it from there: no
    # CPU copy on its side for any of the three reads.
    assert server.metric("hydrant_copied_bytes") - copied_before < len(data)


def test_get_into_at_an_offset_and_its_errors(client):
    data = payload(4, 5000)
    client.put("pytest/into", data)
    buffer = bytearray(b"\xee" * 6000)
    assert client.get_into("pytest/into", buffer, offset=1000) == 5000
    assert bytes(buffer[:1000]) == b"\xee" * 1000 and bytes(buffer[1000:]) == data
    ranged = bytearray(10)
    assert client.get_into("pytest/into", ranged, range=(10, 20)) == 10
    assert bytes(ranged) == data[10:20]

    small = bytearray(b"\x01" * 100)
    with pytest.raises(hydrant.BufferTooSmall) as caught:
        client.get_into("pytest/into", small)
    assert caught.value.needed == 5000 and caught.value.capacity == 100
    assert isinstance(caught.value, ValueError)
    assert bytes(small) == b"\x01" * 100, "nothing is written into a buffer too small"
    with pytest.raises(hydrant.UsageError):
        client.get_into("pytest/into", b"read-only bytes")
    with pytest.raises(hydrant.UsageError):
        client.get_into("pytest/into", bytearray(10), offset=11)
    with pytest.raises(hydrant.UsageError):
        client.get_into("pytest/into", numpy.zeros((100, 100), dtype=numpy.uint8)[:, ::2])


def test_put_takes_buffers_files_and_paths(tmp_path, client):
    data = payload(5, 3_000_000)
    sources = {
        "bytearray": bytearray(data),
        "memoryview": memoryview(data),
        "numpy": numpy.frombuffer(data, dtype=numpy.uint8).copy(),
        "bytesio": io.BytesIO(data),
    }
    path = tmp_path / "source.bin"
    path.write_bytes(data)
    for name, source in sources.items():
        assert client.put(f"pytest/put-{name}", source).size == len(data), name
        assert client.get(f"pytest/put-{name}") == data, name
    assert client.put("pytest/put-path", path).size == len(data)
    assert client.put("pytest/put-str", str(path)).size == len(data)
    with open(path, "rb") as file:
        file.seek(1000)
        assert client.put("pytest/put-file", file).size == len(data) - 1000
    for name in ["put-path", "put-str"]:
        assert client.get(f"pytest/{name}") == data
    assert client.get("pytest/put-file") == data[1000:]

    class OnlyRead:
        def __init__(self, data):
            self.stream = io.BytesIO(data)

        def read(self, size=-1):
            return self.stream.read(size)

    assert client.put("pytest/put-read", OnlyRead(data)).size == len(data)
    assert client.get("pytest/put-read") == data


def test_a_put_from_a_pipe_streams_it_without_holding_it_in_memory(client):
    import tracemalloc

    data = payload(6, 64 << 20)
    reader, writer = os.pipe()

    def feed():
        with os.fdopen(writer, "wb") as sink:
            sink.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    tracemalloc.start()
    try:
        with os.fdopen(reader, "rb") as pipe:
            info = client.put("pytest/put-pipe", pipe)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        feeder.join()
    assert info.size == len(data)
    assert client.get("pytest/put-pipe") == data
    # A pipe's size is known only at its end: it is copied to a temporary file a block at a
    # time, never read whole (the data itself was allocated before tracing began).
    assert peak < 8 << 20, f"{peak} bytes held by Python during the PUT"


def test_a_put_of_a_list_sends_every_kind_of_buffer_from_where_it_lies(client):
    import tracemalloc

    whole = payload(7, 48 << 20)
    array = numpy.frombuffer(whole[16 << 20: 32 << 20], dtype=numpy.uint8).copy()
    frozen = numpy.frombuffer(whole[32 << 20: 40 << 20], dtype=numpy.uint8)  # read-only
    parts = [
        whole[: 8 << 20],                                # bytes
        memoryview(whole)[8 << 20: 16 << 20],            # a read-only memoryview of bytes
        array,                                           # a writable array
        frozen,                                          # a read-only array
        bytearray(whole[40 << 20:]),                     # a bytearray
    ]
    tracemalloc.start()
    try:
        info = client.put("pytest/put-buffers", parts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.size == len(whole)
    assert client.get("pytest/put-buffers") == whole
    # None of the 48 MiB was copied on its way (the parts were made before tracing began).
    assert peak < 4 << 20, f"{peak} bytes held by Python during the PUT"


def test_list_pages_lazily_in_key_order(client):
    keys = [f"pytest-list/item-{index:05}" for index in range(2500)]
    for index, key in enumerate(keys):
        client.put(key, index.to_bytes(4, "little"))
    listed = list(client.list("pytest-list/item-", page_size=1000))
    assert [entry.path for entry in listed] == keys
    assert all(entry.size == 4 for entry in listed)
    first = next(iter(client.list("pytest-list", page_size=7)))
    assert first.path == keys[0]
    assert list(client.list("pytest-list/none-")) == []


def test_batch_get_of_a_thousand_keys(client):
    for index in range(1000):
        client.put(f"pytest-batch/{index:04}", payload(index, 1000 + index))
    paths = [f"pytest-batch/{index:04}" for index in range(1000)]
    got = dict(client.batch_get(paths))
    assert len(got) == 1000
    for index, path in enumerate(paths):
        assert got[path] == payload(index, 1000 + index)
    in_order = [path for path, _ in client.batch_get(paths, ordered=True)]
    assert in_order == paths, "ordered: the order of the items"
    # A generator of items is consumed as the iteration goes.
    consumed = []

    def lazily():
        for path in paths * 5:
            consumed.append(path)
            yield path

    stream = client.batch_get(lazily())
    next(stream)
    assert len(consumed) <= hydrant.BATCH_ITEMS_MAX * (hydrant.BATCHES_IN_FLIGHT + 1) < 5000
    assert len(list(stream)) == 4999
    ordered = list(client.batch_get([(paths[5], (10, 20)), "pytest-batch/missing", paths[7]], ordered=True))
    assert ordered[0] == (paths[5], payload(5, 1005)[10:20])
    assert ordered[1][0] == "pytest-batch/missing" and isinstance(ordered[1][1], hydrant.NotFound)
    assert ordered[2] == (paths[7], payload(7, 1007))


def test_one_client_shared_by_four_threads(client):
    failures = []

    def work(thread):
        try:
            for index in range(50):
                data = payload(thread * 1000 + index, 20_000)
                client.put(f"pytest-threads/{thread}/{index}", data)
                assert client.get(f"pytest-threads/{thread}/{index}") == data
        except Exception as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=work, args=(thread,)) for thread in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_a_client_used_after_fork_connects_anew(client):
    data = payload(6, 100_000)
    client.put("pytest/fork", data)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            ok = client.get("pytest/fork") == data
            client.put("pytest/from-child", b"child")
            os.write(writer, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(writer)
    answer = os.read(reader, 16)
    os.waitpid(child, 0)
    assert answer == b"ok"
    # The parent's connections were not disturbed by the child.
    assert client.get("pytest/fork") == data
    assert client.get("pytest/from-child") == b"child"


def test_a_pickled_client_connects_to_the_same_servers(server, client):
    client.put("pytest/pickled", b"pickled")
    copy = pickle.loads(pickle.dumps(client))
    assert copy.servers == [server.address]
    assert copy.get("pytest/pickled") == b"pickled"


def test_flush_and_prefetch_reach_the_origin(server, client):
    data = payload(7, 200_000)
    client.put("pytest-origin/written", data)
    client.flush("pytest-origin", timeout=60)
    assert (server.origin / "pytest-origin" / "written").read_bytes() == data
    (server.origin / "pytest-origin" / "placed").write_bytes(b"placed at the origin")
    objects, size = client.prefetch("pytest-origin/placed")
    assert objects == 1 and size == len(b"placed at the origin")
    assert client.get("pytest-origin/placed") == b"placed at the origin"


def test_errors_name_what_went_wrong(client):
    with pytest.raises(hydrant.UsageError):
        client.get("no-key")
    with pytest.raises(hydrant.InvalidKey):
        client.put("Bad_Bucket!/key", b"x")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(hydrant.ConnectionFailed) as caught:
        hydrant.Client(f"127.0.0.1:{port}", timeout=2, retries=0)
    assert isinstance(caught.value, ConnectionError)
    assert issubclass(hydrant.Busy, hydrant.Retriable)
    assert issubclass(hydrant.OriginUnavailable, hydrant.HydrantError)


def test_servers_and_token_come_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("HYDRANT_SERVER", server.address)
    client = hydrant.Client(retries=0)
    assert client.servers == [server.address]
    client.put("pytest/env", b"env")
    assert client.get("pytest/env") == b"env"


def test_put_measures_files_by_seeking_and_errors_survive_pickling(client, tmp_path):
    import gzip
    import pickle
    import tempfile

    data = payload(8, 100_000)
    packed = tmp_path / "data.gz"
    with gzip.open(packed, "wb") as file:
        file.write(data)
    with gzip.open(packed, "rb") as file:
        assert client.put("pytest/gzip", file).size == len(data), "the decompressed bytes"
    assert client.get("pytest/gzip") == data
    with tempfile.SpooledTemporaryFile(max_size=1 << 20) as spool:
        spool.write(data)
        spool.seek(0)
        client.put("pytest/spooled", spool)
        assert not spool._rolled, "measuring it did not push it to disk"
    assert client.get("pytest/spooled") == data

    client.put("pytest/empty", b"")
    torch = pytest.importorskip("torch")
    assert client.get_into("pytest/empty", torch.empty(0, dtype=torch.uint8)) == 0
    assert client.put("pytest/empty-tensor", torch.empty(0, dtype=torch.uint8)).size == 0

    with pytest.raises(hydrant.NotFound) as caught:
        client.get("pytest/never-stored")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert type(copy) is hydrant.NotFound and copy.status == caught.value.status
    assert str(copy) == str(caught.value)
    small = pickle.loads(pickle.dumps(hydrant.BufferTooSmall("too small", 10, 5)))
    assert (small.needed, small.capacity) == (10, 5)
