"""A GGUF file's metadata and tensors, read straight from its bytes.

The gguf package's reader wraps every metadata string in numpy objects of its own: the demo file's tokenizer
(49152 tokens and 48900 merges) took it 5 s to list, most of a start-up. Here the metadata is unpacked with
struct into plain Python values (0.1 s), and each tensor's data is a view of one memory map, shaped as the gguf
package shapes it for its dequantize (a quantized tensor's rows as bytes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# value type -> struct format of a scalar (little-endian)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}
# tensor types stored as plain values, and their numpy dtypes; the others are quantized blocks (bytes)
_PLAIN_TENSORS = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                  "I32": np.int32, "I64": np.int64}


@dataclass
class GGUFTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray


@dataclass
class GGUFFile:
    fields: dict[str, Any]  # metadata key -> its value (a number, bool, str, or list of them)
    tensors: list[GGUFTensor]


def read_gguf(path: str) -> GGUFFile:
    """The file's metadata and tensors; ValueError (or struct.error) names what does not parse."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, mode="r")
    cursor = _Cursor(memoryview(data))
    if cursor.take(4) != GGUF_MAGIC:
        raise ValueError("no GGUF magic at the start")
    version = cursor.scalar(4)
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} (big-endian, or unsupported): versions {VERSIONS} are read")
    tensor_count, kv_count = cursor.scalar(10), cursor.scalar(10)
    fields = {}
    for _ in range(kv_count):
        key = cursor.string()
        fields[key] = cursor.value(cursor.scalar(4))
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = [cursor.scalar(10) for _ in range(cursor.scalar(4))]
        infos.append((name, dims, GGMLQuantizationType(cursor.scalar(4)), cursor.scalar(10)))
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment!r} is not a power of two")
    start = -(-cursor.offset // alignment) * alignment
    tensors, names = [], set()
    for name, dims, kind, offset in infos:
        if name in names:
            raise ValueError(f"tensor {name!r} appears twice")
        names.add(name)
        shape = tuple(reversed(dims))
        elements = int(np.prod(dims))
        block, block_bytes = GGML_QUANT_SIZES[kind]
        if kind.name in _PLAIN_TENSORS:
            dtype, count = np.dtype(_PLAIN_TENSORS[kind.name]), elements
        else:
            if shape[-1] % block:
                raise ValueError(f"tensor {name!r}: rows of {shape[-1]} are not whole {kind.name} blocks")
            dtype, count = np.dtype(np.uint8), elements * block_bytes // block
            shape = (*shape[:-1], shape[-1] // block * block_bytes)
        at = start + offset
        if at + count * dtype.itemsize > len(data):
            raise ValueError(f"tensor {name!r} runs past the end of the file (truncated?)")
        tensors.append(GGUFTensor(name, kind, np.frombuffer(data, dtype, count, at).reshape(shape)))
    return GGUFFile(fields, tensors)


class _Cursor:
    """Reads little-endian values from a buffer, moving past each."""

    def __init__(self, buffer: memoryview):
        self.buffer = buffer
        self.offset = 0

    def take(self, size: int) -> bytes:
        if self.offset + size > len(self.buffer):
            raise ValueError("the metadata runs past the end of the file (truncated?)")
        out = bytes(self.buffer[self.offset : self.offset + size])
        self.offset += size
        return out

    def scalar(self, kind: int):
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {kind}")
        (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        return self.take(self.scalar(10)).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            return self.scalar(kind)
        item, count = self.scalar(4), self.scalar(10)
        if item == _STRING:
            return [self.string() for _ in range(count)]
        if item == _ARRAY:
            return [self.value(_ARRAY) for _ in range(count)]  # each inner array names its own type and count
        if item not in _NUMPY:
            raise ValueError(f"unknown GGUF value type {item}")
        dtype = np.dtype(_NUMPY[item])
        return np.frombuffer(self.take(count * dtype.itemsize), dtype).tolist()
