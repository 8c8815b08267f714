"""Which of lightfed's code a run executed, fingerprinted so that a later process can tell whether that code changed.

    with provenance.Trace() as t:       # records every lightfed function that runs (sys.settrace, call events only)
        local.run(cfg)
    used = t.fingerprint()              # {"engine/protocol.py": sha, "engine/protocol.py::client_round": sha, ...}
    provenance.changed(used)            # [] while every recorded function and module skeleton is as it was

A function is fingerprinted by its syntax tree (comments and formatting do not count; a lambda or a nested function
counts as the named function around it), a module by its skeleton: the tree with every function's body removed, so
constants, class attributes and signatures count. A benchmark reuses a finished run while `changed` is empty, so an
edit elsewhere in the package no longer invalidates it (the whole-source hash did).
"""
from __future__ import annotations

import ast
import copy
import functools
import hashlib
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent           # the lightfed package


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@functools.cache
def _index(source: str) -> dict[str, str]:
    """{"": the module skeleton's hash, qualname: the function's hash} for one source file's text."""
    tree = ast.parse(source)
    out: dict[str, str] = {}

    def walk(node, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + child.name] = _sha(ast.dump(child))
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.stmt):       # a def under `if`, `try`, `with`, ...: still the module's (or class's)
                walk(child, prefix)

    walk(tree, "")
    skeleton = copy.deepcopy(tree)
    for node in ast.walk(skeleton):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body = [ast.Pass()]
    out[""] = _sha(ast.dump(skeleton))
    return out


def index(rel: str) -> dict[str, str] | None:
    """The current fingerprints of one package file (None: it no longer exists)."""
    p = ROOT / rel
    return _index(p.read_text()) if p.is_file() else None


def _named(qualname: str) -> str:
    """The named function a code object belongs to: "f.<locals>.<lambda>" -> "f"; "<module>" -> "" (the skeleton)."""
    parts = qualname.split(".")
    keep = []
    for p in parts:
        if p.startswith("<"):
            break
        keep.append(p)
    return ".".join(keep)


class Trace:
    """Record the code objects of lightfed that start running inside the block (any thread it starts too). Where
    another tracer is already installed (a debugger, coverage), nothing is recorded and fingerprint() is None."""

    def __init__(self):
        self.codes: set = set()
        self.texts: dict[str, str] = {}    # each file's source when the run first called into it, not when it ended:
        self.active = False                # an edit made while a long run goes on is not the code it ran
        self._root = str(ROOT) + "/"

    def _tracer(self, frame, event, arg):
        co = frame.f_code
        if co.co_filename.startswith(self._root):
            self.codes.add(co)
            if co.co_filename not in self.texts:
                p = Path(co.co_filename)
                self.texts[co.co_filename] = p.read_text() if p.is_file() else ""
        return None                  # no line events: only each call is seen

    def __enter__(self):
        if sys.gettrace() is None:
            self.active = True
            sys.settrace(self._tracer)
            threading.settrace(self._tracer)
        return self

    def __exit__(self, *exc):
        if self.active:
            sys.settrace(None)
            threading.settrace(None)
        return False

    def fingerprint(self) -> dict[str, str] | None:
        if not self.active:
            return None
        out: dict[str, str] = {}
        for co in self.codes:
            rel = str(Path(co.co_filename).resolve().relative_to(ROOT))
            idx = _index(self.texts[co.co_filename]) if self.texts.get(co.co_filename) else {}
            out[rel] = idx.get("", "")
            name = _named(co.co_qualname)
            if name:
                out[f"{rel}::{name}"] = idx.get(name, "")
        return dict(sorted(out.items()))


def changed(used: dict[str, str]) -> list[str]:
    """The recorded files and functions whose code differs now (or is gone): [] means the run would compute the same."""
    bad = []
    for key, h in used.items():
        rel, _, name = key.partition("::")
        idx = index(rel)
        if idx is None or idx.get(name) != h:
            bad.append(key)
    return bad
