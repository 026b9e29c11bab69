#!/usr/bin/env python3
"""Proportional prioritized replay's sum tree in vectorised numpy: the comparison point
for bench_buffers (sample + priority update of a batch).

A binary tree in one array (root at 1, leaves at [size, 2 size)). A batch descends all
at once, one numpy op per level; an update writes the leaves and recomputes the touched
parents level by level. This is how a careful Python implementation avoids a Python loop
per sample. Prints one JSON line: batches of `--batch` sampled and re-prioritised per
second, the median of `--repeats` timed repeats.

`--whole` does what one anvil PrioritizedBuffer call does (bench_buffers' whole-call
figure), not only the tree: it also keeps a min tree beside the sum tree (the smallest
priority normalises the importance weights, as anvil's tree does), gathers the sampled
transitions (obs and next_obs of --obs floats, --act action floats, reward, terminated)
from arrays of --capacity rows, and computes the importance weights (P / P_min)^-beta.
"""
import argparse
import json
import time

import numpy as np


class SumTree:
    def __init__(self, capacity, with_min=False):
        self.size = 1
        while self.size < capacity:
            self.size *= 2
        self.depth = self.size.bit_length() - 1
        self.tree = np.zeros(2 * self.size, dtype=np.float64)
        # min tree: empty leaves count as +inf
        self.min_tree = np.full(2 * self.size, np.inf) if with_min else None

    def update(self, idx, priority):
        node = idx + self.size
        self.tree[node] = priority
        if self.min_tree is not None:
            self.min_tree[node] = priority
        for _ in range(self.depth):
            node = np.unique(node // 2)
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]
            if self.min_tree is not None:
                self.min_tree[node] = np.minimum(self.min_tree[2 * node], self.min_tree[2 * node + 1])

    def min(self):
        return self.min_tree[1]

    def find(self, mass):
        node = np.ones(mass.shape[0], dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * node
            left_sum = self.tree[left]
            right = mass >= left_sum
            mass = np.where(right, mass - left_sum, mass)
            node = left + right
        return node - self.size

    def total(self):
        return self.tree[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--whole", action="store_true",
                    help="the whole buffer call: also gather the transitions and compute importance weights")
    ap.add_argument("--obs", type=int, default=17)
    ap.add_argument("--act", type=int, default=6)
    ap.add_argument("--beta", type=float, default=0.4)
    a = ap.parse_args()

    rng = np.random.default_rng(a.seed)
    tree = SumTree(a.capacity, with_min=a.whole)
    if a.whole:
        store = {"obs": rng.standard_normal((a.capacity, a.obs), dtype=np.float32),
                 "next_obs": rng.standard_normal((a.capacity, a.obs), dtype=np.float32),
                 "action": rng.uniform(-1, 1, (a.capacity, a.act)).astype(np.float32),
                 "reward": rng.standard_normal(a.capacity, dtype=np.float32),
                 "terminated": (rng.random(a.capacity) < 0.005).astype(np.float32)}
    # a full buffer with random priorities, filled in batches of 4096
    for start in range(0, a.capacity, 4096):
        idx = np.arange(start, min(start + 4096, a.capacity))
        tree.update(idx, rng.random(idx.shape[0]) + 0.01)

    def once():
        total = tree.total()
        mass = (np.arange(a.batch) + rng.random(a.batch)) * (total / a.batch)
        idx = tree.find(mass)
        if a.whole:
            batch = {k: v[idx] for k, v in store.items()}
            p = tree.tree[idx + tree.size]
            batch["weight"] = ((p / tree.min()) ** -a.beta).astype(np.float32)
        td = rng.random(a.batch) * 2
        tree.update(idx, (np.abs(td) + 1e-6) ** a.alpha)

    for _ in range(20):
        once()
    rates = []
    for _ in range(a.repeats):
        n, start = 0, time.perf_counter()
        while True:
            once()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= a.seconds:
                break
        rates.append(n / elapsed)
    rates.sort()
    name = "numpy_prioritized_buffer_sample_update" if a.whole else "numpy_sum_tree_sample_update"
    config = {"capacity": a.capacity, "batch": a.batch, "numpy": np.__version__}
    if a.whole:
        config.update(obs=a.obs, act=a.act)
    print(json.dumps({"name": name, "value": round(rates[len(rates) // 2], 1),
                      "unit": "batches/s",
                      "config": config,
                      "impl": "numpy"}))


if __name__ == "__main__":
    main()
