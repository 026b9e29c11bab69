#!/usr/bin/env python3
"""The sweep report of report_test.py, rendered by headless Chromium (Debian `chromium`, when
installed; not an install-deps package): the screenshot must show a page, not a blank, with
the curves' colours in it. Skipped visibly where Chromium is absent."""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import zlib

ap = argparse.ArgumentParser()
ap.add_argument("--work", required=True)
args = ap.parse_args()

browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
if browser is None:
    print("ANVIL-SKIPPED: headless Chromium is not installed (Debian: apt-get install chromium); the page was not rendered")
    sys.exit(0)

page = os.path.join(os.path.abspath(args.work), "sweep.html")
shot = os.path.join(os.path.abspath(args.work), "sweep.png")
if os.path.exists(shot):
    os.remove(shot)
r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1000,1200",
                    "--screenshot=" + shot, "file://" + page], capture_output=True, text=True, timeout=120)
if r.returncode != 0 or not os.path.exists(shot):
    print(f"FAILED: {browser} exited {r.returncode} without a screenshot:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    sys.exit(1)


def pixels(path):
    """Decodes an 8-bit RGB or RGBA PNG (what Chromium writes): rows of (r, g, b)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and color in (2, 6), f"PNG colour type {color}, depth {depth}"
    bpp = 3 if color == 2 else 4
    raw, stride, prev, rows, i = zlib.decompress(idat), w * bpp, bytearray(w * bpp), [], 0
    for _ in range(h):
        ft, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if ft == 1:
                line[x] = (line[x] + a) & 255
            elif ft == 2:
                line[x] = (line[x] + b) & 255
            elif ft == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return rows


rows = pixels(shot)
total = sum(len(r) for r in rows)
ink = sum(1 for r in rows for p in r if p != (255, 255, 255))
blue = sum(1 for r in rows for p in r if abs(p[0] - 0x25) < 24 and abs(p[1] - 0x63) < 24 and abs(p[2] - 0xeb) < 24)
red = sum(1 for r in rows for p in r if abs(p[0] - 0xdc) < 24 and abs(p[1] - 0x26) < 24 and abs(p[2] - 0x26) < 24)
print(f"{shot}: {len(rows[0])}x{len(rows)}, {100 * ink / total:.1f}% not white, {blue} pixels of the first setting's blue, "
      f"{red} of the second's red")
if ink < 0.03 * total or blue < 200 or red < 200:
    print("FAILED: the page rendered (nearly) blank, or without both settings' curves")
    sys.exit(1)
print("the report renders in headless Chromium")
