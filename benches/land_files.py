"""Land small files in a folder at a steady rate (benches/continuous.sh).

    land_files.py STAGE FEED FILES_PER_SECOND COUNT

Moves COUNT files of STAGE (the `part=N/` folders of a partitioned COPY, in
N order) into FEED, one every 1/FILES_PER_SECOND seconds. A file's
modification time is set to the moment it lands (just before the rename
that makes it appear whole), which is what the engine's event log measures
latency from. Prints `file,landed_ms` rows.
"""

import os
import sys
import time


def main() -> None:
    stage, feed, per_second, count = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    parts = sorted(
        (int(name.split("=", 1)[1]), os.path.join(stage, name))
        for name in os.listdir(stage)
        if name.startswith("part=")
    )[:count]
    print("file,landed_ms")
    start = time.monotonic()
    for i, (n, folder) in enumerate(parts):
        due = start + i / per_second
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        for name in sorted(os.listdir(folder)):
            source = os.path.join(folder, name)
            os.utime(source)
            target = os.path.join(feed, f"{n:06d}-{name}")
            os.rename(source, target)
            landed_ms = os.stat(target).st_mtime_ns // 1_000_000
            print(f"{n:06d}-{name},{landed_ms}", flush=True)
    late = time.monotonic() - start - (len(parts) - 1) / per_second
    if late > 1:
        print(f"the files landed {late:.1f} s behind schedule", file=sys.stderr)


if __name__ == "__main__":
    main()
