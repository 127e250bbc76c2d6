"""The memory this process used, as the benchmarks and the commands report it.

Linux keeps a resettable high-water mark (VmHWM), so each configuration of a comparison can report its own
peak; elsewhere getrusage's lifetime peak stands in.
"""

from __future__ import annotations

import resource
import sys


def peak_rss_reset() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux), so each configuration reports its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident memory since the start or the last peak_rss_reset (getrusage: KiB on Linux, bytes on
    macOS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
