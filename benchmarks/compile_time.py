#!/usr/bin/env python3
"""Compile time and peak memory of one translation unit, without the precompiled header:
what a user's training main costs to build. Prints one JSON line per figure, like the
other benchmarks.

  benchmarks/compile_time.py                                   examples/train_sac_pendulum.cpp
  benchmarks/compile_time.py --source examples/compile_time_sweep.cpp --repeat 3
  benchmarks/compile_time.py --build other/build --root other  a second tree, for a before/after

  benchmarks/compile_time.py --variant single_include            the same main built against the single header
  benchmarks/compile_time.py --forbid '/(ATen|torch)/'           fail if a header matching it is included

The compile command is the build's own (build/compile_commands.json: configure with
-DCMAKE_EXPORT_COMPILE_COMMANDS=ON), with the precompiled header left out. The median of
--repeat compilations is reported.
"""
import argparse
import datetime
import json
import os
import re
import pathlib
import resource
import shlex
import socket
import statistics
import subprocess
import sys
import time


def command_for(build, source, variant=None):
    """The build's command for `source`, precompiled header left out. A source built by
    several targets (train_sac_pendulum.cpp: on prebuilt Trainers, and against the single
    header) gives the one whose command contains `variant`; by default the one that does not
    build against single_include/."""
    db = json.loads((build / "compile_commands.json").read_text())
    entries = [e for e in db if pathlib.Path(e["file"]).resolve() == source.resolve()]
    if not entries:
        sys.exit(f"compile_time.py: {source} is not in {build}/compile_commands.json "
                 "(configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)")
    def text(e):
        return e["command"] if "command" in e else " ".join(e["arguments"])
    if variant is not None:
        chosen = [e for e in entries if variant in text(e)]
        if not chosen:
            sys.exit(f"compile_time.py: no command for {source} contains {variant!r}")
    else:
        chosen = [e for e in entries if "single_include" not in text(e)] or entries
    entry = chosen[0]
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-include":
            skip = True  # the precompiled header
            continue
        if a in ("-Winvalid-pch",) or a.startswith("-include"):
            continue
        if a == "-o":
            skip = True
            continue
        out.append(a)
    return out + ["-o", os.devnull], entry["directory"]


def check_headers(cmd, cwd, source, forbid):
    """0 when no header the source includes matches `forbid`; else 1, naming the include chain."""
    r = subprocess.run(cmd + ["-H", "-E"], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"compile_time.py: preprocessing {source} failed:\n{r.stderr[-4000:]}", file=sys.stderr)
        return 1
    chain, count = [source], 0
    for line in r.stderr.splitlines():
        m = re.match(r"^(\.+) (\S+)$", line)
        if not m:
            continue
        count += 1
        depth, header = len(m.group(1)), m.group(2)
        del chain[depth:]
        chain.append(header)
        if forbid.search(header):
            print(f"compile_time.py: {source} includes {header}, which matches {forbid.pattern!r}, through:\n  " +
                  "\n  ".join(chain), file=sys.stderr)
            return 1
    print(f"compile_time.py: none of the {count} headers {source} includes matches {forbid.pattern!r}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--build", default=None, help="build directory (default: ROOT/build)")
    ap.add_argument("--source", default="examples/train_sac_pendulum.cpp")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--variant", default=None, metavar="TEXT",
                    help="of several commands for the source, the one containing TEXT (e.g. single_include)")
    ap.add_argument("--forbid", default=None, metavar="REGEX",
                    help="exit 1 naming the first included header whose path matches REGEX and what included it")
    a = ap.parse_args()
    root = pathlib.Path(a.root)
    build = pathlib.Path(a.build) if a.build else root / "build"
    cmd, cwd = command_for(build, root / a.source, a.variant)
    if a.forbid:
        sys.exit(check_headers(cmd, cwd, a.source, re.compile(a.forbid)))
    seconds, peaks = [], []
    for _ in range(a.repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        seconds.append(time.perf_counter() - t0)
        if r.returncode != 0:
            sys.exit(f"compile_time.py: compiling {a.source} failed:\n{r.stderr[-4000:]}")
        peaks.append(max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) / 1024.0)
    common = {"config": {"source": a.source, "variant": a.variant, "pch": False, "repeat": a.repeat,
                         "build_type": "Release" if "-O3" in cmd or "-O2" in cmd else "other"},
              "device": "cpu", "host": socket.gethostname(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    print(json.dumps({"name": "compile_seconds", "value": round(statistics.median(seconds), 2), "unit": "s", **common}))
    print(json.dumps({"name": "compile_peak_rss", "value": round(max(peaks)), "unit": "MiB", **common}))


if __name__ == "__main__":
    main()
