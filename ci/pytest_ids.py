"""Run pytest on the node ids listed in a file (one a line; ids may hold spaces, which a
shell command line would split): python ci/pytest_ids.py IDS_FILE [pytest args...].
Used by ci/tilegym.sh (TileGym's tests under the simulator) and .gpujobs/i37.sh."""
import sys

import pytest


def main(argv) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        ids = [line.strip() for line in f if "::" in line]
    return int(pytest.main(list(argv[1:]) + ids))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
