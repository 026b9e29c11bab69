#!/usr/bin/env python3
"""link_order_check.py DEFAULT ORDERED [PROGRAM...]

Checks scripts/link_order.py's library order. DEFAULT and ORDERED are the same program linked
in the linker's own order and in that order. Both run under LD_DEBUG=bindings: every symbol
looked up at start, by the program or any library, must be found in the same object in both
(the program itself counting as one object under two names). Each PROGRAM must have been
linked in the order: its direct dependencies (DT_NEEDED) are ORDERED's, in the same order.
Exits 1 naming the first differences; 0 saying how many bindings were compared.
"""
import functools
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from link_order import BINDING, ld_debug  # noqa: E402  (the script whose order this checks)


def bindings(program):
    try:
        lines = ld_debug([program], "bindings")
    except RuntimeError as e:
        sys.exit(str(e))
    exe = os.path.realpath(program)

    @functools.lru_cache(maxsize=None)  # ~140,000 bindings name a few hundred files
    def name(f):
        return "<program>" if os.path.realpath(f) == exe else os.path.realpath(f)
    found = {}
    for line in lines:
        m = BINDING.search(line)
        if m and not m.group(1).startswith("linux-vdso"):
            src, dst, sym = m.groups()
            found.setdefault((name(src), sym), set()).add(name(dst))
    return found


def needed(program):
    out = subprocess.run(["readelf", "-d", program], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    default, ordered, programs = argv[1], argv[2], argv[3:]
    a, b = bindings(default), bindings(ordered)
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))[:10]
        sys.exit(f"the two look up different symbols ({len(set(a) ^ set(b))} differ), e.g. {only}")
    diff = sorted(k for k in a if a[k] != b[k])
    if diff:
        lines = [f"  {os.path.basename(src)}: `{sym}' found in {sorted(a[(src, sym)])} in the linker's order, "
                 f"{sorted(b[(src, sym)])} in link_order.py's" for src, sym in diff[:20]]
        sys.exit(f"{len(diff)} of {len(a)} bindings differ:\n" + "\n".join(lines))
    order = needed(ordered)
    if len(order) <= len(needed(default)):
        print(f"{len(a)} bindings compared, all the same; the order was not applied (see the build's "
              "link_order note), so the programs were not checked")
        return 0
    for p in programs:
        if needed(p) != order:
            sys.exit(f"{p} was not linked in link_order.py's order: its DT_NEEDED is {needed(p)[:8]}..., "
                     f"not {order[:8]}...")
    print(f"{len(a)} bindings compared, all the same; {len(programs)} programs linked in the order "
          f"({len(order)} libraries)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
