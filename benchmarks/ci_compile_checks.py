#!/usr/bin/env python3
"""What two of CI's compile checks cost, before and after they were joined (JSON lines).

1. The compile-fail programs (tests/compile_fail): each bad_*.cpp and good_control.cpp
   compiled alone (before) against the bad programs joined into one translation unit and
   good_control.cpp (after), interleaved before/after/after/before.
2. The self-sufficiency units (tests/CMakeLists.txt): each header that a program of the
   build now includes first, compiled as its old unit of its own was (the header included
   twice; a heavy one with the torch precompiled header, a light one without): the build
   time those units no longer take (on a build with every optional component, as here: a
   header of a missing one has no unit either way).

Every compile is the build's own command (compile_commands.json) with -fsyntax-only for the
compile-fail programs (as their tests run them), `--jobs` at a time.

Usage: python3 benchmarks/ci_compile_checks.py --build build [--jobs 2] [--rounds 2]
                                              [--only compile_fail|self_sufficiency]
"""
import argparse
import glob
import json
import os
import pathlib
import platform
import re
import shlex
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parent.parent


def command_of(entries, needle):
    """The compile command of the first entry whose command names `needle`, up to its -o."""
    for e in entries:
        if needle in e["command"]:
            return e["command"].split(" -o ")[0]
    raise SystemExit(f"no compile command names {needle} in compile_commands.json: configure the build first")


def timed(build, jobs, commands):
    def one(c):
        t = time.perf_counter()
        subprocess.run(c, shell=True, cwd=build, capture_output=True)
        return time.perf_counter() - t
    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as ex:
        spent = sum(ex.map(one, commands))
    return time.perf_counter() - t, spent


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    cxx = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return {"host": "vm", "cpu": cpu, "cores": os.cpu_count(), "compiler": cxx, "device": "cpu",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=["compile_fail", "self_sufficiency"])
    a = ap.parse_args()
    build = pathlib.Path(a.build).resolve()
    entries = json.loads((build / "compile_commands.json").read_text())
    only = f" --only {a.only}" if a.only else ""
    base = dict(machine(), command=f"python3 benchmarks/ci_compile_checks.py --build {a.build} --jobs {a.jobs} "
                                   f"--rounds {a.rounds}{only}")
    if a.only != "self_sufficiency":
        compile_fail(a, build, entries, base)
    if a.only != "compile_fail":
        self_sufficiency(a, build, entries, base)


def compile_fail(a, build, entries, base):
    """1. compile-fail: alone vs joined."""
    cf = ROOT / "tests" / "compile_fail"
    joined = build / "tests" / "compile_fail" / "all_bad_programs.cpp"
    cmd = command_of(entries, "all_bad_programs.cpp") + f" -I{shlex.quote(str(cf))} -fsyntax-only "
    alone = [cmd + shlex.quote(p) for p in sorted(glob.glob(str(cf / "bad_*.cpp"))) + [str(cf / "good_control.cpp")]]
    together = [cmd + shlex.quote(str(joined)), cmd + shlex.quote(str(cf / "good_control.cpp"))]
    order = (["before", "after", "after", "before"] * a.rounds)[: 2 * a.rounds]
    for side in order:
        wall, spent = timed(build, a.jobs, alone if side == "before" else together)
        print(json.dumps(dict(base, bench="ci_compile_fail_one_unit", name="ci_compile_fail_compile_s", side=side,
                              value=round(spent, 1), unit="s", wall_s=round(wall, 1),
                              config={"compiles": len(alone if side == "before" else together), "jobs": a.jobs},
                              order="/".join(order))), flush=True)



def self_sufficiency(a, build, entries, base):
    """2. the self-sufficiency units no longer built."""
    heavy = command_of(entries, "anvil_self_sufficient_heavy.dir")
    light = command_of(entries, "anvil_self_sufficient_light.dir")
    generated = {pathlib.Path(e["file"]).name for e in entries if "anvil_self_sufficient_" in e["command"]}
    with tempfile.TemporaryDirectory() as d:
        commands, n_light = [], 0
        for p in sorted((ROOT / "include").rglob("*.hpp")):
            h = p.relative_to(ROOT / "include").as_posix()
            name = re.sub(r"\W", "_", h) + ".cpp"
            if name in generated:
                continue
            tu = pathlib.Path(d) / name
            tu.write_text(f"#include <{h}>\n#include <{h}>\n")
            is_light = "Light header" in p.read_text()
            n_light += is_light
            commands.append(f"{light if is_light else heavy} -o {tu}.o -c {tu}")
        wall, spent = timed(build, a.jobs, commands)
    print(json.dumps(dict(base, bench="ci_self_sufficiency_units_gone", name="ci_self_sufficiency_units_gone_compile_s",
                          side="removed", value=round(spent, 1), unit="s", wall_s=round(wall, 1),
                          config={"units": len(commands), "light": n_light, "heavy": len(commands) - n_light,
                                  "jobs": a.jobs})), flush=True)


if __name__ == "__main__":
    main()
