"""Progress of the CMake build behind `pip install .`, on the terminal pip runs in.

pip captures everything a build backend writes (stdout and stderr alike) and shows it only with
-v or when the build fails; without -v a first build shows "Building wheel ... still running"
for the minutes CMake takes. The build's own output still goes to stdout (pip's log, -v, the
failure report), and the terminal itself — /dev/tty, which pip does not capture — gets a line
every few seconds saying how far Ninja's (or Make's) build is. No terminal (CI, a pipe, cron):
nothing extra. CLATTN_PROGRESS=0 turns the lines off.
"""
import os
import re
import subprocess
import sys
import time

# Ninja: "[37/104] Building CXX object ..."; Make: "[ 35%] Building CXX object ...".
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE = re.compile(r"^\[\s*(\d+)%\]")


def open_terminal():
    """The controlling terminal for writing, or None (none there, or CLATTN_PROGRESS=0)."""
    if os.environ.get("CLATTN_PROGRESS", "1") in ("0", "false", "no", "off"):
        return None
    try:
        return open("/dev/tty", "w", encoding="utf-8")
    except OSError:
        return None


def _elapsed(s):
    s = int(s)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def run(cmd, env, what, terminal, every=5.0, clock=time.monotonic, out=None):
    """Run cmd (raising CalledProcessError on failure as check_call), its output passed line by
    line to `out` (stdout); when terminal is not None, a progress line there at most every
    `every` seconds while the build reports steps, and one when it ends."""
    out = out or sys.stdout
    start = last = clock()
    step = None  # "37/104" or "35%"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    for line in proc.stdout:
        out.write(line)
        m = _NINJA.match(line) or _MAKE.match(line)
        if m:
            step = f"{m.group(1)}/{m.group(2)} steps" if m.re is _NINJA else f"{m.group(1)} %"
        now = clock()
        if terminal is not None and step and now - last >= every:
            terminal.write(f"clattn: {what}: {step}, {_elapsed(now - start)}\n")
            terminal.flush()
            last = now
    rc = proc.wait()
    out.flush()
    if terminal is not None:
        terminal.write(f"clattn: {what}: {'done' if rc == 0 else f'failed (exit {rc})'} "
                       f"after {_elapsed(clock() - start)}{f' ({step})' if step else ''}\n")
        terminal.flush()
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)
