"""Checks image demonstrations recorded by `diffusion_pusht --env.observation=image`
with h5py: robomimic's layout, frames [T, S, S, 3] uint8 gzip-compressed, and each frame
showing the pusher where agent_pos says it is (the centroid of the pusher's blue pixels
within 1 pixel of agent_pos scaled from the 512-unit field) and the block's grey.

Usage: check_image_demos.py FILE DEMOS SIZE
"""
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # the test is skipped, not passed
    print(f"ANVIL-SKIPPED: {e} (Debian: python3-h5py)")
    sys.exit(0)

path, demos, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
f = h5py.File(path, "r")
names = sorted(f["data"].keys(), key=lambda n: int(n.split("_")[1]))
assert len(names) == demos, names
checked = 0
for name in names:
    g = f["data"][name]
    img = g["obs/image"]
    pos = g["obs/agent_pos"][:]
    t = g["actions"].shape[0]
    assert img.shape == (t, size, size, 3) and img.dtype == np.uint8, (img.shape, img.dtype)
    assert img.compression == "gzip", img.compression
    assert pos.shape == (t, 2), pos.shape
    frames = img[:]
    for i in range(0, t, max(1, t // 10)):
        rgb = frames[i].astype(int)
        blue = (np.abs(rgb - [65, 105, 225]).sum(axis=2) < 30)
        grey = (np.abs(rgb - [119, 136, 153]).sum(axis=2) < 30)
        assert blue.sum() > 0 and grey.sum() > 0, (name, i, blue.sum(), grey.sum())
        ys, xs = np.nonzero(blue)
        want = pos[i] * size / 512.0  # x along a row, y down the rows
        got = np.array([xs.mean() + 0.5, ys.mean() + 0.5])
        # Only the fully inside pixels pass the colour test (edges are blended): a whole disc
        # of radius 15 field units shows at least 60% of its area here.
        if blue.sum() > 0.6 * np.pi * (15 * size / 512.0) ** 2:
            assert np.abs(got - want).max() < 1.0, (name, i, got, want)
            checked += 1
assert checked > 0
print(f"image demonstrations: {len(names)} demos, frames [T, {size}, {size}, 3] uint8 gzip, pusher drawn at agent_pos ({checked} frames)")
