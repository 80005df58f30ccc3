"""A store written the one way it is written: one `IntentBatch` through `IntentStore.write`.

`write_now` does it from code without an event loop (a sync test): the store has no other
setter, so what a test puts in a store is what the change transaction would have saved.
"""

from __future__ import annotations

import asyncio

from control_plane.intent.store import IntentBatch, IntentStore


def write_now(store: IntentStore, batch: IntentBatch) -> None:
    asyncio.run(store.write(batch))
