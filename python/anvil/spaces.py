"""The spaces anvil's vector envs describe themselves with: Gymnasium's own (gymnasium.spaces)
when Gymnasium is installed, else these, which have the attributes and methods of
Gymnasium's that code reads (shape, dtype, low, high, n, nvec, spaces, sample, contains,
seed)."""

import numpy as np

try:  # Gymnasium's own spaces, where it is installed
    from gymnasium.spaces import Box, Dict, Discrete, MultiDiscrete  # noqa: F401
except ImportError:
    class _Space:
        def __init__(self, shape, dtype):
            self.shape = tuple(shape)
            self.dtype = np.dtype(dtype)
            self.np_random = np.random.default_rng()

        def seed(self, seed=None):
            self.np_random = np.random.default_rng(seed)
            return [seed]

    class Box(_Space):
        """Numbers in [low, high] (float32 for anvil's envs)."""

        def __init__(self, low, high, shape=None, dtype=np.float32):
            shape = np.shape(low) if shape is None else shape
            super().__init__(shape, dtype)
            self.low = np.broadcast_to(np.asarray(low, self.dtype), self.shape).copy()
            self.high = np.broadcast_to(np.asarray(high, self.dtype), self.shape).copy()

        def sample(self):
            if self.dtype.kind in "ui":  # integers (images): each in [low, high]
                return self.np_random.integers(self.low, self.high, endpoint=True).astype(self.dtype)
            lo = np.where(np.isfinite(self.low), self.low, -1.0)
            hi = np.where(np.isfinite(self.high), self.high, 1.0)
            return self.np_random.uniform(lo, hi).astype(self.dtype)

        def contains(self, x):
            x = np.asarray(x)
            return x.shape == self.shape and bool(np.all((x >= self.low) & (x <= self.high)))

        def __repr__(self):
            return f"Box({self.low.min()}, {self.high.max()}, {self.shape}, {self.dtype})"

    class Discrete(_Space):
        """One of n actions, 0 to n - 1."""

        def __init__(self, n):
            super().__init__((), np.int64)
            self.n = int(n)

        def sample(self):
            return int(self.np_random.integers(self.n))

        def contains(self, x):
            return isinstance(x, (int, np.integer)) and 0 <= int(x) < self.n

        def __repr__(self):
            return f"Discrete({self.n})"

    class MultiDiscrete(_Space):
        """One action per row, row i's among nvec[i]."""

        def __init__(self, nvec):
            self.nvec = np.asarray(nvec, np.int64)
            super().__init__(self.nvec.shape, np.int64)

        def sample(self):
            return self.np_random.integers(self.nvec).astype(np.int64)

        def contains(self, x):
            x = np.asarray(x)
            return x.shape == self.shape and bool(np.all((x >= 0) & (x < self.nvec)))

        def __repr__(self):
            return f"MultiDiscrete({self.nvec})"

    class Dict(_Space):
        """Named spaces (an observation of parts: images beside numbers), in order."""

        def __init__(self, spaces):
            self.spaces = dict(spaces)
            self.shape, self.dtype, self.np_random = None, None, np.random.default_rng()

        def __getitem__(self, name):
            return self.spaces[name]

        def keys(self):
            return self.spaces.keys()

        def seed(self, seed=None):
            for i, s in enumerate(self.spaces.values()):
                s.seed(None if seed is None else seed + i)
            return [seed]

        def sample(self):
            return {k: s.sample() for k, s in self.spaces.items()}

        def contains(self, x):
            return isinstance(x, dict) and x.keys() == self.spaces.keys() and \
                all(s.contains(x[k]) for k, s in self.spaces.items())

        def __repr__(self):
            return "Dict(" + ", ".join(f"{k!r}: {s}" for k, s in self.spaces.items()) + ")"
