"""Start-up objects frozen out of collections; what the loop creates afterwards is still collected."""

from __future__ import annotations

import gc
import weakref

from telescope.system.garbage_collection import freeze_startup_objects, thaw_startup_objects


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_freezes_what_lives_and_still_collects_later_garbage() -> None:
    kept = Node()
    try:
        frozen = freeze_startup_objects("test")
        assert frozen > 0 and gc.get_freeze_count() > 0  # (it shrinks as frozen objects are freed by refcount)
        assert not any(o is kept for o in gc.get_objects())  # frozen: in no generation a collection walks
        later = cycle()  # garbage made after the freeze: a full collection still finds it
        assert later() is not None
        gc.collect()
        assert later() is None
    finally:
        thaw_startup_objects()
    assert gc.get_freeze_count() == 0 and any(o is kept for o in gc.get_objects())
