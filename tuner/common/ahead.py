"""Work whose only product is a side effect that later work would otherwise do (a
compiled program), started in a thread so that it overlaps other work."""

from __future__ import annotations

import threading

__all__ = ["in_thread"]


def in_thread(fn, *args, **kw) -> threading.Thread:
    """``fn(*args, **kw)`` started in a thread (join it before relying on the effect).
    An error there is dropped: the later work meets it again and reports it."""
    def body():
        try:
            fn(*args, **kw)
        except Exception:  # noqa: BLE001 - reported where the work is done for real
            pass
    th = threading.Thread(target=body, name=getattr(fn, "__name__", "ahead"))
    th.start()
    return th
