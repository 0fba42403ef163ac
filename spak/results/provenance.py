"""Provenance of a result: which commit ran, and names safe for files.

`git_commit` is the one place SPAK asks git; $SPAK_COMMIT (or a command's --commit) wins,
for trees copied to a GPU machine without their .git.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]


def slug(text) -> str:
    """A file-name-safe lower-case form: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^A-Za-z0-9]+", "-", str(text)).strip("-").lower()


def git_commit(override: Optional[str] = None) -> tuple[Optional[str], Optional[bool]]:
    """(`git rev-parse HEAD`, tracked files modified?) of the repository; (None, None)
    where there is no git (e.g. a copied tree). ``override`` (or $SPAK_COMMIT) wins."""
    override = override or os.environ.get("SPAK_COMMIT")
    if override:
        return override, None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=ROOT)
        if out.returncode != 0:
            return None, None
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=10, cwd=ROOT)
        return out.stdout.strip() or None, bool(st.stdout.strip()) if st.returncode == 0 \
            else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def commit_label() -> Optional[str]:
    """Short commit of the tree that runs, "+dirty" when tracked files differ from it (a
    device copy of a working tree reports its base commit otherwise); $SPAK_COMMIT wins."""
    commit, dirty = git_commit()
    if commit is None:
        return None
    return (commit if os.environ.get("SPAK_COMMIT") else commit[:7]) + ("+dirty" if dirty else "")


def package_version(dist: str) -> Optional[str]:
    """The installed version of a distribution, or None."""
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
