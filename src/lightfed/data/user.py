"""Users' own data: a CSV, JSON-lines or Parquet file read with pyarrow, validated column by column and
row by row (errors name the file, the row and the column). Plain text files (one document each) serve
language modelling.

    read_table(path, need=["text", "label"], optional=["client"]) -> {column: list}
"""
from __future__ import annotations

from pathlib import Path

from lightfed.config import ConfigError

FORMATS = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}


def read_table(path: str | Path, need: list[str], optional: tuple[str, ...] = ()) -> dict[str, list]:
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet

    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"data {str(path)!r}: no such file")
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ConfigError(f"data {p.name!r}: use a .csv, .jsonl or .parquet file")
    try:
        t = {"csv": pa.csv.read_csv, "json": pa.json.read_json, "parquet": pa.parquet.read_table}[fmt](p)
    except (pa.ArrowInvalid, OSError) as e:
        raise ConfigError(f"data {p.name!r}: cannot be read as {fmt}: {e}") from None
    missing = [c for c in need if c not in t.column_names]
    if missing:
        raise ConfigError(f"data {p.name!r}: missing column(s) {missing}; it has {t.column_names}")
    cols = {c: t.column(c).to_pylist() for c in need + [c for c in optional if c and c in t.column_names]}
    for c, vals in cols.items():
        for i, v in enumerate(vals):
            if v is None or (isinstance(v, str) and not v.strip()):
                raise ConfigError(f"data {p.name!r}: row {i + 1}, column {c!r} is empty")
    if t.num_rows == 0:
        raise ConfigError(f"data {p.name!r}: no rows")
    return cols


def read_texts(path: str | Path) -> dict[str, str]:
    """A folder of .txt files (or one .txt file) -> {name: text}, for language modelling."""
    p = Path(path).expanduser()
    files = sorted(p.glob("*.txt")) if p.is_dir() else [p] if p.suffix == ".txt" and p.is_file() else []
    if not files:
        raise ConfigError(f"data {str(path)!r}: no .txt file there")
    return {f.stem: f.read_text(encoding="utf-8", errors="replace") for f in files}


def read_corpus(path: str | Path, text_column: str = "text", client_column: str = "") -> dict[str, str]:
    """Language-modelling text as {domain: text}: a folder of .txt files (one domain each), or a table whose
    `text_column` rows are joined per value of `client_column` (one domain "data" without it)."""
    p = Path(path).expanduser()
    if p.is_dir() or p.suffix == ".txt":
        return read_texts(p)
    cols = read_table(p, [text_column], (client_column,))
    keys = [str(v) for v in cols[client_column]] if client_column else ["data"] * len(cols[text_column])
    out: dict[str, list[str]] = {}
    for k, t in zip(keys, cols[text_column]):
        out.setdefault(k, []).append(str(t))
    return {k: "\n\n".join(v) for k, v in out.items()}
