"""Plans: the engineering recipe as data, and `spak plan`, which carries one out.

    model       the validated plan: Plan, Step (with its kernel family), SweepSpace, ...
    fields      FieldChecker: typed field checks that collect every problem
    steps       the [[steps]] tables validated through each step's kernel family
    schema      load_plan / parse_plan: a plan file read and validated (PlanError)
    gates       gate rows, statuses, GateBook
    cpu_gates   the CPU gates: prototype, simulator vs float64, checker, compiles
    gpu_gates   the GPU gates on `spak run` / `spak sweep` rows
    machine     the machine and GPU a plan runs on (or that recorded its results)
    runner      PlanRunner: both loops, in order, into one report document
    render      report.md and report.json

The command itself is spak/cli/plan.py.
"""
