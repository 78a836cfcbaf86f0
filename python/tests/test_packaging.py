"""`pip install python/` into a user's virtualenv: the installed package
(not the checkout's) imports, carries py.typed, and finds the native
library beside itself or at $PS_NATIVE_LIB (docs/python.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import ps
import ps._native

from conftest import timeout_scale

PYTHON_DIR = pathlib.Path(ps.__file__).resolve().parent.parent

PROBE = """
import json, pathlib, ps, ps._native
out = {"package": ps.__file__, "version": ps.__version__,
       "typed": (pathlib.Path(ps.__file__).parent / "py.typed").is_file(),
       "library": ps._native.lib()._name, "key": ps.hash_key(3, 12345)}
try:
    import ps.torch
    out["torch"] = ps.torch.Trainer.__module__
except ImportError:  # no PyTorch in this interpreter
    out["torch"] = None
print(json.dumps(out))
"""


def probe(python: pathlib.Path, cwd: pathlib.Path, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PS_NATIVE_LIB")}
    r = subprocess.run([str(python), "-c", PROBE], cwd=cwd, env={**base, **env},
                       capture_output=True, text=True, timeout=60 * timeout_scale())
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_pip_installs_the_package_into_a_virtualenv(tmp_path):
    if not (PYTHON_DIR / "pyproject.toml").is_file():
        pytest.fail(f"no pyproject.toml beside the package in {PYTHON_DIR}")
    library = pathlib.Path(ps._native.lib()._name).resolve()
    # A copy of python/ (the runfiles hold symlinks), with the library copied
    # beside the package as a wheel that carries it would have it.
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(PYTHON_DIR / "pyproject.toml", src / "pyproject.toml")
    shutil.copytree(PYTHON_DIR / "ps", src / "ps",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "libps_native.so"))
    shutil.copy(library, src / "ps" / "libps_native.so")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120 * timeout_scale())
    python = venv / "bin" / "python"
    env = {**os.environ, "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                        "--no-index", "--no-cache-dir", str(src)],
                       cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300 * timeout_scale())
    assert r.returncode == 0, r.stdout + r.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    installed = probe(python, elsewhere)
    site = pathlib.Path(installed["package"]).resolve().parent
    assert str(site).startswith(str(venv.resolve())), installed
    assert installed["version"] == ps.__version__
    assert installed["typed"]
    # Beside the installed package, with nothing set.
    assert pathlib.Path(installed["library"]).resolve() == site / "libps_native.so"
    assert installed["key"] == ps.hash_key(3, 12345)
    if importlib.util.find_spec("torch") is not None:
        assert installed["torch"] == "ps.torch.trainer"
    # $PS_NATIVE_LIB first.
    named = probe(python, elsewhere, PS_NATIVE_LIB=str(library))
    assert pathlib.Path(named["library"]).resolve() == library
    assert named["key"] == installed["key"]
