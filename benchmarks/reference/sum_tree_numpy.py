#!/usr/bin/env python3
"""Proportional prioritized replay's sum tree in vectorised numpy: the comparison point
for bench_buffers (sample + priority update of a batch).

A binary tree in one array (root at 1, leaves at [size, 2 size)). A batch descends all
at once, one numpy op per level; an update writes the leaves and recomputes the touched
parents level by level. This is how a careful Python implementation avoids a Python loop
per sample. Prints one JSON line: batches of `--batch` sampled and re-prioritised per
second, the median of `--repeats` timed repeats.
"""
import argparse
import json
import time

import numpy as np


class SumTree:
    def __init__(self, capacity):
        self.size = 1
        while self.size < capacity:
            self.size *= 2
        self.depth = self.size.bit_length() - 1
        self.tree = np.zeros(2 * self.size, dtype=np.float64)

    def update(self, idx, priority):
        node = idx + self.size
        self.tree[node] = priority
        for _ in range(self.depth):
            node = np.unique(node // 2)
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]

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
    a = ap.parse_args()

    rng = np.random.default_rng(a.seed)
    tree = SumTree(a.capacity)
    # a full buffer with random priorities, filled in batches of 4096
    for start in range(0, a.capacity, 4096):
        idx = np.arange(start, min(start + 4096, a.capacity))
        tree.update(idx, rng.random(idx.shape[0]) + 0.01)

    def once():
        total = tree.total()
        mass = (np.arange(a.batch) + rng.random(a.batch)) * (total / a.batch)
        idx = tree.find(mass)
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
    print(json.dumps({"name": "numpy_sum_tree_sample_update", "value": round(rates[len(rates) // 2], 1),
                      "unit": "batches/s",
                      "config": {"capacity": a.capacity, "batch": a.batch, "numpy": np.__version__},
                      "impl": "numpy"}))


if __name__ == "__main__":
    main()
