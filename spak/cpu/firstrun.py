"""The simulator's first-run message (issue 20).

The simulator's hot loops are numba functions cached on disk (``cache=True``, in numba's own
cache directory for spak/sim: ``sim/__pycache__`` when it is writable). The first ``spak sim``
after an install or an edit of spak/sim compiles them: ~10-20 s with no output, which looks
like a hang. ``announce()`` prints one line on stderr before that happens, and only then.

"Cold" is decided honestly, from what is on disk: a marker file that ``mark_warm()`` writes
into numba's cache directory after a simulation has finished there, holding the numba and
Python versions, a hash of every spak/sim source file (numba's own cache key is the source
file's content) and the cache index files that existed then. The cache is cold when the
marker is missing or unreadable, when any of those changed, or when an index file it lists
is gone (a cleared cache). With caching switched off (SPAK_NUMBA_CACHE=0) every run compiles.
numba compiles per function and signature, on first use: a later run that needs builds the
first did not (bf16 after fp16 only, the parallel builds of problems past 2^18 elements)
still compiles those without a word; they are seconds, not the first run's ~20 s.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Optional, TextIO

MARKER = "spak-numba-warm.json"
# Measured on the 2-core CPU box: one small case 5.7 s cold, 1.3 s warm; the default set
# ~22 s cold, ~3 s warm (issue 20).
MESSAGE = ("spak: compiling the simulator's numba kernels (once; cached afterwards in {dir}): "
           "this first run takes seconds longer, ~20 s for the default set on 2 cores")
MESSAGE_NO_CACHE = ("spak: compiling the simulator's numba kernels (SPAK_NUMBA_CACHE=0: not "
                    "cached, every run compiles them: seconds, ~20 s for the default set)")


def sim_dir() -> Optional[Path]:
    """The installed spak.sim package folder (found without importing it: importing it
    already compiles its eagerly typed numba functions)."""
    spec = importlib.util.find_spec("spak.sim")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def caching_enabled() -> bool:
    """The simulator's own switch (sim/numerics.py reads the same variable)."""
    return os.environ.get("SPAK_NUMBA_CACHE", "1") != "0"


def cache_dir() -> Optional[Path]:
    """Where numba caches spak.sim's functions: numba's own locators, asked in numba's order
    (NUMBA_CACHE_DIR, the package's __pycache__, the user-wide cache), for spak/sim."""
    folder = sim_dir()
    if folder is None:
        return None
    try:
        from numba.core.caching import CacheImpl
    except ImportError:
        return None
    source = str(folder / "numerics.py")

    def probe():          # numba's locators read only the function's first line number
        pass
    for locator in CacheImpl._locator_classes:
        try:
            found = locator.from_function(probe, source)
        except Exception:  # noqa: BLE001 -- a locator that does not apply
            found = None
        if found is not None:
            return Path(found.get_cache_path())
    return None


def fingerprint(folder: Optional[Path] = None) -> dict:
    """What the cached machine code depends on: numba, Python, and the spak/sim sources
    that use numba."""
    import numba
    folder = folder or sim_dir()
    sources = {}
    for path in sorted(folder.glob("*.py")) if folder else ():
        data = path.read_bytes()
        if b"numba" in data:       # only files that define numba functions key the cache
            sources[path.name] = hashlib.sha256(data).hexdigest()
    return {"numba": numba.__version__, "python": sys.implementation.cache_tag,
            "sources": sources}


def is_cold(directory: Optional[Path] = None) -> bool:
    """True when the next simulation will compile the numba kernels (see the module doc)."""
    try:
        import numba
    except ImportError:
        return False                          # no numba: the simulator cannot run at all
    if getattr(numba.config, "DISABLE_JIT", False):
        return False                          # pure Python: nothing is compiled
    if not caching_enabled():
        return True
    directory = directory or cache_dir()
    if directory is None:
        return True
    try:
        marker = json.loads((directory / MARKER).read_text())
        if marker["fingerprint"] != fingerprint():
            return True
        return not all((directory / name).is_file() for name in marker["index_files"])
    except (OSError, ValueError, KeyError, TypeError):
        return True


def announce(stream: Optional[TextIO] = None) -> bool:
    """Print the first-run line on ``stream`` (stderr) when the cache is cold; return
    whether it was cold (the caller then calls mark_warm() after a finished simulation)."""
    cold = is_cold()
    if cold:
        text = (MESSAGE.format(dir=cache_dir()) if caching_enabled() else MESSAGE_NO_CACHE)
        print(text, file=stream or sys.stderr, flush=True)
    return cold


def simulator_ran() -> bool:
    """Whether this process has run the simulator's numba loads/stores (every tile kernel
    loads and stores): only then are they compiled or loaded, and so on disk. A `spak sim`
    driven by a stand-in runner (tests) leaves the cache as it was and marks nothing."""
    from numba.core.dispatcher import Dispatcher
    memory = sys.modules.get("spak.sim.memory")
    return memory is not None and any(
        isinstance(obj, Dispatcher) and obj.signatures for obj in vars(memory).values())


def mark_warm(directory: Optional[Path] = None) -> bool:
    """Record that numba's cache for spak.sim is filled (call after a simulation finished
    in this process). Best effort: an unwritable cache directory only means the message
    shows again."""
    if not caching_enabled() or not simulator_ran():
        return False
    directory = directory or cache_dir()
    if directory is None:
        return False
    try:
        index = sorted(p.name for p in directory.glob("*.nbi"))
        doc = {"fingerprint": fingerprint(), "index_files": index}
        tmp = directory / f".{MARKER}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, directory / MARKER)
        return True
    except OSError:
        return False
