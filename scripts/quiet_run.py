#!/usr/bin/env python3
"""Runs one command while every niced process of this user is paused: a quiet run for CPU timings on a
small shared machine (2 cores), where a background build (run with `nice`) would otherwise take cores
from the benchmark. The paused processes get SIGSTOP before the command and SIGCONT after it, also when
the command fails or this script is interrupted; the command's exit status is returned.

  scripts/quiet_run.py build/release/bench_step --model models/slimkv-llama-15m --batches 16

SIGTERM and SIGHUP (`timeout`, a closed terminal) resume them too; only SIGKILL cannot. Only processes
with a nice value above 0 are paused (start builds and tests that may be paused with `nice`); this
script, its parents and the command's own processes run at nice 0 and are never touched.
"""
import os
import signal
import subprocess
import sys


def niced_processes():
    """The pids of this user's processes whose nice value is above 0 (Linux /proc)."""
    me = os.getuid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue  # gone meanwhile, or not ours to read
        nice = int(fields[16])  # field 19 of stat; fields[0] is the state (field 3)
        if nice > 0 and pid != os.getpid():
            pids.append(pid)
    return pids


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_on_signal(signum, _frame):
    # `timeout` or a closing terminal ends this script with SIGTERM or SIGHUP: leave through `finally`,
    # which resumes what was paused (killed outright, the paused processes stayed stopped).
    raise SystemExit(128 + signum)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: quiet_run.py COMMAND [ARGS...]")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop_on_signal)
    paused = niced_processes()
    signal_all(paused, signal.SIGSTOP)
    try:
        return subprocess.call(sys.argv[1:])
    except KeyboardInterrupt:
        return 130
    finally:
        signal_all(paused, signal.SIGCONT)


if __name__ == "__main__":
    sys.exit(main())
