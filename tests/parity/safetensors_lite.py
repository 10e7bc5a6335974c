"""A tiny safetensors reader and writer for the PyTorch twins of the tests.

CI's Python is Debian's python3 with python3-torch and numpy only (no safetensors package), so
the twins read and write weight files with this: struct and json for the format, torch for the
tensors. It reads and writes the dtypes torch 1.13 has: F64, F32, F16, BF16, I64, I32, I16, I8, U8
and BOOL. Layout as in
https://github.com/huggingface/safetensors: a little-endian u64 header length, a JSON header
{name: {dtype, shape, data_offsets}, "__metadata__": {str: str}} padded with spaces to a
multiple of 8 bytes, then the tensors' bytes back to back.
"""

import json
import struct

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
# numpy has no bfloat16: its bytes go through an integer view of the same width.
_SAME_WIDTH_INTEGER = {torch.bfloat16: torch.int16}
_MAX_HEADER_BYTES = 100_000_000


def _fail(path, problem):
    raise ValueError("safetensors file %s %s" % (path, problem))


def load_with_metadata(path):
    """Returns ({name: tensor}, metadata) for a safetensors file; ValueError names the file."""
    with open(path, "rb") as file:
        raw = file.read()
    if len(raw) < 8:
        _fail(path, "is truncated: it has no 8-byte header length")
    (header_length,) = struct.unpack("<Q", raw[:8])
    if header_length > _MAX_HEADER_BYTES or 8 + header_length > len(raw):
        _fail(path, "is corrupt: its header length %d does not fit the file" % header_length)
    header = json.loads(raw[8 : 8 + header_length])
    metadata = header.pop("__metadata__", {})
    data = memoryview(raw)[8 + header_length :]
    tensors, covered = {}, 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        begin, end = entry["data_offsets"]
        if begin != covered or end > len(data):
            _fail(path, "is corrupt: tensor %r has data_offsets %r" % (name, entry["data_offsets"]))
        covered = end
        if entry["dtype"] not in _DTYPES:
            _fail(path, "holds tensor %r of unsupported dtype %s" % (name, entry["dtype"]))
        dtype = _DTYPES[entry["dtype"]]
        shape = entry["shape"]
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        # bytearray: torch.frombuffer wants a writable buffer; the copy also frees `raw`.
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        if flat.numel() != _count(shape):
            _fail(path, "is corrupt: tensor %r has %d bytes for shape %r" % (name, end - begin, shape))
        tensors[name] = flat.reshape(shape)
    if covered != len(data):
        _fail(path, "is corrupt: %d bytes follow the last tensor" % (len(data) - covered))
    return tensors, metadata


def load(path):
    """Returns {name: tensor} for a safetensors file."""
    return load_with_metadata(path)[0]


def save(path, tensors, metadata=None):
    """Writes {name: tensor} (any device, any strides) in name order, as safetensors does."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(key): str(value) for key, value in metadata.items()}
    chunks, offset = [], 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        if tensor.dtype not in _NAMES:
            raise ValueError("cannot save tensor %r of dtype %s to %s" % (name, tensor.dtype, path))
        view = tensor.view(_SAME_WIDTH_INTEGER.get(tensor.dtype, tensor.dtype))
        chunk = view.numpy().tobytes()
        header[name] = {
            "dtype": _NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(chunk)],
        }
        chunks.append(chunk)
        offset += len(chunk)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)))
        file.write(text)
        for chunk in chunks:
            file.write(chunk)


def _count(shape):
    count = 1
    for dim in shape:
        count *= dim
    return count
