"""The pipe reference for bench_python_envs: the same Python env in W worker processes
driven over multiprocessing pipes, as Stable-Baselines3's SubprocVecEnv drives them (a
command and the actions pickled down a pipe, the results pickled back), at its best: each
worker holds a slice of the envs and answers one message per batch with stacked arrays
(SubprocVecEnv's default is one env per process, which on 2 cores only adds messages), and
the processes are started by `forkserver` as SubprocVecEnv starts them. Prints env steps
per second as one JSON line.

Usage: python3 python_env_pipes.py MODULE:ATTR NUM_ENVS WORKERS SECONDS (MODULE on PYTHONPATH)"""

import importlib
import json
import multiprocessing as mp
import sys
import time

import numpy as np


def worker(remote, target, first, count):
    module, attr = target.split(":")
    make = getattr(importlib.import_module(module), attr)
    envs = [make(index=i) for i in range(first, first + count)]
    for k, e in enumerate(envs):
        e.reset(seed=first + k)
    while True:
        cmd, data = remote.recv()
        if cmd == "step":
            obs, rew, term, trunc = [], [], [], []
            for e, a in zip(envs, data):
                o, r, te, tr, _ = e.step(a)
                if te or tr:
                    o, _ = e.reset()
                obs.append(o)
                rew.append(r)
                term.append(te)
                trunc.append(tr)
            remote.send((np.stack(obs), np.array(rew), np.array(term), np.array(trunc)))
        else:
            remote.close()
            return


def main():
    target, n, w, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    ctx = mp.get_context("forkserver")
    remotes, procs = [], []
    for k in range(w):
        lo, hi = n * k // w, n * (k + 1) // w
        parent, child = ctx.Pipe()
        p = ctx.Process(target=worker, args=(child, target, lo, hi - lo), daemon=True)
        p.start()
        child.close()
        remotes.append((parent, hi - lo))
        procs.append(p)
    actions = [np.full((c, 1), 0.5, dtype=np.float32) for _, c in remotes]

    def step():
        for (r, _), a in zip(remotes, actions):
            r.send(("step", a))
        return [r.recv() for r, _ in remotes]

    step()  # the workers are up
    rates = []
    for _ in range(3):
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            step()
            steps += n
        rates.append(steps / (time.perf_counter() - start))
    for r, _ in remotes:
        r.send(("close", None))
    for p in procs:
        p.join()
    print(json.dumps({"name": "python_env_pipes_steps", "value": sorted(rates)[1], "unit": "env steps/s",
                      "config": {"env": target, "num_envs": n, "workers": w}}))


if __name__ == "__main__":
    main()
