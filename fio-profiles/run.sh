#!/usr/bin/env bash
# Measure a device's physical limits with the profiles in this folder.
#
#   fio-profiles/run.sh PATH [--seconds N] [--size BYTES] [--write]
#
# PATH is a file or block device. Read profiles never modify it. --write also runs the write
# profiles, which DESTROY what PATH holds (a file is created with --size, default 2G).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
target=${1:?usage: run.sh PATH [--seconds N] [--size BYTES] [--write]}
shift
seconds=10
size=2G
write=no
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --write) write=yes; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
command -v fio >/dev/null || { echo "fio is not installed (apt-get install -y fio)" >&2; exit 1; }

profiles=(randread-4k-qd32 seqread-1m-qd8)
if [ "$write" = yes ]; then
  profiles=(seqwrite-1m-qd8 "${profiles[@]}" randwrite-4k-qd32)
elif [ ! -e "$target" ]; then
  echo "$target does not exist; read profiles need data (run with --write to create it)" >&2
  exit 1
fi

printf '| profile | IOPS | MB/s | mean latency us |\n|---|---|---|---|\n'
for profile in "${profiles[@]}"; do
  json=$(FILENAME="$target" RUNTIME="$seconds" SIZE="$size" fio --output-format=json "$here/$profile.fio")
  printf '%s' "$json" | python3 -c '
import json, sys
text = sys.stdin.read()
job = json.loads(text[text.index("{"):])["jobs"][0]
side = job["write"] if job["write"]["io_bytes"] > 0 else job["read"]
iops, mbps, latency = side["iops"], side["bw_bytes"] / 1e6, side["lat_ns"]["mean"] / 1000
print("| %s | %.0f | %.0f | %.0f |" % (sys.argv[1], iops, mbps, latency))
' "$profile"
done
