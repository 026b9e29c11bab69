"""Envs whose observations hold images, as Gymnasium describes them: `Dot` draws a dot that
the action moves on an 8x6 picture (a Box of bytes [H, W, C]) beside its position (a Dict
space of "image" and "pos"); `Plain` is the picture alone (a Box of bytes). Each pixel's
value follows from the state, so a test knows every byte. `BadDot` hands out its picture in
the wrong shape at step 2. Duck-typed spaces (no gymnasium import)."""

import numpy as np

from pendulum import Box


class Dict:
    def __init__(self, spaces):
        self.spaces = dict(spaces)


H, W = 8, 6


class Dot:
    def __init__(self, keyed=True):
        image = Box(np.zeros((H, W, 3)), np.full((H, W, 3), 255), dtype=np.uint8)
        self.keyed = keyed
        self.observation_space = Dict({"image": image, "pos": Box([0.0, 0.0], [H, W])}) if keyed else image
        self.action_space = Box([-1.0, -1.0], [1.0, 1.0])
        self.pos = np.zeros(2)
        self.t = 0

    def picture(self):
        img = np.zeros((H, W, 3), np.uint8)
        img[..., 0] = np.arange(H)[:, None] * 10 + np.arange(W)[None, :]  # red: 10 row + column
        img[..., 1] = self.t  # green: the step
        r, c = int(self.pos[0]) % H, int(self.pos[1]) % W
        img[r, c, 2] = 255  # blue: the dot
        return img

    def obs(self):
        img = self.picture()
        return {"image": img, "pos": self.pos.astype(np.float32)} if self.keyed else img

    def reset(self, seed=None, options=None):
        self.pos = np.array([seed % H, seed % W], dtype=np.float64) if seed is not None else np.zeros(2)
        self.t = 0
        return self.obs(), {}

    def step(self, action):
        self.pos = self.pos + np.round(np.asarray(action, np.float64))
        self.t += 1
        return self.obs(), 1.0, False, self.t >= 5, {}


def plain():
    return Dot(keyed=False)


class BadDot(Dot):
    def obs(self):
        o = super().obs()
        if self.t == 2:
            o["image"] = o["image"][:, :, :2]
        return o
