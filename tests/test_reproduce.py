"""`benchmarks/reproduce.py --quick`: one cell of every claims script, on the tasks' tiny twins, made afresh and compared
with the committed reference (results/reproduce_quick.json) within the tolerance written beside it."""
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


@pytest.mark.xdist_group("reproduce")
def test_every_cell_of_the_quick_reproduction_matches_its_committed_reference(capsys):
    import reproduce
    threads = torch.get_num_threads()
    try:
        rc = reproduce.main(["--quick", "--workers", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    import common
    assert common.STORE == common.RECORDED      # the benchmarks' store again: a later test's records go where they belong
    ref = json.loads((BENCH / "results" / "reproduce_quick.json").read_text())["want"]
    assert len(ref) >= 9 and all(f"| {c.replace(' | ', ' / ').replace('|', '/')} |" in out for c in ref), out
    assert rc == 0 and "**no**" not in out, out


def test_a_cell_outside_its_tolerance_fails_the_check(tmp_path, monkeypatch, capsys):
    """The comparison can fail: a reference moved by more than the tolerance is reported and the check exits 1."""
    import reproduce
    real = json.loads((BENCH / "results" / "reproduce_quick.json").read_text())
    first = next(iter(real["want"]))
    moved = {**real, "want": {first: [real["want"][first][0] + 2 * reproduce.TOL_QUICK, real["want"][first][1]]}}
    (tmp_path / "reproduce_quick.json").write_text(json.dumps(moved))
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    threads = torch.get_num_threads()
    try:
        rc = reproduce.main(["--quick", "--workers", "1", "--cells", "main"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert rc == 1 and out.count("**no**") == 2, out     # the moved cell, and the cell missing from the reference
