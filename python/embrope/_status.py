"""DeferredStatus: bad ids and positions kept until the caller checks."""

from __future__ import annotations

import sys
from typing import Any, Optional

from . import _arrays
from . import _embrope as _C


class DeferredStatus:
    """Where ops report bad ids and positions instead of raising at once.

    An op that finds an id outside its table or a position outside the cos/sin table
    zero-fills the affected rows, writes every other row and records the first offending
    row. Without a status the op then raises :class:`BadIndexError` (on a GPU that costs one
    stream synchronisation). With ``deferred=status`` it returns without waiting, which is
    what CUDA-graph capture and asynchronous pipelines need, and :meth:`check` raises later.

    Parameters
    ----------
    device : str, torch.device or int, default "cpu"
        The device of the ops that report to it ("cpu", "cuda", "cuda:1"); "cuda" is the
        current device (``torch.cuda.set_device``'s), as in PyTorch.

    Notes
    -----
    Not thread-safe: give each thread (and each CUDA stream) its own status, or order the
    calls that share one.
    """

    def __init__(self, device: Any = "cpu") -> None:
        self._native = _C.DeferredStatus(*_arrays.parse_device(device))

    @property
    def device(self) -> str:
        return _arrays.device_name(self._native.device)

    def check(self, stream: Any = None) -> None:
        """Raise :class:`BadIndexError` if a bad row was recorded since the last check, then
        clear the record. On a GPU, synchronises `stream` first (default: PyTorch's current
        stream on the status's device once PyTorch has initialised CUDA, the stream
        ``embrope.torch``'s ops ran on; else the legacy stream)."""
        self._native.check(self._stream(stream))

    def ok(self, stream: Any = None) -> bool:
        """True when nothing has been recorded (synchronises like :meth:`check`)."""
        return self._native.ok(self._stream(stream))

    def _stream(self, stream: Any) -> int:
        if stream is not None:
            return _arrays.stream_handle(stream)
        kind, index = self._native.device
        torch = sys.modules.get("torch")
        if kind == 1 and torch is not None and torch.cuda.is_initialized():
            # Under `with torch.cuda.stream(s)` the torch ops ran on s, which PyTorch creates
            # non-blocking: a wait on the legacy stream would not wait for them, and the
            # check would read the record before their kernels wrote it.
            return int(torch.cuda.current_stream(index).cuda_stream)
        return 0

    def __repr__(self) -> str:
        return f"DeferredStatus(device={self.device!r})"


def native(status: Optional[DeferredStatus]) -> Optional[Any]:
    if status is None:
        return None
    if not isinstance(status, DeferredStatus):
        raise TypeError(f"deferred must be an embrope.DeferredStatus, not {type(status).__name__}")
    return status._native
