#!/usr/bin/env bash
# CI smoke test of the fio profiles: every profile for about 2 seconds against a 64 MiB scratch
# file the script creates, then `hydrant-bench fio-report` parses every JSON report. It checks that
# the job files, run.sh and the parser agree with the installed fio, not the figures (a shared CI
# machine's figures mean nothing). Fails loudly when fio is missing, since a skipped smoke test
# looks like a passing one.
#
#   fio-profiles/ci-smoke.sh            (HYDRANT_BENCH=path/to/hydrant-bench to skip the build)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v fio >/dev/null; then
  echo "FAILED: fio is not installed; the fio smoke test cannot run (apt-get install -y fio)" >&2
  exit 1
fi

seconds_per_profile=2
scratch_size=64M
profile_count=$(ls fio-profiles/*.fio | wc -l)

# The scratch file lives under the target directory, not /tmp: O_DIRECT needs a real file system
# and /tmp is often tmpfs.
target_dir=${CARGO_TARGET_DIR:-target}
work=$target_dir/fio-smoke
rm -rf "$work"
mkdir -p "$work"
trap 'rm -f "$work/scratch"' EXIT

if [ -z "${HYDRANT_BENCH:-}" ]; then
  cargo build --quiet -p hydrant-bench
  HYDRANT_BENCH=$target_dir/debug/hydrant-bench
fi
[ -x "$HYDRANT_BENCH" ] || { echo "FAILED: no hydrant-bench at $HYDRANT_BENCH" >&2; exit 1; }

# run.sh prints the table itself when it finds hydrant-bench; the report below is the check.
HYDRANT_BENCH=/nonexistent fio-profiles/run.sh "$work/scratch" --size "$scratch_size" \
  --seconds "$seconds_per_profile" --out "$work/out"

reports=$(ls "$work/out"/*.json | wc -l)
if [ "$reports" -ne "$profile_count" ]; then
  echo "FAILED: $profile_count profiles but $reports JSON reports in $work/out" >&2
  exit 1
fi
"$HYDRANT_BENCH" fio-report "$work/out"
echo "fio smoke test passed: $reports profiles" >&2
