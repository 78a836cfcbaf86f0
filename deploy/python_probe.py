"""Prints which of the modules named on the command line do not import.

Usage: python3 -c "$(cat python_probe.py)" MODULE...

Prints the names that fail to import, space-separated, on one line (an
empty line when every one imports); exits 0 whenever the interpreter runs.
deploy/choose_python.sh runs this file's text; psnode carries the same text,
embedded at build time (deploy/launch/python_check.cc). It is run as -c
text, not as a file, so that the script's folder does not shadow a module.
Kept to what every Python 3 runs, as it probes interpreters of any age.
"""
import importlib
import sys
from typing import List


def missing_modules(names: List[str]) -> List[str]:
    """Returns the names among `names` whose import raises, in order."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # Any failure: the module is of no use.
            missing.append(name)
    return missing


print(" ".join(missing_modules(sys.argv[1:])))
