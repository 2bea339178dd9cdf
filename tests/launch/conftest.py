"""Set-up the sweep tests share (tests/launch and tests/slurm)."""

from pathlib import Path


def summary_rows(sweep: Path) -> dict[str, str]:
    """job -> its summary line."""
    lines = (sweep / "sweep_summary.md").read_text().splitlines()
    return {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ") and "---" not in line
            and not line.startswith("| job ")}
