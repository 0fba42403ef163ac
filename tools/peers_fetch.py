"""Copy NVIDIA's cuTile programs into .peers/ (ignored by git, never vendored into the
package) for tools/samples_gpu.py: the single-GPU samples of NVIDIA/cutile-python and the
Python sources of NVIDIA/TileGym's package (its ops/cutile kernels and the host code they
import), each file as it is in the named commit. .peers/SOURCES.json records repo, commit
and files. For a GPU run it also packs them into .peers_pack/peers.tar.xz (carry:
[".carry", ".peers_pack"], then `tar xJf .peers_pack/peers.tar.xz` there).

    python tools/peers_fetch.py                      # from the fetch tool's mirrors
    python tools/peers_fetch.py --mirror /path/to/mirrors

A mirror is a bare git directory (the `fetch` tool's /work/.mirror/OWNER+NAME/repo).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / ".peers"
PACK = ROOT / ".peers_pack"

# (repo, folder in the repo, folder under .peers, paths to leave out: what the programs
# never import and that would only add size: other backends, Rust, C++ and tests)
SOURCES = [
    ("NVIDIA/cutile-python", "samples", "samples",
     ("samples/templates/", "samples/test_samples.py")),
    ("NVIDIA/TileGym", "src/tilegym", "tilegym",
     ("src/tilegym/ops/triton/", "src/tilegym/ops/cutile_rs/", "src/tilegym/ops/tilecpp/",
      "src/tilegym/kernel_inventory/", "src/tilegym/suites/", "src/tilegym/transformers/")),
]


def _git(gitdir: Path, *args) -> bytes:
    return subprocess.run(["git", "--git-dir", str(gitdir), *args], check=True,
                          capture_output=True).stdout


def copy_repo(mirror: Path, repo: str, folder: str, dest: str, skip) -> dict:
    gitdir = mirror / repo.replace("/", "+") / "repo"
    commit = _git(gitdir, "rev-parse", "HEAD").decode().strip()
    names = _git(gitdir, "ls-tree", "-r", "--name-only", commit, folder).decode().split("\n")
    files = [n for n in names if n.endswith(".py") and not n.startswith(tuple(skip))]
    for name in files:
        out = DEST / dest / name[len(folder) + 1:]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(_git(gitdir, "show", f"{commit}:{name}"))
    return {"repo": repo, "commit": commit, "folder": folder, "into": dest, "files": files}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirror", default="/work/.mirror", help="folder of OWNER+NAME/repo mirrors")
    args = ap.parse_args(argv)
    DEST.mkdir(exist_ok=True)
    rec = []
    for src in SOURCES:                   # a repository without a mirror here is skipped
        if not (Path(args.mirror) / src[0].replace("/", "+") / "repo").is_dir():
            print(f"{src[0]}: no mirror under {args.mirror}: skipped", file=sys.stderr)
            continue
        rec.append(copy_repo(Path(args.mirror), *src))
    (DEST / "SOURCES.json").write_text(json.dumps(rec, indent=1))
    # the copy that travels: one .tar.xz (the tree sent to a GPU machine is capped at 64 MiB)
    import tarfile
    PACK.mkdir(exist_ok=True)
    with tarfile.open(PACK / "peers.tar.xz", "w:xz") as tar:
        tar.add(DEST, arcname=".peers", filter=lambda t: None if "__pycache__" in t.name else t)
    size = (PACK / "peers.tar.xz").stat().st_size
    for r in rec:
        print(f"{r['repo']}@{r['commit'][:7]}: {len(r['files'])} files -> .peers/{r['into']}")
    print(f".peers_pack/peers.tar.xz: {size / 1e6:.2f} MB (on the GPU machine: "
          "tar xJf .peers_pack/peers.tar.xz)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
