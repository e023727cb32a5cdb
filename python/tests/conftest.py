"""A real hydrant-server process for the tests: the binary of this checkout (HYDRANT_SERVER_BIN,
else target/debug/hydrant-server, built by `cargo build -p hydrant-server`), on a data file in
a temporary folder, listening on a free loopback port."""

import os
import pathlib
import subprocess

import pytest

import hydrant

ROOT = pathlib.Path(__file__).resolve().parents[2]


def server_binary() -> str:
    binary = os.environ.get("HYDRANT_SERVER_BIN") or str(ROOT / "target" / "debug" / "hydrant-server")
    if not os.path.exists(binary):
        raise RuntimeError(f"{binary} is missing: cargo build -p hydrant-server (or set HYDRANT_SERVER_BIN)")
    return binary


class Server:
    def __init__(self, directory: pathlib.Path, *extra: str, data_mib: int = 1024):
        origin = directory / "origin"
        origin.mkdir(exist_ok=True)
        self.origin = origin
        self.process = subprocess.Popen(
            [server_binary(), "--listen", "127.0.0.1:0", "--shards", "2", "--s3-listen", "off",
             "--data", f"{directory / 'data.hyd'}:{data_mib}MiB", "--origin", f"file://{origin}",
             *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        line = self.process.stdout.readline()
        words = line.split()
        if len(words) < 4:
            self.process.kill()
            raise RuntimeError(f"the server did not say where it listens: {line!r}")
        self.address = words[3]

    def client(self, **settings) -> hydrant.Client:
        return hydrant.Client(self.address, **settings)

    def metric(self, name: str) -> float:
        """A counter or gauge summed over the server's metrics."""
        text = next(iter(self.client(retries=0).stats().values()))
        total = 0.0
        for line in text.splitlines():
            if line.split("{")[0].split(" ")[0] == name:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = Server(tmp_path_factory.mktemp("hydrant"))
    yield running
    running.stop()


@pytest.fixture()
def client(server):
    return server.client(retries=0)
