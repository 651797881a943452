"""Importing taut, or the integrations package, imports no engine: TRL and verl are optional extras."""

import subprocess
import sys


def test_importing_taut_integrations_imports_no_engine():
    code = ("import sys, taut, taut.integrations, taut.integrations.common; "
            "print(sorted(m for m in ('trl', 'verl', 'accelerate', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
