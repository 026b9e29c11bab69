"""Small Python envs that go wrong in one way each, for the bridge's fault tests. Each
is a one-number random walk until its fault (after `after` steps)."""

import os
import signal
import time

import numpy as np

from pendulum import Box


class Walk:
    """A one-dimensional walk: the observation is the position, the action moves it."""

    def __init__(self, after=3, index=0):
        self.after = int(after)
        self.index = index
        self.observation_space = Box([-100.0], [100.0])
        self.action_space = Box([-1.0], [1.0])
        self.x = 0.0
        self.t = 0

    def reset(self, seed=None, options=None):
        self.x, self.t = 0.0, 0
        return np.array([self.x], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        self.x += float(np.asarray(action).reshape(-1)[0])
        if self.t >= self.after:
            return self.fault()
        return np.array([self.x], dtype=np.float32), -abs(self.x), False, self.t >= 50, {}

    def fault(self):
        return np.array([self.x], dtype=np.float32), 0.0, False, False, {}


class Raises(Walk):
    def fault(self):
        return self.helper()

    def helper(self):
        raise ValueError(f"the walk fell off at x={self.x:.1f}")


class OldApi(Walk):
    def fault(self):
        return np.array([self.x], dtype=np.float32), 0.0, False, {}


class NanObservation(Walk):
    def fault(self):
        return np.array([np.nan], dtype=np.float32), 0.0, False, False, {}


class WrongShape(Walk):
    def fault(self):
        return np.zeros(3, dtype=np.float32), 0.0, False, False, {}


class NanReward(Walk):
    def fault(self):
        return np.array([self.x], dtype=np.float32), float("inf"), False, False, {}


class Exits(Walk):
    """The process ends in the middle of a step (os._exit: no exception, no cleanup)."""

    def fault(self):
        os._exit(3)


class Segfault(Walk):
    """A crash in native code: reads address 0."""

    def fault(self):
        import ctypes

        return ctypes.string_at(0)


class Killed(Walk):
    """Killed by SIGKILL, as the kernel's OOM killer kills."""

    def fault(self):
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)


class Hangs(Walk):
    """Stuck in a loop from its fault on."""

    def fault(self):
        while True:
            pass


class Slow(Walk):
    """Takes `pause` seconds over one step, then goes on as the walk does."""

    def __init__(self, pause=1.5, **kw):
        super().__init__(**kw)
        self.pause = float(pause)

    def fault(self):
        time.sleep(self.pause)
        self.after = 10**9
        return np.array([self.x], dtype=np.float32), -abs(self.x), False, False, {}


class ResetOld:
    """reset() returns the observation alone (the old Gym API)."""

    observation_space = Box([-1.0], [1.0])
    action_space = Box([-1.0], [1.0])

    def reset(self, seed=None, options=None):
        return np.zeros(1, dtype=np.float32)

    def step(self, action):
        return np.zeros(1, dtype=np.float32), 0.0, False, False, {}


class NoSpaces:
    def reset(self, seed=None):
        return np.zeros(1, dtype=np.float32), {}


class Corridor:
    """A discrete corridor of `length` cells: action 1 moves right, 0 left; reward 1 at the
    right end (terminated), -0.01 a step otherwise; truncated after 100 steps. Its tasks
    (when `tasks` is given) are corridors of different lengths, task i of length+i."""

    def __init__(self, length=5, index=0, tasks=False):
        self.length = int(length)
        self.index = index
        self.task = index % 2 if tasks else 0
        if tasks:
            self.tasks = ["short", "long"]
        self.observation_space = Box([0.0, 0.0], [1.0, 1.0])

        class Discrete:
            n = 2

        self.action_space = Discrete()
        self.pos, self.t = 0, 0

    def _obs(self):
        end = self.length + self.task
        return np.array([self.pos / end, float(self.task)], dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def step(self, action):
        a = int(action)
        assert a in (0, 1), f"action {a} is not 0 or 1"
        self.pos = max(0, self.pos + (1 if a == 1 else -1))
        self.t += 1
        done = self.pos >= self.length + self.task
        info = {"task": ["short", "long"][self.task]} if hasattr(self, "tasks") else {}
        return self._obs(), 1.0 if done else -0.01, done, self.t >= 100, info


def closure_factory():
    return lambda **kw: Walk(**kw)
