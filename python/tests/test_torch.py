"""hydrant.torch against a real hydrant-server: datasets across ranks and workers, resuming with
torchdata's StatefulDataLoader, checkpoints with save/load, map-style ranges, tar samples."""

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from conftest import Server

torch = pytest.importorskip("torch")

import hydrant  # noqa: E402
import hydrant.torch  # noqa: E402

OBJECTS = 40


@pytest.fixture(scope="module")
def shards(server):
    client = server.client(retries=0)
    paths = [f"torch-shards/shard-{index:03}" for index in range(OBJECTS)]
    for index, path in enumerate(paths):
        client.put(path, bytes([index]) * (1000 + index))
    return paths


def interleave(*lists):
    """What a DataLoader with one worker per list yields: one item of each in turn."""
    out = []
    for position in range(max(map(len, lists))):
        out.extend(items[position] for items in lists if position < len(items))
    return out


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_ranks_with_two_workers_read_every_object_once_per_epoch(server, shards, tmp_path):
    port = free_port()
    script = Path(__file__).with_name("torch_rank.py")
    outputs = [tmp_path / f"rank-{rank}.json" for rank in range(2)]
    ranks = [
        subprocess.Popen([sys.executable, str(script), str(rank), "2", str(port), server.address,
                          "torch-shards/", str(outputs[rank])])
        for rank in range(2)
    ]
    for process in ranks:
        assert process.wait(timeout=300) == 0
    read = [json.loads(output.read_text()) for output in outputs]
    expected = hydrant.torch.ShardDataset(shards, client=server.client(), seed=7)
    for epoch in range(2):
        everything = read[0][epoch] + read[1][epoch]
        assert sorted(everything) == shards, f"epoch {epoch}: every object exactly once"
        order = expected.order(epoch)
        for rank in range(2):
            share = order[rank::2]
            assert read[rank][epoch] == interleave(share[0::2], share[1::2]), (
                f"rank {rank}, epoch {epoch}: the order the seed gives"
            )
    assert read[0][0] != read[0][1], "another order each epoch"
    assert expected.order(0) == hydrant.torch.ShardDataset(shards, client=server.client(), seed=7).order(0)
    assert expected.order(0) != hydrant.torch.ShardDataset(shards, client=server.client(), seed=8).order(0)


def test_a_stateful_dataloader_stopped_mid_epoch_resumes_with_exactly_the_rest(server, shards):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader():
        dataset = hydrant.torch.ShardDataset(
            "torch-shards/", client=server.client(), seed=3, transform=lambda path, data: path
        )
        dataset.set_epoch(5)
        return stateful.StatefulDataLoader(dataset, batch_size=None, num_workers=2)

    first = loader()
    taken = []
    for path in first:
        taken.append(path)
        if len(taken) == 13:
            break
    state = first.state_dict()
    del first
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(taken) + len(rest) == OBJECTS
    assert sorted(taken + rest) == shards, "nothing read twice, nothing missed"


def test_save_and_load_a_model_state_dict(server):
    client = server.client()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1200}
    hydrant.torch.save(state, "torch-ckpt/step-1200.pt", client=client)
    loaded = hydrant.torch.load("torch-ckpt/step-1200.pt", client=client)
    assert loaded["step"] == 1200
    for name, tensor in state["model"].items():
        assert torch.equal(loaded["model"][name], tensor), name
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    with pytest.raises(hydrant.NotFound):
        hydrant.torch.load("torch-ckpt/none.pt", client=client)


def test_save_sends_tensors_from_where_they_lie_and_a_failed_save_stores_nothing(server):
    import tracemalloc

    client = server.client()
    generator = torch.Generator().manual_seed(5)
    layer = torch.nn.Linear(2048, 4096)  # 32 MiB of weights, found through the module
    state = {
        "model": layer,
        "moments": [torch.rand(4 << 20, generator=generator), (torch.zeros(3), "tag")],
        "sparse": torch.eye(3).to_sparse(),  # no storage of its own: copied, as torch.save does
        "empty": torch.empty(0),
        "step": 1300,
    }
    tracemalloc.start()
    try:
        hydrant.torch.save(state, "torch-ckpt/step-1300.pt", client=client)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 48 MiB of tensors went to the server without a copy in Python's memory.
    assert peak < 8 << 20, f"{peak} bytes held by Python during the save"
    loaded = hydrant.torch.load("torch-ckpt/step-1300.pt", client=client, weights_only=False)
    assert torch.equal(loaded["model"].weight, layer.weight)
    assert torch.equal(loaded["moments"][0], state["moments"][0])
    assert loaded["moments"][1][1] == "tag" and loaded["step"] == 1300
    assert torch.equal(loaded["sparse"].to_dense(), torch.eye(3))
    assert loaded["empty"].numel() == 0
    # An empty tensor (whose memory has no address) among the parts of a PUT.
    assert client.put("torch-ckpt/parts", [b"head", torch.empty(0), b"tail"]).size == 8
    assert client.get("torch-ckpt/parts") == b"headtail"

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot be saved")

    with pytest.raises(RuntimeError):
        hydrant.torch.save({"weights": torch.ones(1 << 20), "bad": Unpicklable()},
                           "torch-ckpt/step-1400.pt", client=client)
    assert not client.exists("torch-ckpt/step-1400.pt")


def test_a_map_dataset_reads_objects_and_ranges_by_index(server, shards):
    dataset = hydrant.torch.MapDataset(
        [shards[0], (shards[5], (10, 20)), shards[7]], client=server.client()
    )
    assert len(dataset) == 3
    assert dataset[0] == bytes([0]) * 1000
    assert dataset[1] == bytes([5]) * 10
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    assert [len(item) for item in loader] == [1000, 10, 1007]
    assert len(hydrant.torch.MapDataset("torch-shards/", client=server.client())) == OBJECTS


def test_tar_shards_give_webdataset_samples(server):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for key in ["train/0001", "train/0002"]:
            for extension, content in [("jpg", f"image {key}".encode()), ("cls", b"7")]:
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    client = server.client()
    client.put("torch-tar/shard-000.tar", buffer.getvalue())
    dataset = hydrant.torch.ShardDataset(
        ["torch-tar/shard-000.tar"], client=client, shuffle=False,
        transform=lambda path, data: list(hydrant.torch.tar_samples(data)),
    )
    (samples,) = list(dataset)
    assert samples == [
        {"__key__": "train/0001", "jpg": b"image train/0001", "cls": b"7"},
        {"__key__": "train/0002", "jpg": b"image train/0002", "cls": b"7"},
    ]


def run_ranks(mode, world, server, checkpoint, out):
    port = free_port()
    script = Path(__file__).with_name("torch_dcp_rank.py")
    ranks = [
        subprocess.Popen([sys.executable, str(script), mode, str(rank), str(world), str(port),
                          server.address, checkpoint, str(out)])
        for rank in range(world)
    ]
    return [process.wait(timeout=300) for process in ranks]


def test_dcp_saves_and_loads_across_two_ranks_and_a_killed_save_stays_invisible(server, tmp_path):
    from hydrant.torch.dcp import wait_uploaded

    reference = tmp_path / "reference.pt"
    assert run_ranks("save", 2, server, "hydrant://torch-dcp/step-1200", reference) == [0, 0]
    assert run_ranks("load", 2, server, "hydrant://torch-dcp/step-1200", reference) == [0, 0]
    for rank in range(2):
        assert (tmp_path / f"reference.pt.result-{rank}").read_text() == "equal", f"rank {rank}"

    # A writer SIGKILLed while storing its objects: the new checkpoint has no .metadata and
    # cannot be loaded; the one before it loads as before.
    partial = tmp_path / "partial.pt"
    assert run_ranks("crash", 1, server, "hydrant://torch-dcp/step-1300", partial) == [-9]
    client = server.client()
    assert not client.exists("torch-dcp/step-1300/.metadata")
    outcome = tmp_path / "outcome"
    assert run_ranks("load-absent", 1, server, "hydrant://torch-dcp/step-1300", outcome) == [0]
    assert outcome.read_text() == "refused"
    assert run_ranks("load", 2, server, "hydrant://torch-dcp/step-1200", reference) == [0, 0]

    # At the origin (the server's folder origin, write-back), byte for byte.
    wait_uploaded("hydrant://torch-dcp/step-1200", client=client, timeout=120)
    stored = [entry.path for entry in client.list("torch-dcp/step-1200/")]
    assert "torch-dcp/step-1200/.metadata" in stored and len(stored) >= 3
    for path in stored:
        assert (server.origin / path).read_bytes() == client.get(path), path


def test_a_dcp_save_sends_tensors_from_where_they_lie_and_loads_them_back(server):
    import tracemalloc

    import torch.distributed.checkpoint as dcp
    from hydrant.torch.dcp import StorageReader, StorageWriter

    generator = torch.Generator().manual_seed(11)
    state = {
        "weight": torch.rand(8 << 20, generator=generator),  # 32 MiB
        "bias": torch.rand(3 << 20, generator=generator, dtype=torch.float64),  # 24 MiB
        "view": torch.arange(1 << 20, dtype=torch.int32)[1:1000],  # a view: DCP copies it
        "step": 1200,
    }
    checkpoint = "hydrant://torch-dcp-lent/step-1"
    tracemalloc.start()
    try:
        dcp.save(state, storage_writer=StorageWriter(checkpoint, servers=server.address),
                 no_dist=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 56 MiB of tensors went to the server without a copy in Python's memory.
    assert peak < 8 << 20, f"{peak} bytes held by Python during the save"

    loaded = {
        "weight": torch.zeros(8 << 20),
        "bias": torch.zeros(3 << 20, dtype=torch.float64),
        "view": torch.zeros(999, dtype=torch.int32),
        "step": 0,
    }
    dcp.load(loaded, storage_reader=StorageReader(checkpoint, servers=server.address),
             no_dist=True)
    for name in ("weight", "bias", "view"):
        assert torch.equal(loaded[name], state[name]), name
    assert loaded["step"] == 1200


def test_a_dcp_checkpoint_reaches_an_s3_origin_whole_and_loads_from_it_alone(tmp_path):
    """Write-back to an S3 origin (moto's server, as scripts/test starts it): after
    wait_uploaded every object of the checkpoint is at the origin byte for byte, and a node
    that never saw the save loads it by reading through."""
    import torch.distributed.checkpoint as dcp
    from hydrant.torch.dcp import StorageReader, StorageWriter, wait_uploaded

    endpoint = os.environ.get("HYDRANT_TEST_S3_ENDPOINT")
    if not endpoint:
        pytest.skip("needs an S3 endpoint in HYDRANT_TEST_S3_ENDPOINT (scripts/test starts moto's server)")
    boto3 = pytest.importorskip("boto3")
    origin = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    bucket = f"pytest-dcp-{uuid.uuid4().hex[:12]}"
    origin.create_bucket(Bucket=bucket)
    settings = tmp_path / "origin.env"
    settings.write_text("aws_access_key_id=test\naws_secret_access_key=test\naws_region=us-east-1\n")
    spec = f"ckpt=s3://{bucket},write=back,endpoint={endpoint},settings={settings}"
    generator = torch.Generator().manual_seed(23)
    state = {
        "weight": torch.rand(6 << 20, generator=generator),  # 24 MiB: uploaded in parts
        "bias": torch.rand(1000, generator=generator),
        "step": 7,
    }
    checkpoint = "hydrant://ckpt/run-3/step-7"
    (tmp_path / "writer").mkdir()
    writer = Server(tmp_path / "writer", "--bucket", spec)
    try:
        dcp.save(state, storage_writer=StorageWriter(checkpoint, servers=writer.address),
                 no_dist=True)
        client = writer.client()
        wait_uploaded(checkpoint, client=client, timeout=120)
        stored = [entry.path for entry in client.list("ckpt/run-3/step-7/")]
        assert "ckpt/run-3/step-7/.metadata" in stored and len(stored) >= 2, stored
        for path in stored:
            at_origin = origin.get_object(Bucket=bucket, Key=path[len("ckpt/"):])["Body"].read()
            assert at_origin == client.get(path), path
    finally:
        writer.stop()

    (tmp_path / "reader").mkdir()
    reader = Server(tmp_path / "reader", "--bucket", spec)
    try:
        loaded = {"weight": torch.zeros(6 << 20), "bias": torch.zeros(1000), "step": 0}
        dcp.load(loaded, storage_reader=StorageReader(checkpoint, servers=reader.address),
                 no_dist=True)
    finally:
        reader.stop()
    assert torch.equal(loaded["weight"], state["weight"])
    assert torch.equal(loaded["bias"], state["bias"])
    assert loaded["step"] == 7


def test_a_state_of_another_listing_is_refused(server, shards):
    dataset = hydrant.torch.ShardDataset("torch-shards/", client=server.client(), seed=3)
    state = dataset.state_dict()
    fewer = hydrant.torch.ShardDataset(shards[:10], client=server.client(), seed=3)
    with pytest.raises(hydrant.UsageError):
        fewer.load_state_dict(state)
    # The position is this epoch's as soon as iteration starts.
    dataset.set_epoch(1)
    dataset._consumed = 17
    iter(dataset)
    assert dataset.state_dict()["consumed"] == 0


def wait_for(condition, what, timeout=30.0):
    import time
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


def test_each_worker_plans_its_epoch_so_the_server_reads_ahead_of_it(server):
    # Objects only at the origin (the server's folder origin): cold for the server.
    folder = server.origin / "torch-plan" / "epoch"
    folder.mkdir(parents=True)
    paths = []
    for index in range(24):
        (folder / f"{index:02}").write_bytes(bytes([index]) * (30_000 + index))
        paths.append(f"torch-plan/epoch/{index:02}")
    client = server.client(retries=0)
    planned = server.metric("hydrant_plan_keys_total")
    prefetched = server.metric("hydrant_plan_prefetched_total")
    hits = server.metric("hydrant_plan_hits_total")
    # Plans of earlier tests' loaders may still be open (until their idle time passes).
    plans = server.metric("hydrant_plans")

    # Without plans, nothing is planned. The 4 objects read are stored in the background after
    # their reads return: wait for that, or the plan below may find one still cold.
    objects = server.metric("hydrant_objects")
    quiet = hydrant.torch.ShardDataset(paths[:4], client=client, seed=1, plan=False)
    assert len(list(quiet)) == 4
    assert server.metric("hydrant_plan_keys_total") == planned
    wait_for(lambda: server.metric("hydrant_objects") >= objects + 4,
             "the 4 objects read without a plan to be stored")
    prefetched = server.metric("hydrant_plan_prefetched_total")

    dataset = hydrant.torch.ShardDataset(paths, client=client, seed=3)
    items = iter(dataset)
    # Told the order when iteration starts, the server reads the 20 cold objects ahead (all:
    # they fit in the window) before the first is asked for.
    assert server.metric("hydrant_plan_keys_total") == planned + 24
    wait_for(lambda: server.metric("hydrant_plan_prefetched_total") == prefetched + 20,
             "the server to read the plan's cold objects ahead")
    read = list(items)
    assert read == [bytes([int(path[-2:])]) * (30_000 + int(path[-2:])) for path in dataset.order()]
    assert server.metric("hydrant_plan_hits_total") == hits + 20
    wait_for(lambda: server.metric("hydrant_plans") <= plans, "the finished plans to end")

    # The next epoch's plan replaces this one (the same id); plans of two workers differ.
    dataset.set_epoch(1)
    first = dataset.plan_id()
    assert first == dataset.plan_id()
    other = hydrant.torch.ShardDataset(paths, client=client, seed=3)
    assert other.plan_id() != first


def test_a_writer_and_reader_reused_for_other_checkpoints_keep_their_settings(server):
    import torch.distributed.checkpoint as dcp
    from hydrant.torch.dcp import StorageReader, StorageWriter

    # DCP resets a reused writer or reader to each checkpoint_id it is given; the server named
    # when it was made (not the default address) must still be the one written and read.
    writer = StorageWriter("hydrant://torch-dcp-reused/step-1", servers=server.address)
    reader = StorageReader("hydrant://torch-dcp-reused/step-1", servers=server.address)
    for step in (1, 2):
        state = {"weight": torch.full((1000,), float(step)), "step": step}
        dcp.save(state, storage_writer=writer, checkpoint_id=f"torch-dcp-reused/step-{step}",
                 no_dist=True)
    client = server.client(retries=0)
    for step in (1, 2):
        assert client.exists(f"torch-dcp-reused/step-{step}/.metadata")
        loaded = {"weight": torch.zeros(1000), "step": 0}
        dcp.load(loaded, storage_reader=reader, checkpoint_id=f"torch-dcp-reused/step-{step}",
                 no_dist=True)
        assert torch.equal(loaded["weight"], torch.full((1000,), float(step)))
        assert loaded["step"] == step
