"""A stand-in accelerator for machines without one: CPU tensors that say they live elsewhere.

A tensor made without ``device=`` (or drawn by a CPU ``torch.Generator``, or brought back with
``.cpu()``) meets a model on a GPU only on a GPU, and CI has none. Inside ``virtual_device()``
tensors moved to the device it returns compute on the CPU, as wrappers that report that device
(``VirtualTensor``), and every operation is checked as CUDA checks it:

* an operation that mixes a virtual tensor with a real CPU tensor of one or more dimensions
  raises ``Expected all tensors to be on the same device`` (0-dimensional CPU tensors, and
  CPU indices of an indexing operation, are allowed, as CUDA allows them);
* a random draw on the virtual device from a CPU generator raises, as on CUDA;
* ``.numpy()`` of a virtual tensor raises (a GPU tensor has to come back with ``.cpu()``).

Moves (``.to``, ``.cpu()``, ``copy_``) between the two are allowed, and a model's outputs are
the same numbers as on the CPU. The device reported is ``meta``: the one device type that needs
no compiled backend for its device guard, so that indexing and views work; it is never used for
real meta tensors here. Everything runs through Python dispatch, so it is slow: tiny models, or
a few sentences of the real ones. Move models to the device outside inference mode (as any
model is moved): under it, ``Module.to`` keeps the CPU parameters of a wrapped module.

    with virtual_device() as device:
        model.to(device)
        ...  # any tensor the code creates without following ``device`` fails loudly
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

DEVICE = torch.device("meta")
CPU = torch.device("cpu")
_aten = torch.ops.aten
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
_INDEXING = {
    _aten.index.Tensor,
    _aten.index_put.default,
    _aten.index_put_.default,
    _aten._index_put_impl_.default,
}
"""Operations whose ``indices`` may stay on the CPU (CUDA moves them)."""


class VirtualTensor(torch.Tensor):
    """A CPU tensor (``elem``) that reports ``DEVICE`` as its device."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> VirtualTensor:
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=DEVICE,
            requires_grad=elem.requires_grad,
        )
        out.elem = elem
        return out

    def __repr__(self) -> str:  # type: ignore[override]
        return f"VirtualTensor({self.elem!r})"

    def tolist(self):  # a GPU tensor's ``tolist`` copies to the host
        return self.elem.tolist()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


class DeviceMixError(RuntimeError):
    """Tensors of the virtual device met CPU tensors (or a CPU generator) in one operation."""


def _device_argument(func, args: tuple, kwargs: dict) -> tuple[int | str, object] | None:
    """``(position or "kw", value)`` of the operation's ``device`` argument, if it has one."""
    for i, argument in enumerate(func._schema.arguments):
        if argument.name != "device":
            continue
        if argument.kwarg_only or i >= len(args):
            return ("kw", kwargs["device"]) if "device" in kwargs else None
        return i, args[i]
    return None


def _run(func, args: tuple, kwargs: dict):
    virtual: list[torch.Tensor] = []
    cpu: list[torch.Tensor] = []

    def sort(x):
        if isinstance(x, VirtualTensor):
            virtual.append(x)
        elif isinstance(x, torch.Tensor) and x.device.type == DEVICE.type:
            raise RuntimeError(f"{func}: a tensor made on the device directly lost its data")
        elif isinstance(x, torch.Tensor) and x.dim() > 0:
            cpu.append(x)
        return x

    if func in _INDEXING:  # CPU indices are allowed: leave them out of the check
        tree_map(sort, (args[:1], args[2:], kwargs))
    else:
        tree_map(sort, (args, kwargs))
    found = _device_argument(func, args, kwargs)
    target = None if found is None or found[1] is None else torch.device(found[1])
    onto_virtual = target is not None and target.type == DEVICE.type
    generator = kwargs.get("generator")
    if onto_virtual and generator is not None and generator.device.type != DEVICE.type:
        raise DeviceMixError(
            f"{func}: Expected a '{DEVICE.type}' device type for generator but found "
            f"'{generator.device.type}'"
        )
    if virtual and cpu and target is None and func is not _aten.copy_.default:
        raise DeviceMixError(
            f"{func}: Expected all tensors to be on the same device, but found at least two "
            f"devices, {DEVICE} and cpu! (shapes {[tuple(t.shape) for t in cpu]} on the cpu)"
        )
    args, kwargs = list(args), dict(kwargs)
    if onto_virtual:
        if found[0] == "kw":
            kwargs["device"] = CPU
        else:
            args[found[0]] = CPU

    def unwrap(x):
        return x.elem if isinstance(x, VirtualTensor) else x

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if func is _aten.copy_.default:
        return args[0]
    wrap = onto_virtual if target is not None else bool(virtual)
    if not wrap:
        return out
    # Wrappers are made outside inference mode: a view's wrapper shares its base's version
    # counter, which an inference tensor cannot (its base may be a model's normal buffer).
    with torch.inference_mode(False):
        return tree_map(lambda x: VirtualTensor(x) if type(x) is torch.Tensor else x, out)


class _Dispatch(TorchDispatchMode):
    """Every operation, tensors of the virtual device in it or not (factories included)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _listless(index):
    """An index with its lists as CPU tensors (a list would become an index tensor made on the
    device directly, without its data)."""
    if isinstance(index, tuple):
        return tuple(_listless(i) for i in index)
    return torch.tensor(index) if isinstance(index, list) else index


class _FromData(TorchFunctionMode):
    """``torch.tensor(data, device=DEVICE)`` and its kin copy the data, which a factory on the
    device alone would not: they are built on the CPU and moved. Likewise list indices."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            args = (args[0], _listless(args[1]), *args[2:])
        device = kwargs.get("device")
        if func in _FROM_DATA and device is not None and torch.device(device).type == DEVICE.type:
            kwargs["device"] = CPU
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs).to(DEVICE)
        return func(*args, **kwargs)


@contextmanager
def virtual_device() -> Iterator[torch.device]:
    """Inside: the virtual device (see the module docstring), to move models onto."""
    with _FromData(), _Dispatch():
        yield DEVICE
