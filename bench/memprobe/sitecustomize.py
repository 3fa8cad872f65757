"""A memory probe for soaks, loaded into the proxy's process from the outside.

    PYTHONPATH=bench/memprobe MEMPROBE_DIR=/tmp/probe nice -n 19 \\
        .venv/bin/python -m bench.load --soak ...

Python imports ``sitecustomize`` at start-up in every process; this one acts only in
``python -m proxy serve`` (bench.load's proxy inherits the environment). Every
``MEMPROBE_EVERY`` seconds (60) it writes a line to ``MEMPROBE_DIR/probe-<pid>.txt``: RSS
against what is live (Python's allocated blocks and bytes, gc-tracked objects) and what the
allocators hold (pymalloc's arenas, glibc's ``mallinfo2``), which tells a leak (live memory
grows) from memory the allocators keep free after a burst (it does not).

``MEMPROBE_TRACEMALLOC=<frames>`` also traces allocations (several times slower) and writes
``tracemalloc`` diffs against a snapshot taken after ``MEMPROBE_WARM`` seconds (300) to
``MEMPROBE_DIR/trace-<pid>.txt``: the allocation sites that grew (pymalloc's figures then
read -1: its statistics are not kept while allocations are traced).
"""

import os
import sys

_out = os.environ.get("MEMPROBE_DIR")
_argv = getattr(sys, "orig_argv", [])
if _out and "-m" in _argv and "proxy" in _argv and "serve" in _argv:
    import ctypes
    import gc
    import re
    import tempfile
    import threading
    import time
    import tracemalloc

    MB = 2**20
    EVERY = float(os.environ.get("MEMPROBE_EVERY", "60"))
    FRAMES = int(os.environ.get("MEMPROBE_TRACEMALLOC", "0"))

    class _Mallinfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
            )
        ]  # fmt: skip

    _libc = ctypes.CDLL("libc.so.6")
    _libc.mallinfo2.restype = _Mallinfo2

    def _rss() -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return -1

    def _pymalloc() -> tuple[int, int]:
        """(arenas now, bytes in allocated blocks), from sys._debugmallocstats (which writes
        to the C stderr: caught in a file meanwhile)."""
        with tempfile.TemporaryFile("w+") as caught:
            saved = os.dup(2)
            try:
                os.dup2(caught.fileno(), 2)
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            caught.seek(0)
            text = caught.read()

        def number(label: str) -> int:
            found = re.search(re.escape(label) + r"\s*=\s*([\d,]+)", text)
            return int(found.group(1).replace(",", "")) if found else -1

        return number("# arenas allocated current"), number("bytes in allocated blocks")

    def _probe() -> None:
        started = time.monotonic()
        with open(os.path.join(_out, f"probe-{os.getpid()}.txt"), "w") as out:
            out.write(
                "s rss_mb py_blocks gc_objects py_arenas py_used_mb"
                " malloc_used_mb malloc_free_mb malloc_mmap_mb\n"
            )
            while True:
                time.sleep(EVERY)
                info = _libc.mallinfo2()
                arenas, used = _pymalloc()
                out.write(
                    f"{time.monotonic() - started:.0f} {_rss() / MB:.1f}"
                    f" {sys.getallocatedblocks()} {len(gc.get_objects())} {arenas}"
                    f" {used / MB:.1f} {info.uordblks / MB:.1f} {info.fordblks / MB:.1f}"
                    f" {info.hblkhd / MB:.1f}\n"
                )
                out.flush()

    def _trace() -> None:
        time.sleep(float(os.environ.get("MEMPROBE_WARM", "300")))
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        base = tracemalloc.take_snapshot().filter_traces(ignore)
        started = time.monotonic()
        with open(os.path.join(_out, f"trace-{os.getpid()}.txt"), "w") as out:
            while True:
                time.sleep(EVERY)
                snapshot = tracemalloc.take_snapshot().filter_traces(ignore)
                traced, peak = tracemalloc.get_traced_memory()
                out.write(
                    f"=== {time.monotonic() - started:.0f} s after the baseline: RSS"
                    f" {_rss() / MB:.1f} MB, traced {traced / MB:.1f} MB (peak {peak / MB:.1f})\n"
                )
                for stat in snapshot.compare_to(base, "lineno")[:25]:
                    out.write(
                        f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+8d} blocks"
                        f"  {stat.traceback}\n"
                    )
                for stat in snapshot.compare_to(base, "traceback")[:8]:
                    out.write(f"{stat.size_diff / 1024:+10.1f} KiB, allocated at:\n")
                    out.writelines(f"      {line}\n" for line in stat.traceback.format())
                out.flush()
                del snapshot

    threading.Thread(target=_probe, name="memprobe", daemon=True).start()
    if FRAMES:
        tracemalloc.start(FRAMES)
        threading.Thread(target=_trace, name="memprobe-trace", daemon=True).start()
