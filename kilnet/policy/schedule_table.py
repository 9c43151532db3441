"""The schedule override table: its keys (``shaped_key``), where a device's table lives
(``table_path``, ``tuned_table_path``), and reading, checking and writing it as JSON. What an
entry may set per family is ``schedule.TUNABLE``; how an entry is laid over the policy is
``schedule.choose``."""
import json
import os
import re
from dataclasses import fields

from ..errors import CompileError, is_whole
from ..files import write_text
from .launch import Schedule


def shaped_key(name, ctype, shape):
    """The table key of a launch or kernel family ``name`` at one shape: the sizes the family's
    policy reads (a model compiled at another batch has other sizes, so another key), e.g.
    ``gemm_vec@float:K=1216,M=64,N=1000,batch=1,kvec=1``, which ``kilnet tune`` writes (a
    family at a shape: renaming a launch does not orphan it), or
    ``dense_1.forward@float:...`` (one launch at that shape, written by hand)."""
    sizes = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in sorted(shape.items()))
    return f"{name}@{ctype}:{sizes}"


def device_key(target, driver=True):
    """The file stem of a device's table: implementation, device name and (``driver``) driver
    version, e.g. ``intel-amd-epyc-2026-22-10-0-01-160000``; a tuned table is only trusted on the
    driver that measured it."""
    parts = [target.implementation, target.name] + ([target.driver] if driver else [])
    name = re.sub(r"[^a-z0-9]+", "-", " ".join(parts).lower()).strip("-")
    return name or "unknown"


def table_path(target, settings):
    """The override table that applies to ``target``: ``KILNET_SCHEDULES`` if set (in
    ``settings``), else the first of ``<cache dir>/schedules/<device key>.json`` with and without
    the driver version that exists, else None."""
    if settings.schedules:
        return settings.schedules
    for key in dict.fromkeys((device_key(target), device_key(target, driver=False))):
        path = os.path.join(settings.cache, "schedules", key + ".json")
        if os.path.exists(path):
            return path
    return None


def tuned_table_path(target, settings):
    """Where ``kilnet tune`` writes ``target``'s table: ``KILNET_SCHEDULES`` if set (in
    ``settings``), else ``<cache dir>/schedules/<device key with driver>.json``."""
    return settings.schedules or os.path.join(settings.cache, "schedules",
                                              device_key(target) + ".json")


def write_table(path, entries, drop=()):
    """Merge ``entries`` ({key: raw entry}) into the table at ``path`` (created if missing),
    removing the keys in ``drop``, and replace the file in one step (``files.write_text``), so a
    reader never sees half a table and a failure leaves the old one. Returns the merged raw
    table."""
    table = {}
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                table = json.load(f)
        except (OSError, ValueError) as e:
            raise CompileError(f"schedule table {path}: cannot be read to merge into ({e}); "
                               f"fix or remove it") from None
        parse_table(table, path)
    for key in drop:
        table.pop(key, None)
    table.update(entries)
    parse_table(table, "the merged schedule table")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_text(path, json.dumps(table, indent=1, sort_keys=True) + "\n")
    return table


def load_table(path):
    """{launch name or family: Schedule} from a JSON file, validated entry by entry."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise CompileError(f"schedule table {path}: {e}") from None
    return parse_table(raw, path)


def parse_table(raw, source="schedule table"):
    """{key: Schedule} from a raw table (JSON's objects), each field checked; a CompileError
    names ``source``, the entry and the field."""
    if not isinstance(raw, dict):
        raise CompileError(f"{source}: must be an object of launch name -> schedule")
    known = {f.name for f in fields(Schedule)}
    table = {}
    for key, entry in raw.items():
        if not isinstance(entry, dict):
            raise CompileError(f"{source}: entry {key!r} must be an object, got {entry!r}")
        values = {}
        for field, v in entry.items():
            where = f"{source}: entry {key!r}, field {field!r}"
            if field not in known:
                raise CompileError(f"{where} is unknown (known: {', '.join(sorted(known))})")
            if field in ("vector", "split", "sliced", "depth", "rows"):
                if not is_whole(v):
                    raise CompileError(f"{where} must be an int >= 1, got {v!r}")
            elif field in ("pack", "cache"):
                if not isinstance(v, bool):
                    raise CompileError(f"{where} must be true or false, got {v!r}")
            else:
                sizes = {"tiles": 4, "block": 2}.get(field)
                ok = isinstance(v, list) and v and all(is_whole(n) for n in v) \
                    and (sizes is None or len(v) == sizes) and len(v) <= 3 + (field == "tiles")
                if not ok:
                    want = f"{sizes} ints >= 1" if sizes else "1 to 3 ints >= 1"
                    raise CompileError(f"{where} must be a list of {want}, got {v!r}")
                v = tuple(v)
            values[field] = v
        table[key] = Schedule(**values)
    return table
