"""safetensors read and written with numpy alone (Debian has no safetensors package): an
8-byte little-endian header length, a JSON header {name: {"dtype", "shape",
"data_offsets"}, "__metadata__": {...}}, then the tensors' little-endian bytes. `load`
checks the offsets as anvil's C++ reader does (core/safetensors.hpp) and names the tensor
at fault."""

import json
import struct

import numpy as np

_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U8": "u1", "BOOL": "?"}
_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items()}


class FormatError(ValueError):
    """A damaged or foreign safetensors file, naming the file and the tensor."""


def load(path):
    """(tensors, metadata): {name: numpy array (float32 for BF16)} in file order, and the
    metadata's strings."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise FormatError(f"{path}: truncated: {len(data)} bytes, no header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise FormatError(f"{path}: the header length says {n} bytes; the file has {len(data) - 8} after it")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: the header is not JSON ({e})") from None
    body = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors, spans = {}, []
    for name, t in header.items():
        dtype = t.get("dtype")
        begin, end = t.get("data_offsets", (None, None))
        shape = t.get("shape")
        if dtype not in _DTYPES and dtype != "BF16":
            raise FormatError(f"{path}: tensor '{name}': dtype {dtype} is not one anvil reads")
        size = 2 if dtype == "BF16" else np.dtype(_DTYPES[dtype]).itemsize
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(body)):
            raise FormatError(f"{path}: tensor '{name}': data_offsets {begin, end} lie outside the {len(body)} bytes")
        if end - begin != count * size:
            raise FormatError(f"{path}: tensor '{name}': data_offsets span {end - begin} bytes; its shape needs "
                              f"{count * size}")
        raw = body[begin:end]
        if dtype == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view("<f4")
        else:
            a = np.frombuffer(raw, _DTYPES[dtype])
        tensors[name] = a.reshape(shape).copy()
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise FormatError(f"{path}: tensor '{name}': misaligned offsets: its data starts at byte {begin}, not {at} (a gap or overlap)")
        at = end
    if at != len(body):
        raise FormatError(f"{path}: {len(body) - at} bytes of data after the last tensor's")
    return tensors, metadata


def save(path, tensors, metadata=None):
    """Writes {name: numpy array} and string metadata (the data 8-byte aligned)."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype.str not in _NAMES and a.dtype != np.bool_:
            raise FormatError(f"{path}: tensor '{name}': dtype {a.dtype} has no safetensors name here")
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": "BOOL" if a.dtype == np.bool_ else _NAMES[a.dtype.str], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
