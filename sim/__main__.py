"""python -m spak.sim SCRIPT [ARGS...]   run a cuTile program on the CPU simulator
python -m spak.sim -m MODULE [ARGS...]   the same for a module (e.g. -m pytest tests/)

Interpreter mode (spak.sim.interpret), unchanged programs: `ct.launch` runs each kernel on
the simulator, `torch.cuda` presents the simulated GPU and "cuda" tensors live on the CPU
(SPAK_SIM_CUDA_AS_CPU=0 / SPAK_SIM_IS_CUDA=0 switch those parts off; SPAK_SIM_MODEL picks
sm_90, sm_120 or sm_89). Out-of-bounds tiles run as on the GPU and are summarised at exit
(SPAK_SIM_STRICT=1 raises instead). `-m pytest` loads the plugin spak.sim.pytest_plugin."""
import os
import runpy
import sys


def _on(name: str) -> bool:
    return os.environ.get(name, "1") not in ("", "0")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] == "-m" and len(argv) < 2:
        print("python -m spak.sim -m MODULE: name a module", file=sys.stderr)
        return 2
    from .interpret import enable
    enable(model=os.environ.get("SPAK_SIM_MODEL", "sm_90"),
           cuda_as_cpu=_on("SPAK_SIM_CUDA_AS_CPU"), tensor_is_cuda=_on("SPAK_SIM_IS_CUDA"),
           interpreter_summary=argv[:2] != ["-m", "pytest"],
           undetermined_padding=os.environ.get("SPAK_SIM_PADDING") or "zero")
    if argv[0] == "-m":
        module, rest = argv[1], argv[2:]
        if module == "pytest":
            import pytest
            return int(pytest.main(["-p", "spak.sim.pytest_plugin"] + rest))
        sys.argv = [module] + rest
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))   # as `python script.py`
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
