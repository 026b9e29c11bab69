#!/usr/bin/env python3
"""What two of CI's compile checks cost, before and after they were joined (JSON lines).

1. The compile-fail programs (tests/compile_fail): each bad_*.cpp and good_control.cpp
   compiled alone (before) against the bad programs joined into one translation unit and
   good_control.cpp (after), interleaved before/after/after/before.
2. The self-sufficiency units (tests/CMakeLists.txt): each header that a program of the
   build (one without the torch precompiled header) includes first, compiled as a unit of
   its own would be: the build time those units do not take (on a build with every optional
   component, as here: a header of a missing one has no unit either way). Until 2026-12-06
   the units were compiled differently (the header included twice, a heavy one with the
   precompiled header), and so were the figures of that day in results-vm.jsonl.
3. Alone or with the torch precompiled header (`--only alone`): a sample of the heavy
   headers' self-sufficiency units and of the test programs (every `--sample`-th), each
   compiled with it (as they were built until 2026-12-06) and without it (as now),
   interleaved with/alone/alone/with. Without it a unit parses only the torch headers it
   includes; with it, it pays the precompiled header's deferred template instantiation
   (~8 s). The test programs also without it but with <torch/torch.h> (`-include`), as they
   included it until then instead of the torch headers they use. The examples that use
   the precompiled header, with it and without it (`--group examples`).

Every compile is the build's own command (compile_commands.json) with -fsyntax-only for the
compile-fail programs (as their tests run them), `--jobs` at a time.

Usage: python3 benchmarks/ci_compile_checks.py --build build [--jobs 2] [--rounds 2]
                                              [--only compile_fail|self_sufficiency|alone]
                                              [--sample 4] [--group heavy_header_units|test_programs|examples]
"""
import argparse
import glob
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_model, utc_now  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def command_of(entries, needle):
    """The compile command of the first entry whose command names `needle`, up to its -o."""
    for e in entries:
        if needle in e["command"]:
            return e["command"].split(" -o ")[0]
    raise SystemExit(f"no compile command names {needle} in compile_commands.json: configure the build first")


def timed(build, jobs, commands, must_compile=False):
    def one(c):
        t = time.perf_counter()
        r = subprocess.run(c, shell=True, cwd=build, capture_output=True, text=True)
        if must_compile and r.returncode:
            raise SystemExit(f"{c.rsplit(' ', 1)[1]} does not compile this way:\n{r.stderr[:2000]}")
        return time.perf_counter() - t
    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as ex:
        spent = sum(ex.map(one, commands))
    return time.perf_counter() - t, spent


def machine():
    cxx = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return {"host": "vm", "cpu": cpu_model(), "cores": os.cpu_count(), "compiler": cxx, "device": "cpu", "date": utc_now()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=["compile_fail", "self_sufficiency", "alone"])
    ap.add_argument("--sample", type=int, default=4, help="alone: every n-th heavy header, test program and example")
    ap.add_argument("--group", choices=["heavy_header_units", "test_programs", "examples"],
                    help="alone: only this group")
    a = ap.parse_args()
    build = pathlib.Path(a.build).resolve()
    entries = json.loads((build / "compile_commands.json").read_text())
    only = f" --only {a.only}" if a.only else ""
    base = dict(machine(), command=f"python3 benchmarks/ci_compile_checks.py --build {a.build} --jobs {a.jobs} "
                                   f"--rounds {a.rounds}{only}")
    if a.only in (None, "compile_fail"):
        compile_fail(a, build, entries, base)
    if a.only in (None, "self_sufficiency"):
        self_sufficiency(a, build, entries, base)
    if a.only in (None, "alone"):
        group = f" --group {a.group}" if a.group else ""
        alone(a, build, entries, dict(base, command=base["command"] + f" --sample {a.sample}{group}"))


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
    unit = command_of(entries, "anvil_self_sufficient.dir")
    generated = {pathlib.Path(e["file"]).name for e in entries if "anvil_self_sufficient.dir" in e["command"]}
    with tempfile.TemporaryDirectory() as d:
        commands, n_light = [], 0
        for p in sorted((ROOT / "include").rglob("*.hpp")):
            h = p.relative_to(ROOT / "include").as_posix()
            name = re.sub(r"\W", "_", h) + ".cpp"
            if name in generated:
                continue
            tu = pathlib.Path(d) / name
            tu.write_text(f"#include <{h}>\n")
            n_light += "Light header" in p.read_text()
            commands.append(f"{unit} -o {tu}.o -c {tu}")
        wall, spent = timed(build, a.jobs, commands)
    print(json.dumps(dict(base, bench="ci_self_sufficiency_units_gone", name="ci_self_sufficiency_units_gone_compile_s",
                          side="removed", value=round(spent, 1), unit="s", wall_s=round(wall, 1),
                          config={"units": len(commands), "light": n_light, "heavy": len(commands) - n_light,
                                  "jobs": a.jobs})), flush=True)


PCH = re.compile(r" -Winvalid-pch -include \S+cmake_pch\.hxx")


def alone(a, build, entries, base):
    """3. heavy units and test programs with the torch precompiled header and without it."""
    heavy = command_of(entries, "anvil_self_sufficient.dir")
    headers = [p for p in sorted((ROOT / "include").rglob("*.hpp")) if "Light header" not in p.read_text()]
    with tempfile.TemporaryDirectory() as d:
        units = []
        for p in headers[:: a.sample]:
            tu = pathlib.Path(d) / (re.sub(r"\W", "_", p.relative_to(ROOT / "include").as_posix()) + ".cpp")
            tu.write_text(f"#include <{p.relative_to(ROOT / 'include').as_posix()}>\n")
            units.append(f"{heavy} -o {tu}.o -c {tu}")
        tests = sorted((e for e in entries if "anvil_tests.dir" in e["command"] and e["file"].endswith("_test.cpp")),
                       key=lambda e: e["file"])[:: a.sample]
        out = pathlib.Path(d) / "t.o"
        programs = [PCH.sub("", e["command"].split(" -o ")[0]) + f" -o {out}.{i} -c {e['file']}" for i, e in enumerate(tests)]
        pch = str(build / "CMakeFiles" / "anvil_pch.dir" / "cmake_pch.hxx")
        if not (build / "CMakeFiles" / "anvil_pch.dir" / "cmake_pch.hxx.gch").exists():
            raise SystemExit(f"{pch}.gch is not built: build the examples first")
        flags = {"with_pch": f" -Winvalid-pch -include {pch}", "alone_torch_h": " -include torch/torch.h", "alone": ""}
        examples = sorted((e for e in entries if PCH.search(e["command"]) and "/examples/" in e["file"]),
                          key=lambda e: e["file"])[:: a.sample]
        example_commands = [PCH.sub("", e["command"].split(" -o ")[0]) + f" -o {out}.e{i} -c {e['file']}" for i, e in enumerate(examples)]
        groups = {"heavy_header_units": (units, ["with_pch", "alone", "alone", "with_pch"]),
                  "examples": (example_commands, ["with_pch", "alone", "alone", "with_pch"]),
                  "test_programs": (programs, ["with_pch", "alone_torch_h", "alone", "alone", "alone_torch_h", "with_pch"])}
        for group, (commands, sides) in groups.items():
            if a.group and group != a.group:
                continue
            order = (sides * a.rounds)[: len(sides) // 2 * a.rounds]
            for side in order:
                run = [c.replace(" -o ", f"{flags[side]} -o ", 1) for c in commands]
                wall, spent = timed(build, a.jobs, run, must_compile=True)
                print(json.dumps(dict(base, bench="ci_alone_vs_pch", name=f"ci_{group}_compile_s", side=side,
                                      value=round(spent, 1), unit="s", wall_s=round(wall, 1),
                                      config={"units": len(run), "jobs": a.jobs,
                                              "files": [c.rsplit("/", 1)[1] for c in run]}, order="/".join(order))), flush=True)


if __name__ == "__main__":
    main()
