"""Reports: the accuracy–tokens plane, accuracy under token budgets, training dynamics, length
change per difficulty and length histograms, as PNG figures and one self-contained HTML page.

    from taut.lab.report import compare
    compare([Path("runs/a"), Path("runs/b")], Path("report"))     # → report/report.html
"""

from taut.lab.report.build import compare, write_report, write_run_report
from taut.lab.report.frontier import pareto_frontier

__all__ = ["compare", "pareto_frontier", "write_report", "write_run_report"]
