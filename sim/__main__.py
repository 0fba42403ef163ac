"""python -m spak.sim SCRIPT [ARGS...]: run a cuTile program with `ct.launch` on the CPU
simulator (interpreter mode, spak.sim.interpret), unchanged."""
import runpy
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    from .interpret import enable
    enable()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
