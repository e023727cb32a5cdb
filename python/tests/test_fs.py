"""hydrant.fs.HydrantFileSystem (fsspec) against a real hydrant-server: fsspec's own abstract
tests, the operations one by one, and PyArrow reading Parquet through it."""

import itertools
import posixpath

import fsspec
import pytest
from fsspec.tests import abstract

import hydrant
from hydrant.fs import HydrantFileSystem

_counter = itertools.count()


@pytest.fixture()
def hfs(server):
    return HydrantFileSystem(servers=server.address, retries=0, skip_instance_cache=True)


class HydrantFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, server):
        filesystem = HydrantFileSystem(servers=server.address, retries=0, skip_instance_cache=True)
        yield filesystem
        filesystem.invalidate_cache()

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self):
        # A fresh directory per test: keys are never shared between tests.
        return f"fsspec-abstract/run-{next(_counter)}"

    @pytest.fixture
    def supports_empty_directories(self):
        return False


class TestHydrantCopy(abstract.AbstractCopyTests, HydrantFixtures):
    pass


class TestHydrantGet(abstract.AbstractGetTests, HydrantFixtures):
    pass


class TestHydrantPut(abstract.AbstractPutTests, HydrantFixtures):
    pass


class TestHydrantPipe(abstract.AbstractPipeTests, HydrantFixtures):
    pass


class TestHydrantOpen(abstract.AbstractOpenTests, HydrantFixtures):
    pass


def test_the_protocol_is_registered_and_reads_and_writes(server):
    fs = fsspec.filesystem("hydrant", servers=server.address)
    assert isinstance(fs, HydrantFileSystem)
    with fsspec.open("hydrant://fs-basic/dir/file.bin", "wb", servers=server.address) as file:
        file.write(b"a" * 1000)
        file.write(b"b" * (20 << 20))
    with fsspec.open("hydrant://fs-basic/dir/file.bin", "rb", servers=server.address) as file:
        assert file.read(1000) == b"a" * 1000
        file.seek(1000 + (10 << 20))
        assert file.read(5) == b"bbbbb"
    assert fs.info("fs-basic/dir/file.bin")["size"] == 1000 + (20 << 20)
    assert fs.info("fs-basic/dir")["type"] == "directory"
    with pytest.raises(FileNotFoundError):
        fs.info("fs-basic/nothing")


def test_cat_ranges_ls_find_glob_rm(hfs):
    for index in range(5):
        hfs.pipe_file(f"fs-ops/a/{index}.txt", f"file {index}".encode())
    hfs.pipe_file("fs-ops/b/deep/x.txt", b"deep")
    assert hfs.cat_file("fs-ops/a/3.txt") == b"file 3"
    assert hfs.cat_file("fs-ops/a/3.txt", start=2, end=4) == b"le"
    assert hfs.cat_file("fs-ops/a/3.txt", start=-1) == b"3"
    assert hfs.cat_ranges(["fs-ops/a/1.txt", "fs-ops/a/2.txt", "fs-ops/none"], [0, 5, 0], [4, None, 1]) [:2] == [b"file", b"2"]
    missing = hfs.cat_ranges(["fs-ops/none"], [0], [1])[0]
    assert isinstance(missing, hydrant.NotFound)
    assert hfs.ls("fs-ops", detail=False) == ["fs-ops/a", "fs-ops/b"]
    assert sorted(hfs.find("fs-ops/a")) == [f"fs-ops/a/{index}.txt" for index in range(5)]
    assert hfs.glob("fs-ops/*/deep/*.txt") == ["fs-ops/b/deep/x.txt"]
    assert hfs.exists("fs-ops/b") and hfs.isdir("fs-ops/b") and hfs.isfile("fs-ops/b/deep/x.txt")
    hfs.rm("fs-ops/a", recursive=True)
    assert hfs.find("fs-ops/a") == []
    assert hfs.exists("fs-ops/b/deep/x.txt")


def test_pyarrow_reads_parquet_through_the_filesystem(hfs):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    table = pyarrow.table({"step": list(range(10_000)), "loss": [1.0 / (1 + step) for step in range(10_000)]})
    with hfs.open("fs-parquet/metrics.parquet", "wb") as file:
        parquet.write_table(table, file)
    read = parquet.read_table("fs-parquet/metrics.parquet", filesystem=hfs)
    assert read.equals(table)
    column = parquet.read_table("fs-parquet/metrics.parquet", filesystem=hfs, columns=["loss"])
    assert column.column("loss").to_pylist() == table.column("loss").to_pylist()


def test_append_is_refused_and_cat_ranges_keeps_each_items_outcome(hfs):
    hfs.pipe_file("fs-edge/a", b"0123456789")
    with pytest.raises(NotImplementedError):
        hfs.open("fs-edge/a", "ab")
    assert hfs.cat_file("fs-edge/a") == b"0123456789"
    out = hfs.cat_ranges(["fs-edge/a", "fs-edge/none", "fs-edge/a", "fs-edge/a", "fs-edge/a"],
                         [0, 0, 8, 20, 5], [2, 1, 10, 30, 3])
    assert out[0] == b"01" and isinstance(out[1], hydrant.NotFound)
    assert out[2] == b"89" and out[3] == b"" and out[4] == b""


def test_a_file_larger_than_its_memory_spool_is_written_whole(server):
    filesystem = HydrantFileSystem(servers=server.address, retries=0, skip_instance_cache=True,
                                   write_spool_bytes=4096)
    assert filesystem.write_spool_bytes == 4096
    data = bytes(range(256)) * 1000
    with filesystem.open("fs-spool/big", "wb", block_size=5000) as file:
        for start in range(0, len(data), 3000):
            file.write(data[start:start + 3000])
        assert file._spill is not None, "past 4 KiB the writes went to a temporary file"
    assert server.client(retries=0).get("fs-spool/big") == data


def test_writes_of_every_size_and_layout_gather_into_one_exact_put(server):
    import numpy

    filesystem = HydrantFileSystem(servers=server.address, retries=0, skip_instance_cache=True)
    # Over 2 MiB of small writes: they fill and close gathered blocks more than once.
    small = [bytes([index]) * (index * 120 + 1) for index in range(200)]
    large = numpy.arange(3 << 18, dtype=numpy.uint32)          # 3 MiB, contiguous
    strided = numpy.arange(1 << 18, dtype=numpy.uint64)[::2]    # 1 MiB, not contiguous
    expected = b"".join(small) + large.tobytes() + b"tail" + strided.tobytes() + b"".join(small)
    with filesystem.open("fs-gather/mixed", "wb") as file:
        for piece in small:
            file.write(piece)
        assert file.write(memoryview(large)) == large.nbytes
        file.write(bytearray(b"tail"))
        assert file.write(strided) == strided.nbytes
        for piece in small:
            file.write(memoryview(piece))
        assert file.tell() == len(expected)
        assert file._spill is None, "under the spool size everything stays in memory"
    assert server.client(retries=0).get("fs-gather/mixed") == expected
    with filesystem.open("fs-gather/empty", "wb"):
        pass
    assert server.client(retries=0).get("fs-gather/empty") == b""


def test_a_write_left_by_an_exception_stores_nothing_and_keeps_the_old_object(server):
    filesystem = HydrantFileSystem(servers=server.address, retries=0, skip_instance_cache=True,
                                   write_spool_bytes=4096)
    client = server.client(retries=0)
    client.put("fs-abort/kept", b"the previous version")
    for key in ("fs-abort/kept", "fs-abort/new"):
        with pytest.raises(RuntimeError):
            with filesystem.open(key, "wb") as file:
                file.write(b"x" * 10_000)  # past the spool size: in a temporary file
                raise RuntimeError("the writer failed part-way")
        assert file.closed
    assert client.get("fs-abort/kept") == b"the previous version"
    with pytest.raises(hydrant.NotFound):
        client.get("fs-abort/new")


def test_put_takes_a_list_of_buffers_and_stores_them_one_after_another(server):
    client = server.client(retries=0)
    info = client.put("fs-gather/list", [b"ab", bytearray(b"cd"), memoryview(b"ef"), b""])
    assert info.size == 6
    assert client.get("fs-gather/list") == b"abcdef"
    client.put("fs-gather/tuple", (b"x" * (5 << 20), b"y"))
    assert client.get("fs-gather/tuple") == b"x" * (5 << 20) + b"y"


def write_and_fail(filesystem, key):
    """Open `key` for writing, write part of it, and leave the `with` by an exception."""
    with pytest.raises(RuntimeError):
        with filesystem.open(key, "wb") as file:
            file.write(b"part of it")
            raise RuntimeError("this file's writer failed")


def test_a_transaction_stores_its_files_at_commit_and_none_when_rolled_back(server, tmp_path):
    filesystem = HydrantFileSystem(servers=server.address, retries=0, skip_instance_cache=True,
                                   write_spool_bytes=4096)
    client = server.client(retries=0)
    client.put("fs-transaction/kept", b"the previous version")
    local = tmp_path / "local.bin"
    local.write_bytes(b"from a local file")
    # Left by an exception: none of its writes is stored, whichever way each was made.
    with pytest.raises(RuntimeError):
        with filesystem.transaction:
            with filesystem.open("fs-transaction/kept", "wb") as file:
                file.write(b"y" * 10_000)  # past the spool size: in a temporary file
            filesystem.pipe_file("fs-transaction/piped", b"piped")
            filesystem.put_file(str(local), "fs-transaction/put")
            write_and_fail(filesystem, "fs-transaction/failed")
            assert client.get("fs-transaction/kept") == b"the previous version"
            raise RuntimeError("the transaction failed")
    assert client.get("fs-transaction/kept") == b"the previous version"
    for key in ("piped", "put", "failed"):
        with pytest.raises(hydrant.NotFound):
            client.get(f"fs-transaction/{key}")
    # Committed: each closed file once, nothing before the commit, the failed one never.
    with filesystem.transaction:
        with filesystem.open("fs-transaction/kept", "wb") as file:
            file.write(b"z" * 10_000)
        filesystem.pipe_file("fs-transaction/piped", b"piped")
        filesystem.put_file(str(local), "fs-transaction/put")
        write_and_fail(filesystem, "fs-transaction/failed")
        with pytest.raises(hydrant.NotFound):
            client.get("fs-transaction/piped")
    assert client.get("fs-transaction/kept") == b"z" * 10_000
    assert client.get("fs-transaction/piped") == b"piped"
    assert client.get("fs-transaction/put") == b"from a local file"
    with pytest.raises(hydrant.NotFound):
        client.get("fs-transaction/failed")
