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
