"""hydrant.LocalClient: the same-host path (a region shared with the server), against a real
hydrant-server started with --local-socket."""

import gc
import os

import numpy
import pytest

import hydrant
from conftest import Server


@pytest.fixture(scope="module")
def local_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hydrant-local")
    socket_path = directory / "hydrant.sock"
    running = Server(directory, "--local-socket", str(socket_path))
    running.socket_path = socket_path
    yield running
    running.stop()


def payload(seed: int, size: int) -> bytes:
    return numpy.random.default_rng(seed).integers(0, 256, size, dtype=numpy.uint8).tobytes()


def test_a_read_lands_in_the_region_and_numpy_and_torch_see_it_without_a_copy(local_server):
    client = local_server.client(retries=0)
    data = payload(1, 64 << 20)
    client.put("local/large", data)
    local = hydrant.LocalClient(local_server.socket_path)
    region = local.allocate(64 << 20)
    assert len(region) >= 64 << 20
    info = local.read_into(region, "local/large")
    assert info == hydrant.ReadInfo(len(data), 0, len(data))
    array = numpy.frombuffer(region.buffer, dtype=numpy.uint8)
    assert array[: len(data)].tobytes() == data
    torch = pytest.importorskip("torch")
    tensor = torch.frombuffer(region.buffer, dtype=torch.uint8)
    assert tensor.data_ptr() == array.ctypes.data, "both views are the region itself"
    assert bytes(tensor[:4096].numpy()) == data[:4096]
    # A second read changes what the views show: they are the region, not copies of it.
    client.put("local/small", b"\x07" * 4096)
    local.read_into(region, "local/small")
    assert array[:4096].tobytes() == b"\x07" * 4096
    assert int(tensor[0]) == 7


def test_reads_at_offsets_in_one_batch_and_their_errors(local_server):
    client = local_server.client(retries=0)
    first, second = payload(2, 100_000), payload(3, 200_000)
    client.put("local/first", first)
    client.put("local/second", second)
    local = hydrant.LocalClient(local_server.socket_path)
    region = local.allocate(1 << 20)
    results = local.read_batch(region, [
        ("local/first", 0, 100_000, None),
        ("local/second", 512 << 10, 100_000, (1000, 3000)),
        ("local/missing", 900_000, None, None),
    ])
    assert results[0] == hydrant.ReadInfo(100_000, 0, 100_000)
    assert results[1] == hydrant.ReadInfo(200_000, 1000, 2000)
    assert isinstance(results[2], hydrant.NotFound)
    view = region.memoryview()
    assert bytes(view[:100_000]) == first
    assert bytes(view[512 << 10 : (512 << 10) + 2000]) == second[1000:3000]
    with pytest.raises(hydrant.UsageError):
        local.read_into(region, "local/first", offset=(1 << 20) + 1)
    with pytest.raises(hydrant.HydrantError):
        local.read_into(region, "local/second", offset=(1 << 20) - 10)


def test_a_view_outlives_its_region_object_and_the_region_can_be_freed(local_server):
    local_server.client(retries=0).put("local/kept", b"kept bytes")
    local = hydrant.LocalClient(local_server.socket_path)
    region = local.allocate(4096)
    local.read_into(region, "local/kept")
    array = numpy.frombuffer(region.buffer, dtype=numpy.uint8)
    del region
    gc.collect()
    assert array[:10].tobytes() == b"kept bytes"
    other = local.allocate(4096)
    local.read_into(other, "local/kept")
    view = numpy.frombuffer(other.buffer, dtype=numpy.uint8)
    local.free(other)
    # Freed on the server's side; this side's mapping stays while a view of it lives.
    assert view[:10].tobytes() == b"kept bytes"
    with pytest.raises(hydrant.UsageError):
        local.read_into(other, "local/kept")
    local.free(other)  # twice is harmless


def test_register_cuda_is_a_typed_error_without_a_gpu(local_server):
    local = hydrant.LocalClient(local_server.socket_path)
    region = local.allocate(1 << 20)
    try:
        region.register_cuda()
    except hydrant.CudaUnavailable as error:
        assert str(error)
        assert not region.cuda_registered
    else:
        assert region.cuda_registered


def test_a_local_client_is_not_shared_with_a_forked_child(local_server):
    local = hydrant.LocalClient(local_server.socket_path)
    region = local.allocate(4096)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            local.read_into(region, "local/kept")
            os.write(writer, b"shared")
        except RuntimeError:
            os.write(writer, b"refused")
        finally:
            os._exit(0)
    os.close(writer)
    answer = os.read(reader, 16)
    os.waitpid(child, 0)
    assert answer == b"refused"


def test_a_ring_keeps_several_reads_in_flight_and_hands_each_back_in_order(local_server):
    client = local_server.client(retries=0)
    objects = {f"ring/{index}": payload(100 + index, 300_000 + index * 1000) for index in range(12)}
    for path, data in objects.items():
        client.put(path, data)
    ring = hydrant.ReadRing(local_server.socket_path, slots=3, slot_bytes=1 << 20)
    assert ring.slots == 3
    paths = list(objects)
    for path in paths[:3]:
        ring.submit(path)
    with pytest.raises(hydrant.UsageError):
        ring.submit(paths[3])
    pending = iter(paths[3:])
    seen = []
    while (done := ring.complete()) is not None:
        path = paths[len(seen)]
        assert done.info.written == len(objects[path])
        assert numpy.frombuffer(done.data, dtype=numpy.uint8).tobytes() == objects[path]
        seen.append(path)
        following = next(pending, None)
        if following is not None:
            ring.submit(following)
    assert seen == paths
    ring.submit("ring/missing")
    with pytest.raises(hydrant.NotFound):
        ring.complete()
    ring.submit("ring/0", range=(10, 20))
    done = ring.complete()
    assert bytes(done.data) == objects["ring/0"][10:20]

    # A forked child that drops its inherited ring (say, to make its own) is not hurt by it.
    child = os.fork()
    if child == 0:
        try:
            del ring
            gc.collect()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def shared_written(server) -> float:
    """Bytes written through the same-host socket: from regions and from writers' memory."""
    return (server.metric("hydrant_shared_write_bytes_total")
            + server.metric("hydrant_local_memory_write_bytes_total"))


def test_write_from_stores_region_bytes_with_its_conditions(local_server):
    client = local_server.client(retries=0)
    local = hydrant.LocalClient(local_server.socket_path)
    region = local.allocate(4 << 20)
    data = payload(20, 3_000_000)
    view = region.memoryview()
    view[4096 + 7 : 4096 + 7 + len(data)] = data
    before = shared_written(local_server)
    info = local.write_from(region, "local/written", offset=4096 + 7, length=len(data),
                            if_absent=True)
    assert info.size == len(data) and info.dirty  # the default bucket writes back
    assert client.get("local/written") == data
    assert shared_written(local_server) - before == len(data)

    # Conditions: absent no longer holds; a wrong version is refused, the right one written.
    view[:5] = b"other"
    with pytest.raises(hydrant.PreconditionFailed):
        local.write_from(region, "local/written", 0, 5, if_absent=True)
    with pytest.raises(hydrant.PreconditionFailed):
        local.write_from(region, "local/written", 0, 5, if_version=info.version + 1000)
    assert client.get("local/written") == data
    again = local.write_from(region, "local/written", 0, 5, if_version=info.version)
    assert again.version != info.version and client.get("local/written") == b"other"
    with pytest.raises(ValueError):
        local.write_from(region, "local/written", 0, 5, if_absent=True, if_version=again.version)

    # Outside the region: refused, nothing written.
    with pytest.raises(hydrant.HydrantError):
        local.write_from(region, "local/outside", len(region) - 10, 20)
    with pytest.raises(hydrant.UsageError):
        local.write_from(region, "local/outside", len(region) + 1)
    assert not client.exists("local/outside")
    local.free(region)
    with pytest.raises(hydrant.UsageError):
        local.write_from(region, "local/outside", 0, 5)


def local_client(server, **settings) -> hydrant.Client:
    return hydrant.Client(server.address, retries=0, local_socket=server.socket_path, **settings)


def test_a_client_with_a_local_socket_puts_through_it_from_several_threads(local_server):
    import threading

    client = local_client(local_server, local_write_bytes_max=16 << 20)
    assert client.local_socket == str(local_server.socket_path)
    objects = {f"local-put/{index}": payload(40 + index, (1 << 20) + index * 77_777)
               for index in range(8)}
    before = shared_written(local_server)
    failures = []

    def put(paths):
        try:
            for path in paths:
                data = objects[path]
                # bytes, a NumPy array, and a list of both: all through the region.
                kind = int(path.rsplit("/", 1)[1]) % 3
                if kind == 0:
                    client.put(path, data)
                elif kind == 1:
                    client.put(path, numpy.frombuffer(data, dtype=numpy.uint8))
                else:
                    client.put(path, [data[:1000], numpy.frombuffer(data[1000:], dtype=numpy.uint8)])
        except BaseException as error:  # reported below
            failures.append(error)

    paths = list(objects)
    threads = [threading.Thread(target=put, args=(paths[index::4],)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert shared_written(local_server) - before == sum(len(data) for data in objects.values())
    for path, data in objects.items():
        assert client.get(path) == data, path

    # A file goes through a region; one larger than a region may be goes over TCP. Memory
    # needs no region, so its bound does not apply; objects too small go over TCP.
    before = shared_written(local_server)
    file_data = payload(60, 2 << 20)
    with open(local_server.socket_path.parent / "file.bin", "wb") as file:
        file.write(file_data)
    client.put("local-put/file", local_server.socket_path.parent / "file.bin")
    assert shared_written(local_server) - before == len(file_data)
    small, large = payload(61, 1000), payload(62, (16 << 20) + 1)
    with open(local_server.socket_path.parent / "large.bin", "wb") as file:
        file.write(large)
    client.put("local-put/small", small)
    client.put("local-put/large-file", local_server.socket_path.parent / "large.bin")
    assert shared_written(local_server) - before == len(file_data)
    client.put("local-put/large", large)
    assert shared_written(local_server) - before == len(file_data) + len(large)
    assert client.get("local-put/small") == small and client.get("local-put/large") == large
    assert client.get("local-put/large-file") == large
    before = shared_written(local_server)

    # Pickled (a DataLoader worker), it keeps writing through the socket.
    import pickle

    copy = pickle.loads(pickle.dumps(client))
    assert copy.local_socket == client.local_socket
    copy.put("local-put/copied", file_data)
    assert shared_written(local_server) - before == len(file_data)


def test_a_local_socket_that_cannot_be_reached(local_server, monkeypatch, tmp_path):
    missing = tmp_path / "missing.sock"
    data = payload(70, 1 << 20)
    # Named by the caller: an error, and nothing written.
    client = hydrant.Client(local_server.address, retries=0, local_socket=missing)
    with pytest.raises(hydrant.HydrantError):
        client.put("local-missing/named", data)
    assert not client.exists("local-missing/named")
    # From the environment: passed over, the put goes over TCP.
    monkeypatch.setenv("HYDRANT_LOCAL_SOCKET", str(missing))
    client = hydrant.Client(local_server.address, retries=0)
    assert client.local_socket == str(missing)
    client.put("local-missing/environment", data)
    assert client.get("local-missing/environment") == data
    # The environment's socket is for a server on this host; a socket names one server.
    assert hydrant._is_loopback("127.0.0.1:7700") and hydrant._is_loopback("[::1]:7700")
    assert not hydrant._is_loopback("10.1.2.3:7700")
    with pytest.raises(hydrant.UsageError):
        hydrant.Client([local_server.address, "127.0.0.1:1"], local_socket=missing)


def test_a_dcp_save_writes_through_the_local_socket(local_server):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from hydrant.torch.dcp import StorageReader, StorageWriter

    generator = torch.Generator().manual_seed(12)
    state = {"weight": torch.rand(4 << 20, generator=generator),
             "bias": torch.rand(1 << 20, generator=generator, dtype=torch.float64), "step": 7}
    before = shared_written(local_server)
    checkpoint = "hydrant://local-dcp/step-7"
    dcp.save(state, storage_writer=StorageWriter(checkpoint, servers=local_server.address,
                                                 local_socket=str(local_server.socket_path)),
             no_dist=True)
    assert shared_written(local_server) - before >= (16 << 20) + (8 << 20)
    loaded = {"weight": torch.zeros(4 << 20), "bias": torch.zeros(1 << 20, dtype=torch.float64),
              "step": 0}
    dcp.load(loaded, storage_reader=StorageReader(checkpoint, servers=local_server.address),
             no_dist=True)
    assert torch.equal(loaded["weight"], state["weight"])
    assert torch.equal(loaded["bias"], state["bias"]) and loaded["step"] == 7


def test_write_stores_bytes_from_where_they_lie_in_this_process(local_server):
    client = local_server.client(retries=0)
    local = hydrant.LocalClient(local_server.socket_path)
    head, body = payload(80, 1000), numpy.frombuffer(payload(81, 5 << 20), dtype=numpy.uint8)
    before = shared_written(local_server)
    info = local.write("local-memory/parts", [head, body, b"", memoryview(b"tail")])
    expected = head + body.tobytes() + b"tail"
    assert info.size == len(expected)
    assert client.get("local-memory/parts") == expected
    assert shared_written(local_server) - before == len(expected)
    with pytest.raises(hydrant.PreconditionFailed):
        local.write("local-memory/parts", b"other", if_absent=True)
    local.write("local-memory/parts", b"other", if_version=info.version)
    assert client.get("local-memory/parts") == b"other"
