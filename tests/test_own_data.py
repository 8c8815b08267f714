"""Your own data: a CSV / JSON-lines / Parquet file with text, label and client columns (textclf), or a
folder of .txt files (austen's language modelling): the split it names, and errors that name the row/column."""
import json

import pytest

from lightfed import cli, config, tasks
from lightfed.engine import local

ROWS = [("great day, loved it", "pos", "alice"), ("awful, never again", "neg", "alice"), ("so happy today", "pos", "bob"),
        ("worst service ever", "neg", "bob"), ("what a lovely film", "pos", "carol"), ("boring and bad", "neg", "carol")] * 6


def write_csv(path, rows=ROWS, header="text,label,client"):
    path.write_text(header + "\n" + "".join(f'"{t}",{l},{c}\n' for t, l, c in rows))
    return path


def opts(path, **kw):
    return {"data": str(path), "client_column": "client", "tiny": True, "max_len": 16, **kw}


def test_a_csv_with_a_client_column_gives_the_split_it_names(tmp_path):
    f = write_csv(tmp_path / "mine.csv")
    cfg = config.from_dict({"task": "textclf", "method": "fedavg", "clients": 3, "rounds": 1, "partition": "domain",
                            "batch_size": 8, "local_steps": 1, "progress": False, "task_options": opts(f), "out": str(tmp_path / "run")})
    S = local.build(cfg)
    assert S.task.info["classes"] == ["neg", "pos"] and S.task.info["rows"] == 36
    for shard in S.shards:                                   # one client per named client, all of its rows
        assert len(set(S.task.domains[shard].tolist())) == 1
    assert sorted(len(s) for s in S.shards) == sorted((S.task.domains == d).sum() for d in ("alice", "bob", "carol"))
    s = local.run(cfg, log=lambda *a: None)
    assert set(s["per_domain"]) <= {"alice", "bob", "carol"}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_json_lines_and_parquet_read_the_same(tmp_path, fmt):
    import pyarrow as pa
    import pyarrow.parquet as pq
    cols = {"text": [r[0] for r in ROWS], "label": [r[1] for r in ROWS], "client": [r[2] for r in ROWS]}
    f = tmp_path / f"mine.{fmt}"
    if fmt == "jsonl":
        f.write_text("".join(json.dumps(dict(zip(cols, v))) + "\n" for v in zip(*cols.values())))
    else:
        pq.write_table(pa.table(cols), f)
    a = tasks.build("textclf", opts(f), 0)
    b = tasks.build("textclf", opts(write_csv(tmp_path / "same.csv")), 0)
    assert a.train["input_ids"].equal(b.train["input_ids"]) and (a.domains == b.domains).all()


def test_bad_files_get_errors_that_name_the_row_and_column(tmp_path):
    with pytest.raises(config.ConfigError, match=r"missing column\(s\) \['label'\]"):
        tasks.build("textclf", opts(write_csv(tmp_path / "a.csv", header="text,lbl,client")), 0)
    bad = list(ROWS)
    bad[4] = ("  ", "pos", "alice")
    with pytest.raises(config.ConfigError, match="row 5, column 'text' is empty"):
        tasks.build("textclf", opts(write_csv(tmp_path / "b.csv", bad)), 0)
    with pytest.raises(config.ConfigError, match="one class"):
        tasks.build("textclf", opts(write_csv(tmp_path / "c.csv", [(t, "pos", c) for t, _, c in ROWS])), 0)
    with pytest.raises(config.ConfigError, match="no such file"):
        tasks.build("textclf", opts(tmp_path / "nope.csv"), 0)
    with pytest.raises(config.ConfigError, match="set data=FILE"):
        tasks.options("textclf", {})


def test_cli_data_flag_and_plain_text_for_language_modelling(tmp_path, capsys):
    f = write_csv(tmp_path / "mine.csv")
    rc = cli.main(["run", "--data", str(f), "--task-opt", "tiny=true", "--task-opt", "client_column=client",
                   "--partition", "domain", "--clients", "3", "--rounds", "1", "--set", "local_steps=1",
                   "--no-progress", "--out", str(tmp_path / "run")])
    assert rc == 0 and json.loads((tmp_path / "run" / "summary.json").read_text())["task"] == "textclf"
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(2):
        (docs / f"doc{i}.txt").write_text(" ".join(f"word{j % 50}" for j in range(3000)))
    t = tasks.build("austen", {"data": str(docs), "tiny": True, "block_len": 32, "train_blocks": 6, "test_blocks": 6}, 0)
    assert t.info["novels"] == ["doc0", "doc1"] and set(t.domains.tolist()) == {"doc0", "doc1"}


def test_language_modelling_from_a_text_column_split_by_client(tmp_path):
    rows = [(" ".join(f"w{(i * 7 + j) % 90}" for j in range(400)), "x", c) for i, c in enumerate(["north", "south"] * 4)]
    f = write_csv(tmp_path / "lm.csv", rows)
    t = tasks.build("austen", {"data": str(f), "client_column": "client", "tiny": True, "block_len": 32,
                               "train_blocks": 6, "test_blocks": 6}, 0)
    assert t.info["novels"] == ["north", "south"] and set(t.domains.tolist()) == {"north", "south"}
