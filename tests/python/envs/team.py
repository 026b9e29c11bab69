"""A cooperative team env in PettingZoo's parallel API, written here (PettingZoo is not a
Debian package): `possible_agents`, `observation_space(agent)`, `action_space(agent)`,
`state()`, and `reset`/`step` that take and return dicts by agent.

Agree: each episode shows both agents a target, one of 3 (one-hot); each picks one of 4
actions, of which the 4th is never available (its action mask says so, in the
observation dict as PettingZoo's envs with masks give it). The team's reward is 1 when both
pick the target, else 0, and the episode ends after `rounds` such steps (truncated)."""

import numpy as np

from pendulum import Box


class Discrete:
    def __init__(self, n):
        self.n = n


class Agree:
    metadata = {"name": "agree_v0"}

    def __init__(self, rounds=1, index=0):
        self.rounds = int(rounds)
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents = []
        self.rng = np.random.default_rng(index)
        self.target, self.t = 0, 0

    def observation_space(self, agent):
        return Box(np.zeros(3), np.ones(3))

    def action_space(self, agent):
        return Discrete(4)

    def _obs(self):
        one_hot = np.eye(3, dtype=np.float32)[self.target]
        mask = np.array([1, 1, 1, 0], dtype=np.int8)
        return {a: {"observation": one_hot, "action_mask": mask} for a in self.agents}

    def state(self):
        return np.concatenate([np.eye(3, dtype=np.float32)[self.target], [self.t / self.rounds]]).astype(np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.target, self.t = int(self.rng.integers(3)), 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), actions
        assert all(0 <= int(a) < 3 for a in actions.values()), f"an unavailable action was taken: {actions}"
        both = all(int(a) == self.target for a in actions.values())
        self.t += 1
        self.target = int(self.rng.integers(3))
        done = self.t >= self.rounds
        obs = self._obs()
        rewards = {a: 1.0 if both else 0.0 for a in self.agents}
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos


class Unlike(Agree):
    """Agents that differ: agent_1 has 5 actions (refused by anvil's layout, named)."""

    def action_space(self, agent):
        return Discrete(5 if agent == "agent_1" else 4)
