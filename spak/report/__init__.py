"""`spak report`'s work: results files into markdown tables, figures, the leaderboard and
the regression gate, each row through its kernel family.

    load         rows of `spak sweep` / `spak run` in one shape; sections per family
    tables       report.md
    plots        the throughput bars and the tile heatmaps (matplotlib)
    leaderboard  results/leaderboard.json: the best figure per shape
    regress      `--check`: the results against the leaderboard

The command itself is spak/cli/report.py.
"""
