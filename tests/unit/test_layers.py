"""The import contracts (pyproject.toml, tool.importlinter) hold: the layers, which fail
on an upward import, and no circle inside a package, which fails on a function-level
import that closes one; and a config is validated without importing Spark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(source_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_the_package_keeps_its_layers() -> None:
    result = _lint(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def _lint_with_job_imported_in(tmp_path: Path, module: str) -> str:
    """lint-imports' report on a copy of the package where ``module`` (a path under
    eventpipe/) imports the batch job inside a function, as the lazy imports of the code
    base do: seen all the same."""
    shutil.copytree(ROOT / "src" / "eventpipe", tmp_path / "eventpipe")
    path = tmp_path / "eventpipe" / module
    path.write_text(
        path.read_text()
        + textwrap.dedent("""

        def _reaching() -> None:
            from eventpipe.processing.batch import job  # noqa: F401
    """)
    )
    result = _lint(tmp_path)
    assert result.returncode != 0
    return result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    report = _lint_with_job_imported_in(tmp_path, "errors.py")
    assert "eventpipe.errors -> eventpipe.processing.batch.job" in report


def test_an_import_that_closes_a_circle_breaks_the_contract(tmp_path: Path) -> None:
    # What a run shares reaching up to the job, which imports it: a loop inside one
    # layer, which the layers contracts cannot see.
    report = _lint_with_job_imported_in(tmp_path, "processing/batch/run.py")
    assert "No cycles are allowed in eventpipe.processing.batch" in report
    assert "eventpipe imports only downward KEPT" in report
    assert "the pipeline's parts import only downward KEPT" in report


def test_validating_a_config_imports_no_spark(tmp_path: Path) -> None:
    config = tmp_path / "eventpipe.yaml"
    config.write_text(
        textwrap.dedent("""
        destinations:
          warehouse:
            type: duckdb
            enrichment: [{name: ip_lookup, from: /ip, to: /geo}]
            mappings:
              fields:
                - {action: cast, src: /a/b, type: "numeric(38,0)"}
                - {action: move, src: /c, dst: /d}
    """)
    )
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from eventpipe.config import load_config
        load_config(Path({str(config)!r}))
        assert "pyspark" not in sys.modules, sorted(m for m in sys.modules if "spark" in m)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
