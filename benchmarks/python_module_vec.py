#!/usr/bin/python3
"""anvil.make_vec("Pendulum-v1", 16) against a Python loop over 16 numpy Pendulums
(tests/python/envs/pendulum.py, Gymnasium's published dynamics, reset when an episode ends,
as a vector env does), with the same batches of random actions, and beside both the bare
C++ loop over the same 16 C++ Pendulums (anvil._anvil._bare_step_us: no Python, no numpy).
Each figure is the median of --repeats timed runs of --batches batched steps, the two
Python sides interleaved. One JSON line per figure, with the CPU and OpenBLAS's kernels.

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python_module_vec.py
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests", "python", "envs")]
import anvil  # noqa: E402
import pendulum  # noqa: E402
from machine import cpu_model  # noqa: E402 - one reading of the CPU's name for the benchmarks


def blas_core():
    """OpenBLAS's kernel family as the process loaded it (LibTorch's OpenBLAS)."""
    for lib in (None, "libopenblas.so.0"):
        try:
            fn = ctypes.CDLL(lib).openblas_get_corename
        except (AttributeError, OSError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return None


def time_anvil(envs, actions):
    envs.reset(seed=0)
    t0 = time.perf_counter()
    for a in actions:
        envs.step(a)
    return (time.perf_counter() - t0) / len(actions) * 1e6


def time_python(envs, actions):
    for i, e in enumerate(envs):
        e.reset(seed=i)
    n = len(envs)
    t0 = time.perf_counter()
    for a in actions:
        obs = np.empty((n, 3), np.float32)
        rew = np.empty(n)
        term = np.empty(n, bool)
        trunc = np.empty(n, bool)
        for i, e in enumerate(envs):
            o, r, te, tr, _ = e.step(a[i])
            if te or tr:
                o, _ = e.reset()
            obs[i], rew[i], term[i], trunc[i] = o, r, te, tr
    return (time.perf_counter() - t0) / len(actions) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n = args.num_envs
    actions = np.random.default_rng(0).uniform(-2, 2, size=(args.batches, n, 1)).astype(np.float32)
    vec = anvil.make_vec("Pendulum-v1", n)
    loop = [pendulum.Pendulum() for _ in range(n)]
    time_anvil(vec, actions[:200]), time_python(loop, actions[:200])  # warm up
    a_us, p_us, b_us = [], [], []
    for _ in range(args.repeats):
        a_us.append(time_anvil(vec, actions))
        p_us.append(time_python(loop, actions))
        b_us.append(anvil._anvil._bare_step_us("Pendulum-v1", n, args.batches * 10))
    common = {"num_envs": n, "cpu": cpu_model(), "openblas_core": blas_core(),
              "python": sys.version.split()[0], "batches": args.batches, "repeats": args.repeats}
    a, p, b = statistics.median(a_us), statistics.median(p_us), statistics.median(b_us)
    for name, value in (("make_vec_pendulum_us_per_batch", a), ("python_loop_pendulum_us_per_batch", p),
                        ("bare_cxx_pendulum_us_per_batch", b)):
        print(json.dumps({"name": name, "value": round(value, 3), "unit": "us/batch", **common}))
    print(json.dumps({"name": "make_vec_speedup_over_python_loop", "value": round(p / a, 1), "target": 10.0,
                      "met": p / a >= 10.0, **common}))


if __name__ == "__main__":
    main()
