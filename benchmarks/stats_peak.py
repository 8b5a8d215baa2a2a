"""`store.stats()` of one store in this process: its time and the process's peak RSS, for old code
against new alternately (issue 53: stats streamed), e.g. on the table `softrl bench store` keeps:

    PYTHONPATH=/tmp/old-src/src .venv/bin/python benchmarks/stats_peak.py runs/store-bench/local old
    .venv/bin/python benchmarks/stats_peak.py runs/store-bench/local new

(/tmp/old-src: `git archive COMMIT src | tar -x -C /tmp/old-src`). Nothing is asserted."""

import resource
import sys
import time

from softrl.data import ExperienceStore

store = ExperienceStore(sys.argv[1], create=False)
started = time.perf_counter()
stats = store.stats()
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{sys.argv[2] if len(sys.argv) > 2 else ''} stats {seconds:.2f} s, rows {stats['trajectories']}, "
      f"peak RSS {peak:.0f} MiB", flush=True)
