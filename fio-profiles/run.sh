#!/usr/bin/env bash
# Measure a device's own limits with the fio profiles in this folder, saving fio's JSON report of
# each job, so that `hydrant-bench fio-report DIR` can print them as one table.
#
#   fio-profiles/run.sh PATH [--seconds N] [--size BYTES] [--out DIR] [--only A,B] [--force]
#
# PATH is a block device or a file.
# - A PATH that does not exist (or an empty file) is created with --size (default 2G) and filled
#   with sequential writes, so that reads touch written blocks; every profile runs on it.
# - A PATH that holds data (a device, a non-empty file) gets the read profiles only: the write
#   profiles DESTROY what it holds and run only with --force. A mounted device is never written.
# --seconds bounds each job (default 10); --out is where the JSON goes (default
# fio-results/DATE-TIME); --only runs just the named profiles.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
usage="usage: run.sh PATH [--seconds N] [--size BYTES] [--out DIR] [--only A,B] [--force]"
target=${1:?$usage}
shift
seconds=10
size=2G
out=fio-results/$(date +%Y%m%d-%H%M%S)
only=""
force=no
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --force) force=yes; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
case "$seconds" in
  ''|*[!0-9]*|0) echo "--seconds takes a whole number of seconds above 0, not '$seconds'" >&2; exit 2 ;;
esac
command -v fio >/dev/null || { echo "fio is not installed (apt-get install -y fio)" >&2; exit 1; }

# Read profiles never modify PATH; write profiles destroy what it holds.
read_profiles=(randread-4k-qd1 randread-4k-qd8 randread-4k-qd32 randread-4k-qd128
  seqread-128k-qd32 seqread-1m-qd8 randread-1m-depths)
write_profiles=(seqwrite-128k-qd32 seqwrite-1m-qd8 randwrite-4k-qd32 randrw-4k-70-30-qd32)

# A job that has not ended this long after its runtime is hung (a dead device, a stuck queue):
# fio's own start-up and file layout take a few seconds, never minutes.
job_grace_seconds=120

created=no
if [ ! -e "$target" ] || { [ -f "$target" ] && [ ! -s "$target" ]; }; then
  echo "creating $target ($size) and filling it with sequential writes" >&2
  fio --name=fill --filename="$target" --rw=write --bs=1m --iodepth=8 --ioengine=io_uring \
    --direct=1 --size="$size" --output-format=json --output=/dev/null
  created=yes
elif [ -b "$target" ]; then
  bytes=$(blockdev --getsize64 "$target")
elif [ -f "$target" ]; then
  :
else
  echo "$target is neither a block device nor a regular file" >&2
  exit 1
fi
if [ -f "$target" ]; then
  bytes=$(stat -c %s "$target")
fi

writable=no
if [ "$created" = yes ]; then
  writable=yes
elif [ "$force" = yes ]; then
  if [ -b "$target" ] && lsblk -nro MOUNTPOINT "$target" 2>/dev/null | grep -q .; then
    echo "REFUSED: $target (or a partition of it) is mounted; write profiles are skipped even with --force" >&2
  else
    writable=yes
  fi
fi

profiles=("${read_profiles[@]}")
if [ "$writable" = yes ]; then
  profiles+=("${write_profiles[@]}")
else
  echo "NOTE: $target holds data, so the write profiles (${write_profiles[*]}) are skipped;" \
    "pass --force to destroy its contents and run them" >&2
fi
if [ -n "$only" ]; then
  selected=()
  for profile in ${only//,/ }; do
    if [ ! -f "$here/$profile.fio" ]; then
      echo "no profile named $profile in $here" >&2
      exit 2
    fi
    if [[ " ${profiles[*]} " != *" $profile "* ]]; then
      echo "REFUSED: $profile writes to $target, which holds data (pass --force)" >&2
      exit 1
    fi
    selected+=("$profile")
  done
  profiles=("${selected[@]}")
fi

mkdir -p "$out"
for profile in "${profiles[@]}"; do
  echo "running $profile for ${seconds}s" >&2
  FILENAME="$target" RUNTIME="$seconds" SIZE="$bytes" \
    timeout "$((seconds + job_grace_seconds))" \
    fio --output-format=json --output="$out/$profile.json" "$here/$profile.fio"
done
echo "fio's reports are in $out" >&2

bench=${HYDRANT_BENCH:-hydrant-bench}
if command -v "$bench" >/dev/null; then
  "$bench" fio-report "$out"
else
  echo "for the table: hydrant-bench fio-report $out" >&2
fi
