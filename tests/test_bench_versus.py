"""``trio-ha bench versus-rocketmq --quick`` end to end (ASYNC_FLUSH only, to keep the suite
short): every phase has a row with figures for both sides. Figures are printed, never judged
here."""

import pytest

from trio_ha.bench.versus_rocketmq import PHASES, format_table, run_versus_benchmarks

pytestmark = pytest.mark.interop


def test_quick_versus_rocketmq_has_every_row_for_both_sides(rocketmq, tmp_path):
    rows = list(run_versus_benchmarks(str(tmp_path), quick=True, flush_types=("ASYNC_FLUSH",)))
    assert rows[0]["name"] == "versus.config"
    assert rows[0]["rocketmq"] == rocketmq.version
    by_name = {row["name"]: row for row in rows[1:]}
    assert sorted(by_name) == sorted(f"versus.{phase}.ASYNC_FLUSH" for phase in PHASES)
    for phase in PHASES:
        row = by_name[f"versus.{phase}.ASYNC_FLUSH"]
        assert row["ours"] > 0 and row["theirs"] > 0, row
        assert row["ours_errors"] == 0 and row["theirs_errors"] == 0, row
        if phase.startswith("pull"):
            # Both read at least what the timed sends stored (probes and polls add a few).
            sent = sum(by_name[f"versus.{p}.ASYNC_FLUSH"]["ours_messages"] for p in PHASES[:3])
            assert min(row["ours_messages"], row["theirs_messages"]) >= sent, row
        else:
            assert row["ours_messages"] == row["theirs_messages"], row
        for side in ("ours", "theirs"):
            assert row[f"{side}_cpu_us_per_msg"]["client"] > 0, row
            if phase.startswith("send") or phase == "batch_32":
                assert row[f"{side}_p50_us"] > 0 and row[f"{side}_p99_us"] > 0, row
                assert set(row[f"{side}_statuses"]) == {"SEND_OK"}, row
    table = format_table(rows)
    assert all(f"{phase}.ASYNC_FLUSH" in table for phase in PHASES)
