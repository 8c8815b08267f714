"""lightfed report: the table, four PNG plots and one self-contained HTML page from finished runs."""
import base64
import re

import pytest

from conftest import tiny_config, tiny_task
from lightfed import cli
from lightfed.engine import local
from lightfed.report import load_run, make_report, pareto


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tiny_task("sentiment")
    d = tmp_path_factory.mktemp("runs")
    for m in ("fedavg", "flite"):
        local.run(tiny_config("sentiment", m, d / m, rounds=2), log=lambda *a: None)
    return d


def test_report_makes_the_plots_and_a_self_contained_page(two_runs, capsys):
    assert cli.main(["report", str(two_runs / "fedavg"), str(two_runs / "flite"), "--out", str(two_runs / "rep")]) == 0
    pngs = sorted(p.name for p in (two_runs / "rep").glob("*.png"))
    assert pngs == ["metric_vs_bytes.png", "metric_vs_flops.png", "metric_vs_round.png", "pareto_bytes.png"]
    page = (two_runs / "rep" / "report.html").read_text()
    srcs = re.findall(r'src="([^"]+)"', page)
    assert len(srcs) == 4 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert all(base64.b64decode(s.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n" for s in srcs)
    assert "http" not in page.replace("http-equiv", "")                # nothing fetched from a network
    assert "fedavg" in page and "flite" in page and "upload vs FedAvg" in capsys.readouterr().out


def test_report_refuses_what_is_not_a_finished_run(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "not a finished run" in capsys.readouterr().err


def test_pareto_front():
    pts = [(10, 0.5), (100, 0.7), (1000, 0.6), (5, 0.4), (50, 0.45)]
    assert pareto(pts, True) == [(5, 0.4), (10, 0.5), (100, 0.7)]
    assert pareto([(10, 30.0), (100, 20.0), (1000, 25.0)], False) == [(10, 30.0), (100, 20.0)]


def test_cumulative_curves_count_every_clients_bytes(two_runs):
    from lightfed.report import curves
    s, rec = load_run(two_runs / "flite")
    c = curves(s, rec)
    assert c["round"] == [0, 1, 2] and c["up"][0] == 0
    assert c["up"][-1] == s["bytes"]["up_total"] and c["flops"][-1] == s["flops"]["client_total"]


def test_the_html_page_renders_with_its_images_in_a_real_browser(two_runs, tmp_path):
    """Headless Chromium opens report.html (file://, no network) and takes a screenshot; the plots drew:
    the screenshot has matplotlib's line colours, which no broken image or text would show."""
    import os
    import shutil
    import subprocess
    import numpy as np
    from matplotlib.image import imread
    exe = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium-headless-shell is missing: scripts/setup.sh installs it")
        pytest.skip("no headless chromium here")
    make_report([two_runs / "fedavg", two_runs / "flite"], tmp_path / "rep")
    shot = tmp_path / "shot.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
                    "--window-size=1400,2200", (tmp_path / "rep" / "report.html").as_uri()],
                   check=True, capture_output=True, timeout=120)
    img = imread(shot)[..., :3]                                        # (H, W, 3) in [0, 1]
    blue, orange = np.array([31, 119, 180]) / 255, np.array([255, 127, 14]) / 255   # matplotlib's C0, C1
    near = lambda c: (np.abs(img - c).sum(-1) < 0.08).sum()           # noqa: E731
    assert near(blue) > 200 and near(orange) > 200, (near(blue), near(orange))
