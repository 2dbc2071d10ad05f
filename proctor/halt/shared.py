"""The halts a gate honours when it is given none: its process's, and those of the backends it shares.

`proctor halt --ledger URL` / `--store URL` must stop every gate that shares that Redis ledger or run
store, not only those someone remembered to give a channel. A gate built without `halts=` therefore
honours its process's own halts (`proctor.halt.gate_halts`: the API, a signal) joined with the halts
of each backend it shares that keeps them (`proctor.halt.SharesHalts`). One channel per backend per
process (`shared_halts`): a process making many gates runs one refreshing thread per backend.
"""

from __future__ import annotations

import os
import threading
from functools import partial

from proctor.halt import (
    HaltBackend,
    HaltChannel,
    HaltListener,
    HaltsAt,
    JointHalts,
    PolledHalts,
    SharesHalts,
    gate_halts,
)
from proctor.urls import redis_halts_url, split_ledger_options

__all__ = ["REDIS_SCHEMES", "default_halts", "halts_at", "missing_store", "open_halt_backend", "open_halts",
           "shared_halts"]

_shared: dict[tuple[int, HaltsAt], PolledHalts] = {}
_shared_lock = threading.Lock()


#: URL schemes of a Redis (the halts beside a fleet's ledger); any other URL, or a path, names a run store.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def halts_at(url: str) -> HaltsAt:
    """Where `url` keeps halts: a Redis (``redis://``, ``rediss://``, ``unix://``) or a run store's table (a
    path, ``sqlite:///…``, ``postgresql://…``). The one reading of a halts URL: `proctor halt`, `serve` and
    `mcp serve` take theirs through it, and a ledger's options (``?timeout=…``) are left to the ledger."""
    if url.startswith(REDIS_SCHEMES):  # a ledger's URL as the fleet writes it: its options are not Redis's,
        target, options = split_ledger_options(url)  # but its prefix names the fleet's keys, halts among them
        return ("redis", redis_halts_url(target, options.get("prefix")))
    return ("store", url)


def missing_store(at: HaltsAt) -> str | None:
    """Why halts named `at` a SQLite store are refused: no file there (None: none is missing). Opening one would
    make a fresh store: a halt kept in it stops no gate, and a gate honouring it honours nothing the fleet sets
    (a mistyped path). A fleet's store exists already; its runs made it."""
    from proctor.backends import scheme_of
    from proctor.errors import StoreError
    from proctor.urls import sqlite_path

    kind, url = at
    if kind != "store" or scheme_of("store", url) != "sqlite":
        return None
    try:
        path = sqlite_path(url)
    except StoreError as exc:
        return str(exc)
    if os.path.exists(path):
        return None
    return (f"{url}: no run store at {path}: a halt kept there stops no gate, and a gate reading it honours none the "
            "fleet sets; name the store the fleet's runs use")


def open_halt_backend(at: HaltsAt) -> HaltBackend:
    """The halts kept `at`, to set, lift and list (`proctor halt`, the inbox). `HaltError` when they cannot be
    opened (a run store that keeps none); ImportError without the extra a Redis needs."""
    kind, url = at
    if kind == "redis":
        from proctor.halt.redis import RedisHaltBackend

        return RedisHaltBackend(url)
    from proctor.halt.sql import StoreHaltBackend

    return StoreHaltBackend(url)


def open_halts(at: HaltsAt) -> PolledHalts:
    """A channel of the caller's own on the halts kept `at` (it closes it); gates share `shared_halts`'."""
    kind, url = at
    if kind == "redis":
        from proctor.halt.redis import RedisHalts

        return RedisHalts(url)
    from proctor.halt.sql import StoreHalts

    return StoreHalts(url)


def shared_halts(at: HaltsAt, listener: HaltListener) -> HaltChannel:
    """This process's one channel on the halts kept `at` a backend, `listener` watching it (its first read
    made here; until a read succeeds it refuses every call, as every shared channel does). Once nobody
    watches it (every gate on it collected), it stops reading and is forgotten. A forked child opens its own."""
    key = (os.getpid(), at)
    with _shared_lock:  # found (or made) and watched as one: never handed out as it stops for want of watchers
        channel = _shared.get(key)
        if channel is None:
            channel = open_halts(at)
            channel.on_unwatched = partial(_forget, key)
            _shared[key] = channel
        channel.watch(listener)
        return channel


def _forget(key: tuple[int, HaltsAt], channel: PolledHalts) -> bool:
    with _shared_lock:
        if channel.watchers or _shared.get(key) is not channel:
            return False
        del _shared[key]
    channel.close()  # from its own thread: stops it, closes its connection
    return True


def default_halts(*backends: object, listener: HaltListener) -> HaltChannel:
    """What a gate given no `halts=` honours, `listener` watching it: `gate_halts`, joined with the halts of
    each of `backends` that keeps some (`SharesHalts`). Halts the gate itself sets (`Gate.halt`) stay this
    process's."""
    gate_halts.watch(listener)
    shared = list(dict.fromkeys(shared_halts(b.halts_at, listener) for b in backends if isinstance(b, SharesHalts)))
    return JointHalts(gate_halts, *shared) if shared else gate_halts
