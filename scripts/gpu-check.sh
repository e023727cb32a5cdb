#!/usr/bin/env bash
# Host-to-device copy throughput from a same-host region's kind of memory (a sealed memfd mapped
# MAP_SHARED, as hydrant-server hands out), registered with cudaHostRegister vs not registered,
# with cudaMallocHost memory as the ceiling. Needs an NVIDIA GPU, its driver and a CUDA runtime
# (libcudart.so.12 from the CUDA toolkit, or `pip install nvidia-cuda-runtime-cu12`; or set
# HYDRANT_CUDART to the library's path). Not run in CI: there is no GPU there.
#
#   scripts/gpu-check.sh [GiB per copy, default 1] [copies per kind, default 10]
set -euo pipefail
exec python3 - "${1:-1}" "${2:-10}" <<'PYTHON'
import ctypes, mmap, os, sys, time

gib, copies = float(sys.argv[1]), int(sys.argv[2])
size = int(gib * (1 << 30))

def load():
    names = [os.environ.get("HYDRANT_CUDART"), "libcudart.so.12", "libcudart.so"]
    try:
        import nvidia.cuda_runtime as wheel
        names.append(os.path.join(list(wheel.__path__)[0], "lib", "libcudart.so.12"))
    except ImportError:
        pass
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    sys.exit("no CUDA runtime found (set HYDRANT_CUDART)")

cuda = load()
def check(code, what):
    if code != 0:
        cuda.cudaGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"{what}: error {code} ({cuda.cudaGetErrorString(code).decode()})")

device = ctypes.c_void_p()
check(cuda.cudaMalloc(ctypes.byref(device), ctypes.c_size_t(size)), "cudaMalloc")
H2D = 1

def bandwidth(host_address):
    check(cuda.cudaMemcpy(device, ctypes.c_void_p(host_address), ctypes.c_size_t(size), H2D), "warm-up")
    check(cuda.cudaDeviceSynchronize(), "sync")
    started = time.perf_counter()
    for _ in range(copies):
        check(cuda.cudaMemcpy(device, ctypes.c_void_p(host_address), ctypes.c_size_t(size), H2D), "cudaMemcpy")
    check(cuda.cudaDeviceSynchronize(), "sync")
    return size * copies / (time.perf_counter() - started) / 1e9

# A region like hydrant's: memfd, sealed against shrinking and growing, mapped shared.
fd = os.memfd_create("hydrant-region", os.MFD_ALLOW_SEALING)
os.ftruncate(fd, size)
region = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
region.write(b"\x5a" * size)  # fault every page in, as reads into the region would
address = ctypes.addressof(ctypes.c_char.from_buffer(region))

rows = [("memfd region, not registered", bandwidth(address))]
check(cuda.cudaHostRegister(ctypes.c_void_p(address), ctypes.c_size_t(size), 1), "cudaHostRegister")
rows.append(("memfd region, cudaHostRegister", bandwidth(address)))
check(cuda.cudaHostUnregister(ctypes.c_void_p(address)), "cudaHostUnregister")
pinned = ctypes.c_void_p()
check(cuda.cudaMallocHost(ctypes.byref(pinned), ctypes.c_size_t(size)), "cudaMallocHost")
ctypes.memset(pinned, 0x5a, size)
rows.append(("cudaMallocHost (ceiling)", bandwidth(pinned.value)))

print(f"| host memory | H2D GB/s |  ({gib} GiB per copy, {copies} copies)")
print("|---|---|")
for name, rate in rows:
    print(f"| {name} | {rate:.1f} |")
PYTHON
