"""The bare-loop reference for bench_python_envs: the same Python env stepped by a plain
Python loop (reset once, then step with fixed actions, resetting an env whose episode
ended), as a user's own loop would. Prints env steps per second as one JSON line.

Usage: python3 python_env_loop.py MODULE:ATTR NUM_ENVS SECONDS (MODULE on PYTHONPATH)"""

import importlib
import json
import sys
import time

import numpy as np


def main():
    target, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    module, attr = target.split(":")
    make = getattr(importlib.import_module(module), attr)
    envs = [make(index=i) for i in range(n)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    shape = envs[0].action_space.shape
    actions = [np.full(shape, 0.5, dtype=np.float32) for _ in range(n)]
    rates = []
    for _ in range(3):
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for e, a in zip(envs, actions):
                obs, reward, terminated, truncated, info = e.step(a)
                if terminated or truncated:
                    e.reset()
            steps += n
        rates.append(steps / (time.perf_counter() - start))
    print(json.dumps({"name": "python_env_bare_loop_steps", "value": sorted(rates)[1], "unit": "env steps/s",
                      "config": {"env": target, "num_envs": n}}))


if __name__ == "__main__":
    main()
