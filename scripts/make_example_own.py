"""Make the two inputs the README's "your own model and data" commands use, from the installed assets:
  my.csv     600 balanced tweets (text, label) with a `city` column naming 3 made-up clients
  my-llama/  a local Hugging Face folder of SmolLM2-135M-Instruct (config + safetensors + tokenizer)
Run: .venv/bin/python scripts/make_example_own.py [OUT_DIR]      (default: the current folder)
"""
import csv
import shutil
import sys
from pathlib import Path

import numpy as np

from lightfed import assets
from lightfed.data import datasets


def main(out: Path) -> None:
    texts, labels = datasets.load_tweets()
    labels = np.asarray(labels)
    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.choice(np.flatnonzero(labels == c), 300, replace=False) for c in (0, 1)])
    rows = rng.permutation(rows)
    with open(out / "my.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label", "city"])
        for i, r in enumerate(rows):
            w.writerow([texts[r], ["negative", "positive"][labels[r]], ["lisbon", "oslo", "quito"][i % 3]])
    dst = out / "my-llama"
    if not dst.exists():
        shutil.copytree(assets.smollm2_dir(), dst)
    print(f"wrote {out / 'my.csv'} (600 rows) and {dst}/")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("."))
