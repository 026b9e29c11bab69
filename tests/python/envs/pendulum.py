"""Pendulum swing-up in numpy, written from Gymnasium's published Pendulum-v1 dynamics
(https://gymnasium.farama.org/environments/classic_control/pendulum/): g = 10, m = 1,
l = 1, dt = 0.05, torque clipped to [-2, 2], speed clipped to [-8, 8], semi-implicit
Euler, reward -(normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2) on the state before the
step, observation [cos theta, sin theta, theta_dot], start theta ~ U(-pi, pi),
theta_dot ~ U(-1, 1), truncated after 200 steps. No gymnasium import: the spaces are
duck-typed (shape, low, high, dtype), as anvil reads them."""

import numpy as np


class Box:
    def __init__(self, low, high, dtype=np.float32):
        self.low = np.asarray(low, dtype=dtype)
        self.high = np.asarray(high, dtype=dtype)
        self.shape = self.low.shape
        self.dtype = np.dtype(dtype)


class Pendulum:
    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    l = 1.0
    max_episode_steps = 200

    def __init__(self, g=10.0, index=0, theta0=None, theta_dot0=0.0):
        self.g = float(g)
        self.index = index
        self.start = None if theta0 is None else (float(theta0), float(theta_dot0))
        self.observation_space = Box([-1.0, -1.0, -self.max_speed], [1.0, 1.0, self.max_speed])
        self.action_space = Box([-self.max_torque], [self.max_torque])
        self.state = np.zeros(2)
        self.steps = 0
        self.rng = np.random.default_rng()

    def _obs(self):
        th, thdot = self.state
        return np.array([np.cos(th), np.sin(th), thdot], dtype=np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        if self.start is not None:  # a fixed start (theta0, theta_dot0), for comparisons
            self.state = np.array(self.start, dtype=np.float64)
        else:
            self.state = self.rng.uniform(low=[-np.pi, -1.0], high=[np.pi, 1.0])
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        th, thdot = self.state
        u = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -self.max_torque, self.max_torque))
        norm = ((th + np.pi) % (2 * np.pi)) - np.pi
        cost = norm ** 2 + 0.1 * thdot ** 2 + 0.001 * u ** 2
        newthdot = thdot + (3 * self.g / (2 * self.l) * np.sin(th) + 3.0 / (self.m * self.l ** 2) * u) * self.dt
        newthdot = np.clip(newthdot, -self.max_speed, self.max_speed)
        self.state = np.array([th + newthdot * self.dt, newthdot])
        self.steps += 1
        return self._obs(), -cost, False, self.steps >= self.max_episode_steps, {}


def make(index=0, **kwargs):
    return Pendulum(index=index, **kwargs)


class GravityTasks(Pendulum):
    """A multi-task Pendulum: task i swings under gravity `gravities[i]` (env `index` runs task
    index % len(gravities)); the task is named in each step's info, as anvil reads tasks."""

    gravities = (10.0, 4.0)
    tasks = ["g10", "g4"]

    def __init__(self, index=0, **kwargs):
        self.task = index % len(self.gravities)
        super().__init__(index=index, g=self.gravities[self.task], **kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {"task": self.tasks[self.task]}
