"""Every committed results file is what its script renders from its JSON (issue 46: results are rendered by one function
from what the runs recorded, never edited or merged by hand), or says at its top that it is a record no code at hand
regenerates."""
import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

# a results name's script: the longest prefix here that the name starts with; its render_<part> for a name
# <prefix>_<part>[_...] where the script has one (flite_lm_where: render_where), else its render
OWNERS = {"fednl_ask": "fednl_ask", "fednl_claims": "fednl_claims", "fednl_recipe": "fednl_claims", "fednl_toy": "fednl_toy",
          "fedspzo_claims": "fedspzo_claims", "flite_ablation": "flite_ablation", "flite_claims": "flite_claims",
          "flite_generator": "flite_generator", "flite_lm": "flite_lm", "flite_vision": "flite_vision",
          "flower_overhead": "flower_overhead", "foundation": "foundation", "reproduce": "reproduce",
          "robustness": "robustness", "zoflite_claims": "zoflite_claims", "zoflite_prompt": "zoflite_claims"}
# made by a script outside benchmarks/ that writes markdown only
ELSEWHERE = {"kill_trials": "scripts/kill_trials.py", "flower_secagg_deploy": "scripts/flower_deploy_demo.sh"}
RECORD = "> † A record, not regenerable at HEAD"
# a reference the --quick check compares with, not a report
NOT_REPORTS = {"reproduce_quick"}


def owner(name: str):
    key = max((k for k in OWNERS if name.startswith(k)), key=len, default=None)
    assert key, f"results/{name}: no script owns it (add it to OWNERS, or mark the file a record)"
    module = importlib.import_module(OWNERS[key])
    part = name[len(key):].strip("_").split("_")[0]
    return getattr(module, f"render_{part}", None) or module.render


def is_record(md: str) -> bool:
    return any(line.startswith(RECORD) for line in md.splitlines()[:4])


@pytest.mark.parametrize("md", sorted(RESULTS.glob("*.md")), ids=lambda p: p.stem)
def test_results_file_is_rendered_from_its_json(md):
    text, name = md.read_text(), md.stem
    if name in ELSEWHERE:
        assert (ROOT / ELSEWHERE[name]).exists()
        return
    if is_record(text):
        return
    js = md.with_suffix(".json")
    assert js.exists(), f"results/{name}.md has no JSON to render it from and is not marked a record"
    assert owner(name)(json.loads(js.read_text())) == text, (
        f"results/{name}.md is not what its script renders from results/{name}.json: write it with the script "
        "(`--render` makes the markdown again from the JSON), or mark it a record")


def test_every_json_has_its_report():
    for js in RESULTS.glob("*.json"):
        assert js.stem in NOT_REPORTS or js.with_suffix(".md").exists(), f"results/{js.name}: no markdown beside it"


def test_a_record_is_recognised_and_an_edit_is_not():
    """The check fails on a hand-edited figure: a committed report with one number changed no longer equals its render."""
    md = (RESULTS / "flite_lm.md").read_text()
    res = json.loads((RESULTS / "flite_lm.json").read_text())
    render = owner("flite_lm")
    assert render(res) == md
    assert render(res) != md.replace("43.60", "43.50", 1) and "43.60" in md
    assert is_record("# t\n\n" + RECORD + ": ...") and not is_record(md)
