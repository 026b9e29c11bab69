"""An env whose observation is how many times a Python thread of the program has ticked:
while anvil steps it, the GIL must be free between batches for the thread to run."""

import threading
import time

import numpy as np

from pendulum import Box

ticks = 0


def _tick():
    global ticks
    while True:
        ticks += 1
        time.sleep(0.001)


_thread = threading.Thread(target=_tick, daemon=True)
_thread.start()


class Ticker:
    observation_space = Box([0.0], [1e9])
    action_space = Box([-1.0], [1.0])

    def reset(self, seed=None, options=None):
        return np.array([ticks], dtype=np.float32), {}

    def step(self, action):
        return np.array([ticks], dtype=np.float32), 0.0, False, False, {}
