"""How much heap a JVM (a metastore) uses while it is watched: ``jstat -gc`` samples.

Used heap is the survivor, eden and old spaces' used columns summed (``S0U + S1U + EU +
OU``). Sampled every ``every`` seconds, so a peak between two samples can be missed; what a
fetch of many partitions builds (hundreds of MB held for seconds) is not.
"""

from __future__ import annotations

import subprocess
import threading

USED_COLUMNS = ("S0U", "S1U", "EU", "OU")


class HeapWatch:
    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.pid = pid
        self.every = every
        self.peak = 0  # bytes
        self.samples = 0
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> HeapWatch:
        self._process = subprocess.Popen(
            ["jstat", "-gc", str(self.pid), f"{int(self.every * 1000)}ms"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None and self._thread is not None
        self._process.terminate()
        self._process.wait(10)
        self._thread.join(10)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        columns: list[str] = []
        for line in self._process.stdout:
            fields = line.split()
            if not fields:
                continue
            if fields[0] == "S0C":
                columns = fields
                continue
            if not columns:
                continue
            try:
                used = sum(float(fields[columns.index(name)]) for name in USED_COLUMNS)
            except (ValueError, IndexError):
                continue
            self.samples += 1
            self.peak = max(self.peak, int(used * 1024))
