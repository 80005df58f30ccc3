"""A rollout's state as the intent's store keeps it, and read back at a restart.

The store records of a rollout (`store.py`'s kinds): its state and the versions that failed
theirs (kind `rollout`, key `ROLLOUT_KEY`), the bytes of every version a PoP serves or a
rollback may need (kind `desired_version`, by digest: `Version.stored`, read again with
`stored_version`), each reached PoP's window before its wave (kind `rollout_before`:
`window_json`), which PoP serves which version (kind `serving`, written by the change
transaction: `change.py`). `restored` reads them back into what a restart serves (`Restored`),
`baseline` the version served when no rollout was stored. The rollout's shell
(`rollout/rollouts.py`) states them in the change that publishes each of its decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from control_plane.decide.gates import PopWindow, TierShed
from control_plane.decide.rollout import Rollout, rebase, version_of
from control_plane.decide.signals import OriginSignals
from control_plane.desired.loader import files_read, version_digest
from control_plane.desired.model import Desired
from control_plane.intent.store import (
    ROLLOUT_BEFORE_KIND,
    ROLLOUT_KIND,
    SERVING_KEY,
    SERVING_KIND,
    VERSION_KIND,
    StateCorrupted,
)

ROLLOUT_KEY = "current"
IN_FORCE = ("baking", "paused", "passed")  # phases in which the target is `to_version`


@dataclass(frozen=True)
class Version:
    """A desired-state version: the model, and the bytes it was parsed from (saved)."""

    desired: Desired
    data: bytes

    @property
    def digest(self) -> str:
        return self.desired.digest

    def stored(self) -> dict[str, Any]:
        """As the store keeps it: the bytes, and what the files it names held (by fingerprint:
        read again after they changed, the bytes still prove which version they were)."""
        files = files_read(self.desired)
        return {"source": self.desired.source, "yaml": self.data.decode("utf-8"),
                **({"files": [list(entry) for entry in files]} if files else {})}


def stored_version(digest: str, value: Mapping[str, Any],
                   parse: Callable[[bytes, str], Desired]) -> Version:
    """A version as the store holds it (`Version.stored`), parsed again: the files it names are
    read now, so its digest is not `digest` when they changed since (certificates renewed while
    Ballast was down) — accepted when the bytes, with what those files held then, make
    `digest`. ValueError when the bytes are not the version's; what `parse` raises when they no
    longer validate."""
    data = str(value["yaml"]).encode("utf-8")
    desired = parse(data, str(value["source"]))
    if desired.digest != digest:
        held = value.get("files")
        if held is not None:
            then = [(str(name), str(cert), str(key)) for name, cert, key in held]
            proven = version_digest(data, then) == digest
        else:  # stored before the files were: bytes naming files cannot prove it
            proven = bool(files_read(desired))
        if not proven:
            raise ValueError(f"version {digest[:16]}: its bytes have digest "
                             f"{desired.digest[:16]}")
    return Version(desired, data)


@dataclass(frozen=True)
class Restored:
    """What the store held of a rollout: the running intent's target and which PoP serves
    which other version, the rollout, the failed versions, the versions' bytes."""

    target: Version
    serving: dict[str, Desired]
    rollout: Rollout
    failed: dict[str, str]
    versions: dict[str, Version]
    saved: frozenset[str]  # the digests whose bytes the store holds
    before: dict[str, PopWindow]  # reached PoP -> its window before its wave (gate baseline)
    # stored digest -> the version's digest read again now: the files it names changed since
    # (certificates renewed while Ballast was down); the rollout is rebased on them
    renamed: dict[str, str] = field(default_factory=dict)


def target_of(rollout: Rollout) -> str:
    """The version the running intent's target is: `to_version` while the rollout is in
    progress or passed, `from_version` after a rollback, an abort or a supersede."""
    return rollout.to_version if rollout.phase in IN_FORCE else rollout.from_version


def serving_of(rollout: Rollout, versions: Mapping[str, Version]) -> dict[str, Desired]:
    """PoP -> the desired state it serves while that is not the target's (`version_of`)."""
    target = target_of(rollout)
    pops = {pop for digest in {rollout.from_version, rollout.to_version} if digest in versions
            for pop in versions[digest].desired.pop_names}
    serving: dict[str, Desired] = {}
    for pop in sorted(pops):
        digest = version_of(rollout, pop)
        if digest != target and pop in versions[digest].desired.pop_names:
            serving[pop] = versions[digest].desired
    return serving


def restored(records: Mapping[str, Mapping[str, Any]], known: Mapping[str, Version],
             parse: Callable[[bytes, str], Desired], where: str, now_ms: int = 0
             ) -> Restored | None:
    """The rollout the store held (`records`: kind -> key -> JSON), with its versions parsed
    again (`parse(bytes, source)`; a version in `known` — the file's, those held already — is
    that same object); None when it held none. A version whose files changed since it was
    stored (`stored_version`) is the version they make now: the rollout is rebased on it at
    `now_ms` (`decide/rollout.py`, `rebase`). StateCorrupted (naming `where`) when it does not
    parse."""
    held = records.get(ROLLOUT_KIND, {}).get(ROLLOUT_KEY)
    if held is None:
        return None
    renamed: dict[str, str] = {}
    try:
        rollout = Rollout.from_dict(held["rollout"])
        failed = {str(k): str(v) for k, v in dict(held.get("failed", {})).items()}
        versions = dict(known)
        for digest, value in records.get(VERSION_KIND, {}).items():
            if digest in versions:
                continue
            version = stored_version(digest, value, parse)
            if version.digest != digest:
                renamed[digest] = version.digest
            versions.setdefault(version.digest, version)
    except (KeyError, TypeError, ValueError) as err:
        raise StateCorrupted(f"{where}: rollout: {type(err).__name__}: {err}") from err
    except Exception as err:  # a stored version that no longer validates (DesiredStateError)
        raise StateCorrupted(f"{where}: a desired-state version of the rollout does not "
                             f"parse: {err}") from err
    rollout = rebase(rollout, renamed, now_ms)
    missing = {rollout.from_version, rollout.to_version} - set(versions)
    if target_of(rollout) in missing or (rollout.in_progress and missing):
        raise StateCorrupted(f"{where}: rollout: the bytes of version(s) "
                             f"{', '.join(sorted(d[:16] for d in missing))} are not stored")
    try:
        before = {str(pop): window_from_json(str(pop), value)
                  for pop, value in records.get(ROLLOUT_BEFORE_KIND, {}).items()}
    except (KeyError, TypeError, ValueError) as err:
        raise StateCorrupted(f"{where}: rollout baseline: {type(err).__name__}: {err}") from err
    needed = {d: v for d, v in versions.items()
              if d in (rollout.from_version, rollout.to_version)}
    # which PoP serves which version, as the change that saved the rollout stated it
    held_serving = records.get(SERVING_KIND, {}).get(SERVING_KEY) or {}
    if not isinstance(held_serving, dict) or {
            renamed.get(str(digest), str(digest)) for digest in held_serving.values()} - set(
            needed):
        raise StateCorrupted(f"{where}: serving: {held_serving!r} names versions the rollout "
                             "does not hold")
    serving = {str(pop): needed[renamed.get(str(digest), str(digest))].desired
               for pop, digest in held_serving.items()}
    serving = {pop: desired for pop, desired in serving.items()
               if desired.digest != target_of(rollout)}
    return Restored(versions[target_of(rollout)], serving, rollout,
                    failed, needed, frozenset(records.get(VERSION_KIND, {})),
                    before if rollout.in_progress else {}, renamed)


def baseline(records: Mapping[str, Mapping[str, Any]], digest: str | None,
             known: Mapping[str, Version], parse: Callable[[bytes, str], Desired], where: str
             ) -> Version | None:
    """With no rollout stored, the version the store says was served (`digest`) from the bytes
    it kept of it (`Rollouts.settle`): a restart serves it, and a file edited while Ballast was
    down rolls out from it. None when it kept none (a new state, or one saved before the bytes
    were). Read again with the files it names now (`stored_version`). StateCorrupted (naming
    `where`) when the bytes are not that version's or no longer parse."""
    if digest is None:
        return None
    if digest in known:
        return known[digest]
    value = records.get(VERSION_KIND, {}).get(digest)
    if value is None:
        return None
    try:
        return stored_version(digest, value, parse)
    except (KeyError, TypeError, ValueError) as err:
        raise StateCorrupted(f"{where}: desired-state version {digest[:16]}: "
                             f"{type(err).__name__}: {err}") from err
    except Exception as err:  # bytes that no longer validate (DesiredStateError)
        raise StateCorrupted(f"{where}: the desired-state version served before the stop "
                             f"({digest[:16]}) does not parse: {err}") from err


def window_json(window: PopWindow) -> dict[str, Any]:
    """A PoP's window as the store keeps it (a rollout's baseline)."""
    return {"origins": [[group, origin, asdict(signals)]
                        for group, origin, signals in window.origins],
            "tiers": [[group, tier, shed.requests, shed.shed]
                      for group, tier, shed in window.tiers],
            "tier_action_onsets": window.tier_action_onsets}


def window_from_json(pop: str, data: Mapping[str, Any]) -> PopWindow:
    """`window_json` read back; ValueError (KeyError, TypeError) when it is not one."""
    known = {f.name for f in fields(OriginSignals)}
    origins = []
    for group, origin, values in data["origins"]:
        if not isinstance(values, dict) or set(values) - known:
            raise ValueError(f"origin {origin!r}: not the signals of an origin")
        origins.append((str(group), str(origin), OriginSignals(**values)))
    tiers = tuple((str(group), str(tier), TierShed(int(requests), int(shed)))
                  for group, tier, requests, shed in data["tiers"])
    return PopWindow(pop, tuple(origins), tiers, int(data["tier_action_onsets"]))
