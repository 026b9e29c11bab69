"""safetensors written and read with numpy over the raw bytes, independently of anvil's C++
(and of the safetensors package, which Debian lacks), from the published format: an 8-byte
little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, ...,
"__metadata__": {...}}, then the little-endian data.

    python3 safetensors_numpy.py read FILE        prints {name: [dtype, shape, sum, first]} as JSON
    python3 safetensors_numpy.py write FILE       writes the tensors `expected()` makes
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U8": "u1", "BOOL": "?"}


def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            out[name] = t
            continue
        begin, end = t["data_offsets"]
        if t["dtype"] == "BF16":  # numpy has no bfloat16: the high 16 bits of a float32
            raw = np.frombuffer(body[begin:end], "<u2").astype(np.uint32) << 16
            a = raw.view("<f4")
        else:
            a = np.frombuffer(body[begin:end], DTYPES[t["dtype"]])
        out[name] = (t["dtype"], a.reshape(t["shape"]))
    return out


def expected():
    return {"weights": np.arange(12, dtype="<f4").reshape(3, 4) * 0.5 - 1.0,
            "steps": np.array([1, -2, 1 << 40], dtype="<i8"),
            "scalar": np.array(2.25, dtype="<f8"),
            "flags": np.array([True, False, True], dtype="?"),
            "empty": np.zeros((0, 3), dtype="<f4")}


def write(path, tensors, metadata=None):
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    names = {v: k for k, v in DTYPES.items()}
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype.str if a.dtype.str in names else a.dtype.char],
                        "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


if __name__ == "__main__":
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "read":
        summary = {}
        for name, v in read(path).items():
            if name == "__metadata__":
                summary[name] = v
                continue
            dtype, a = v
            summary[name] = [dtype, list(a.shape), float(a.astype(np.float64).sum()),
                             float(a.reshape(-1)[0]) if a.size else None]
        print(json.dumps(summary, sort_keys=True))
    elif cmd == "write":
        write(path, expected(), {"written_by": "numpy"})
