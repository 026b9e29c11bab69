"""What a benchmark's JSON lines say of the machine, and how they are written: the CPU model,
OpenBLAS's kernel family as a benchmark run loads it, and appending lines to a results file.
Shared by the scripts in benchmarks/ (each imports it from its own directory)."""
import json
import os
import subprocess
import sys
import time


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), "unknown" where it does not say."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def blas_kernel():
    """OpenBLAS's kernel family as a benchmark loads it: benchmarks unset OPENBLAS_CORETYPE
    and OPENBLAS_L2_SIZE, so it is asked of a process without them."""
    code = ("import ctypes; f = ctypes.CDLL('libopenblas.so.0').openblas_get_corename; "
            "f.restype = ctypes.c_char_p; print(f().decode())")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return "OpenBLAS " + out.stdout.strip() if out.returncode == 0 else "unknown"


def utc_now():
    """The time of a run as the JSON lines give it: 2026-12-06T13:58:00Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def append_jsonl(path, rows):
    """Appends `rows` (dicts) to the JSON-lines file at `path`, one line each."""
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def add_jsonl_arguments(ap):
    """--jsonl FILE and --tag KEY=VALUE (repeatable) on argparse parser `ap`."""
    ap.add_argument("--jsonl", help="append the JSON lines to this file")
    ap.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                    help="a field added to every JSON line")


def tags_of(ap, args):
    """The --tag fields of parsed `args` as a dict; a malformed one is `ap`'s error."""
    tags = {}
    for t in args.tag:
        key, eq, value = t.partition("=")
        if not eq or not key:
            ap.error(f"--tag {t!r}: expected KEY=VALUE")
        tags[key] = value
    return tags
