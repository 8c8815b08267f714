"""provenance: a run's code is the lightfed functions it executed (and their modules' skeletons); an edit elsewhere,
or to a comment, leaves it unchanged, an edit to a function it ran or to a module constant changes it."""
import importlib.util
import sys

from lightfed import provenance

SOURCE = '''"""a module"""
RATE = 2


def f(x):
    # a comment
    return [g(v) * RATE for v in x] + list(map(lambda v: v, x))


def g(v):
    return v + 1


def never(v):
    return v - 1


if RATE:
    def h(v):                        # a def under an `if` (as measure.py registers its flop formulas) is indexed too
        return v * 3


class C:
    kind = "a"

    def run(self, x):
        return f(x) + [h(0)]
'''


def _load(path):
    spec = importlib.util.spec_from_file_location("prov_toy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_trace_records_the_functions_that_ran_and_only_their_edits_count(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    path = tmp_path / "toy.py"
    path.write_text(SOURCE)
    mod = _load(path)
    with provenance.Trace() as t:
        assert mod.C().run([1, 2]) == [4, 6, 1, 2, 0]
    path.write_text(SOURCE.replace("return v + 1", "return v + 5"))     # edited while the run goes on: not what it ran
    used = t.fingerprint()
    path.write_text(SOURCE)
    if used is None:                      # a debugger or coverage holds the tracer: nothing can be recorded here
        assert sys.gettrace() is not None
        return
    assert set(used) == {"toy.py", "toy.py::f", "toy.py::g", "toy.py::h", "toy.py::C.run"}   # the lambda and listcomp count as f
    assert all(used.values()) and provenance.changed(used) == []      # every function that ran has a fingerprint
    edits = {   # an edit -> what it changes for this run
        SOURCE.replace("return v - 1", "return v - 2"): [],                          # a function the run never called
        SOURCE.replace("# a comment", "# another comment"): [],                       # comments do not count
        SOURCE.replace("return v + 1", "return v + 3"): ["toy.py::g"],
        SOURCE.replace("lambda v: v", "lambda v: -v"): ["toy.py::f"],                 # a lambda inside f
        SOURCE.replace("return v * 3", "return v * 4"): ["toy.py::h"],                # the def under `if`
        SOURCE.replace("RATE = 2", "RATE = 3"): ["toy.py"],                          # a module constant
        SOURCE.replace('kind = "a"', 'kind = "b"'): ["toy.py"],                      # a class attribute
    }
    for text, want in edits.items():
        path.write_text(text)
        assert provenance.changed(used) == want, (want, provenance.changed(used))
    path.unlink()
    assert sorted(provenance.changed(used)) == sorted(used)                          # the file is gone: everything


def test_a_real_run_is_fingerprinted_by_the_code_it_ran(tmp_path):
    from conftest import tiny_config
    from lightfed.engine import local
    with provenance.Trace() as t:
        local.run(tiny_config("sentiment", "flite", tmp_path), log=lambda *a: None)
    used = t.fingerprint()
    if used is None:
        return
    assert "methods/flite.py::FLITE.client_update" in used and "engine/protocol.py::client_round" in used
    assert not any(k.startswith(("methods/mezo.py", "methods/fednl.py", "export.py")) for k in used)
    assert all(used.values()) and provenance.changed(used) == []
