"""A policy loss with a new parameter, from a module outside the package, through the real entry point."""

from pathlib import Path

import pytest

from logicrl.config.phases import ARR
from tests.conftest import TINY_RUN, read_metrics, run_main, tail

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kk_role")]
USER_LOSS = Path(__file__).with_name("user_loss.py")
GROUP = f"{ARR}.actor.policy_loss"


def test_a_users_loss_trains_with_its_own_parameter(kk_role, tmp_path):
    run_dir = tmp_path / "run"
    result = run_main(*kk_role, *TINY_RUN, f"{GROUP}.module={USER_LOSS}", f"{GROUP}.loss_mode=offset_pg",
                      f"+{GROUP}.loss_offset=0.375", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    rows = read_metrics(run_dir)
    # offset_pg's token loss is -A log pi's zero value plus the offset: the mean is the offset itself.
    assert [row["actor/pg_loss"] for row in rows] == pytest.approx([0.375, 0.375], abs=1e-6)
    assert all(row["actor/grad_norm"] >= 0 for row in rows)
