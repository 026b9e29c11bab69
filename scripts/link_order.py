#!/usr/bin/env python3
"""An order of a program's shared libraries that makes its start faster, binding every symbol
to the same library as before. Writes a linker response file (for g++ `@FILE`) that names
every library the program loads, in that order, as a direct dependency.

    scripts/link_order.py PROBE OUT.rsp [--cache FILE]

PROBE is a program linked as anvil's training mains are (LibTorch, yaml-cpp), whose main does
nothing. Why: the dynamic loader resolves each symbol a library needs by searching every
loaded object in load order (the main program's dependencies, breadth first) until one
defines it. Debian's LibTorch loads 288 libraries (OpenCV, and through it GDAL, Xerces,
GEOS, ...); those loaded late resolve their own symbols after some 200 failed searches each,
and at start the loader spends about 0.13 s of LibTorch's 0.4 s in `do_lookup_x` alone.
Libraries that many bindings go to are better early. Moving a library changes nothing as
long as, for every symbol defined by more than one library, the library that wins today
(the first in load order) stays ahead of the others: the order here keeps that constraint
and otherwise puts the libraries with the most bindings first (a greedy schedule: each step
places the not-yet-placed library whose closure of unplaced predecessors has the most
bindings per library). The bindings are counted from the probe's own start
(`LD_DEBUG=bindings`); the load order from `LD_DEBUG=scopes`; definitions from `nm -D`.

Writes an empty file (so the build goes on as before) when the probe loads few libraries,
when a tool is missing, or on any error; says why on stderr.
"""
import collections
import json
import os
import re
import subprocess
import sys

MIN_LIBRARIES = 32  # below this, lookups are cheap whatever the order
# Symbols every shared object defines for itself, never looked up across objects.
PER_OBJECT = {"_init", "_fini", "__bss_start", "_edata", "_end"}


# A line of LD_DEBUG=bindings: the object looking up, the object found, the symbol.
BINDING = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \S+ symbol `([^']+)'")


def ld_debug(cmd, what, timeout=300):
    """The dynamic loader's LD_DEBUG=`what` lines for running `cmd` (a list), which must exit 0."""
    env = dict(os.environ, LD_DEBUG=what)
    env.pop("LD_DEBUG_OUTPUT", None)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited with status {p.returncode}: {p.stderr[-2000:]}")
    return p.stderr.splitlines()


def probe_trace(probe):
    """The probe's global scope (load order, the probe first) and its bindings (from, to)."""
    scope = None
    bindings = []
    for line in ld_debug([probe], "scopes,bindings"):
        if scope is None and "scope 0:" in line:
            scope = line.split("scope 0:", 1)[1].split()
            continue
        m = BINDING.search(line)
        if m:
            bindings.append(m.groups()[:2])
    if not scope:
        raise RuntimeError("LD_DEBUG=scopes printed no scope (not glibc's loader?)")
    return scope, bindings


def defined_symbols(libs, cache):
    """{lib: the dynamic symbols it defines}, from `cache` or one `nm -D` for all the others
    (one nm process per library cost ~0.14 s each, 40 s for LibTorch's 287 here)."""
    keys = {}
    for lib in libs:
        st = os.stat(lib)
        keys[lib] = f"{os.path.realpath(lib)}:{st.st_size}:{int(st.st_mtime)}"
    missing = [lib for lib in libs if keys[lib] not in cache]
    if missing:
        out = subprocess.run(["nm", "-D", "--defined-only", *missing], capture_output=True, text=True,
                             check=True).stdout
        names, current, headers = {lib: set() for lib in missing}, None, {f"{lib}:": lib for lib in missing}
        if len(missing) == 1:
            current = missing[0]  # nm names the file only when given several
        for line in out.splitlines():
            if line in headers:
                current = headers[line]
                continue
            parts = line.split()
            if current is not None and len(parts) >= 3 and parts[1] != "A":
                names[current].add(parts[2].split("@")[0])
        for lib in missing:
            cache[keys[lib]] = sorted(names[lib] - PER_OBJECT)
    return {lib: set(cache[keys[lib]]) for lib in libs}


def order(libs, defs, weight):
    """libs in load order -> a new order keeping each multiply-defined symbol's winner first."""
    pos = {lib: i for i, lib in enumerate(libs)}
    first = {}
    pred = collections.defaultdict(set)  # pred[b]: libraries that must stay ahead of b
    for lib in libs:
        for s in defs[lib]:
            w = first.setdefault(s, lib)
            if w != lib:
                pred[lib].add(w)
    closure = {}
    for lib in libs:  # load order is a topological order of pred
        c = set(pred[lib])
        for p in pred[lib]:
            c |= closure[p]
        closure[lib] = c
    placed, out = set(), []
    while len(out) < len(libs):
        best = None
        for lib in libs:
            if lib in placed:
                continue
            group = (closure[lib] - placed) | {lib}
            score = sum(weight[x] for x in group) / len(group)
            if best is None or score > best[0]:
                best = (score, group)
        for lib in sorted(best[1], key=pos.get):
            out.append(lib)
            placed.add(lib)
    at = {lib: i for i, lib in enumerate(out)}
    for b, ps in pred.items():
        assert all(at[p] < at[b] for p in ps), "constraint broken"
    return out


def main(argv):
    args = argv[1:]
    cache_file = None
    if "--cache" in args:
        i = args.index("--cache")
        cache_file = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    probe, out_file = args
    text = ""
    try:
        scope, bindings = probe_trace(probe)
        libs = [lib for lib in scope[1:] if os.path.isfile(lib)]
        if len(libs) < MIN_LIBRARIES:
            raise RuntimeError(f"the probe loads {len(libs)} libraries: nothing to gain")
        cache = {}
        if cache_file and os.path.isfile(cache_file):
            with open(cache_file) as f:
                cache = json.load(f)
        defs = defined_symbols(libs, cache)
        if cache_file:
            with open(cache_file, "w") as f:
                json.dump(cache, f)
        weight = collections.Counter(to for _, to in bindings)
        new = order(libs, defs, weight)
        def steps(o):  # objects a lookup passes, summed over the probe's bindings
            at = {lib: i + 1 for i, lib in enumerate(o)}
            return sum(at.get(to, 0) for _, to in bindings)
        print(f"link_order: {len(new)} libraries; the probe's lookups pass {steps(libs):,} objects in load "
              f"order, {steps(new):,} in this one", file=sys.stderr)
        # every library a direct dependency; the as-needed state the link had is restored after
        text = "-Wl,--push-state,--no-as-needed\n" + "".join(f"{lib}\n" for lib in new) + "-Wl,--pop-state\n"
    except Exception as e:  # the build goes on with the linker's own order
        print(f"link_order: keeping the default library order: {e}", file=sys.stderr)
    tmp = out_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
