"""
Needle-in-a-haystack prompts in the style of RULER, built offline from any long text.

A needle is one sentence, "One of the special magic numbers for fearless-badger is: 4817263.",
hidden at a chosen depth (0..1 of the haystack, snapped to a sentence boundary) inside a haystack
fitted to a target length in tokens. The prompt is

    <instruction>\\n\\n<haystack with needles>\\n\\n<question> <answer prefix>

and the model continues after the answer prefix. Metric: `score` ("string match all"), the
fraction of gold values found (case-insensitive) in the generation; the benchmark averages x100.

    task        haystack          key    value    needles
    single_1    filler sentences  words  numbers  1 key, 1 value, asked      (not in TASKS7)
    single_2    book text         words  numbers  1 key, 1 value, asked
    single_3    book text         words  uuids    1 key, 1 value, asked
    multikey_1  book text         words  numbers  4 keys, 1 value each, 1 asked
    multikey_2  needles only      words  numbers  many keys, 1 asked (the rest fill the haystack)
    multikey_3  needles only      uuids  uuids    many keys, 1 asked (the rest fill the haystack)
    multivalue  book text         words  numbers  1 key with 4 values, all 4 are golds
    multiquery  book text         words  numbers  4 keys, 1 value each, all 4 asked in one question

Wording: needles always say "special magic numbers/words/uuids"; the question and answer prefix
use the singular ("What is the special magic number for X ...? ... is") when exactly one value is
asked about, else "What are all the special magic numbers for A, B, C and D ...? ... are".

Train / eval disjointness (split="train" or "eval"): nothing a training needle holds can appear in
an evaluation needle, and vice versa.
    word keys and word values  adjective-noun pairs; train uses ADJECTIVES[0::2] x NOUNS[0::2],
                               eval uses ADJECTIVES[1::2] x NOUNS[1::2]
    numbers                    7 digits (1000000..9999999); train: last digit even, eval: odd
    uuids                      UUID4 strings from the rng's bytes; the variant nibble (first of
                               the 4th group) is 8 or 9 for train, a or b for eval
Use `haystack_split` to keep the haystack text disjoint too (first 90% / last 10% of each book).

Lengths: prompt tokens + gen_tokens <= length, counted with the tokenizer passed in (no special
tokens). Per call the haystack source (a window of the book text from a random sentence, or the
filler, or the distractor needles) is tokenised once, with offsets; the longest run of whole
sentences within the token budget is cut from it, and only then are the needles inserted; a final
count of the whole prompt trims the haystack if it came out over.
"""

import re
import zlib
from dataclasses import dataclass

import numpy as np

# -----------------------------------------------------------------------------
# word lists (keys and word values are "adjective-noun"); no word is a substring of another
# in the same list, so a value never hides inside another value

ADJECTIVES = (
    "ancient", "angry", "bitter", "black", "bold", "brave", "brief", "bright", "broad", "broken",
    "busy", "calm", "careful", "cheap", "cheerful", "clean", "clever", "cloudy", "clumsy", "crisp",
    "crooked", "cruel", "curious", "damp", "dark", "deep", "dizzy", "dry", "dusty", "eager",
    "early", "easy", "empty", "famous", "fancy", "fast", "fierce", "firm", "flat", "fluffy",
    "foolish", "fragile", "fresh", "friendly", "frozen", "funny", "gentle", "giant", "glad", "gloomy",
    "golden", "good", "grand", "gray", "great", "green", "happy", "hard", "heavy", "hidden",
    "hollow", "honest", "huge", "humble", "hungry", "idle", "jolly", "keen", "kind", "large",
    "lazy", "lively", "lonely", "long", "lucky", "merry", "mighty", "mild", "modern", "narrow",
    "neat", "nervous", "noble", "noisy", "pale", "patient", "plain", "polite", "poor", "proud",
    "purple", "quick", "quiet", "rapid", "rare", "rich", "rough", "round", "royal", "rude",
    "rusty", "sad", "safe", "sharp", "shiny", "short", "shy", "silent", "silly", "simple",
    "sleepy", "slow", "small", "smooth", "soft", "solid", "sour", "spicy", "steady", "steep",
    "sticky", "strange", "strict", "strong", "sunny", "sweet", "swift", "tall", "tame", "tender",
    "thick", "thin", "tidy", "tiny", "tough", "warm", "weak", "wet", "white", "wide",
    "wild", "wise", "young", "yellow", "fearless", "grumpy", "brisk", "sturdy", "chilly", "cozy",
)

NOUNS = (
    "anchor", "apple", "badger", "barrel", "basket", "beaver", "beetle", "bicycle", "biscuit", "blanket",
    "bottle", "boulder", "bridge", "bucket", "button", "cabbage", "cabin", "camel", "camera", "candle",
    "canoe", "canyon", "carpet", "carrot", "castle", "cello", "cherry", "chimney", "clock", "cloud",
    "cobra", "coconut", "compass", "cookie", "crayon", "crown", "curtain", "desk", "diamond", "dolphin",
    "donkey", "dragon", "drum", "eagle", "engine", "falcon", "feather", "fence", "ferret", "fiddle",
    "flute", "forest", "fountain", "fox", "frog", "garden", "giraffe", "glove", "goat", "goose",
    "guitar", "hammer", "harbor", "helmet", "horse", "island", "jacket", "kettle", "kitten", "ladder",
    "lamp", "lantern", "lemon", "leopard", "lizard", "lobster", "magnet", "mango", "marble", "meadow",
    "mirror", "monkey", "moose", "mountain", "mushroom", "nest", "octopus", "otter", "owl", "paddle",
    "panda", "parrot", "peach", "pebble", "pelican", "pencil", "penguin", "pepper", "piano", "pillow",
    "planet", "pocket", "pony", "potato", "pumpkin", "puppy", "rabbit", "raccoon", "radio", "raven",
    "river", "robot", "rocket", "saddle", "salmon", "sandal", "scarf", "shovel", "spoon", "squirrel",
    "statue", "sparrow", "spider", "stove", "sweater", "table", "teapot", "tiger", "tomato", "tractor",
    "trumpet", "tulip", "turtle", "umbrella", "valley", "violin", "wagon", "walrus", "whale", "whistle",
    "window", "wolf", "zebra", "lighthouse", "orchard", "hedgehog", "kayak", "lettuce", "muffin", "ostrich",
)

# -----------------------------------------------------------------------------
# tasks


@dataclass(frozen=True)
class Template:
    haystack: str   # "book" (the text passed in), "filler" (FILLER repeated) or "needles" (distractors only)
    key: str        # "words" or "uuids"
    value: str      # "numbers", "words" or "uuids"
    n_keys: int = 1     # keys with needles in the text (book/filler); asked keys come first
    n_values: int = 1   # needles (values) per key
    n_queries: int = 1  # keys asked about in the question


TASKS: dict[str, Template] = {
    "single_1": Template("filler", "words", "numbers"),
    "single_2": Template("book", "words", "numbers"),
    "single_3": Template("book", "words", "uuids"),
    "multikey_1": Template("book", "words", "numbers", n_keys=4),
    "multikey_2": Template("needles", "words", "numbers"),
    "multikey_3": Template("needles", "uuids", "uuids"),
    "multivalue": Template("book", "words", "numbers", n_values=4),
    "multiquery": Template("book", "words", "numbers", n_keys=4, n_queries=4),
}
TASKS7: tuple[str, ...] = ("single_2", "single_3", "multikey_1", "multikey_2", "multikey_3",
                           "multivalue", "multiquery")
SPLITS = ("train", "eval")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclass
class Sample:
    task: str
    length: int         # target length in tokens (prompt + gen_tokens <= length)
    prompt: str         # ends with the answer prefix; the model continues after it
    golds: list[str]    # values to find, in the order they are asked
    keys: list[str]     # the asked key(s)
    depths: list[float] # requested depth (0..1 of the haystack) of each gold's needle, as golds
    n_tokens: int       # prompt tokens (no special tokens)


# -----------------------------------------------------------------------------
# random keys and values, each kind drawn in batches from the split's half of its space

def _words(rng: np.random.Generator, m: int, split: str) -> list[str]:
    side = SPLITS.index(split)
    adj, noun = ADJECTIVES[side::2], NOUNS[side::2]
    a, n = rng.integers(0, len(adj), m), rng.integers(0, len(noun), m)
    return [f"{adj[i]}-{noun[j]}" for i, j in zip(a, n)]


def _numbers(rng: np.random.Generator, m: int, split: str) -> list[str]:
    last = rng.integers(0, 5, m) * 2 + SPLITS.index(split)  # even digit for train, odd for eval
    return [str(v) for v in rng.integers(100_000, 1_000_000, m) * 10 + last]


def _uuids(rng: np.random.Generator, m: int, split: str) -> list[str]:
    b = np.frombuffer(rng.bytes(16 * m), dtype=np.uint8).reshape(m, 16).copy()
    b[:, 6] = (b[:, 6] & 0x0F) | 0x40                                      # version 4
    b[:, 8] = (b[:, 8] & 0x1F) | (0x80 if split == "train" else 0xA0)      # variant 8/9 or a/b
    out = []
    for row in b:
        h = row.tobytes().hex()
        out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return out


_DRAW = {"words": _words, "numbers": _numbers, "uuids": _uuids}
_SPACE = {"words": (len(ADJECTIVES) // 2) * (len(NOUNS) // 2), "numbers": 4_500_000, "uuids": 2**121}


def _unique(kind: str, n: int, rng: np.random.Generator, split: str,
            used: dict[str, set[str]]) -> list[str]:
    """n new strings of `kind`, none already in used[kind] (which they join)."""
    seen = used.setdefault(kind, set())
    if n + len(seen) > _SPACE[kind]:
        raise ValueError(f"a prompt this long needs {n + len(seen)} distinct {kind}, more than the "
                         f"{_SPACE[kind]} a split has; use a shorter length")
    out: list[str] = []
    while len(out) < n:
        for v in _DRAW[kind](rng, n - len(out) + 4, split):
            if v not in seen and len(out) < n:
                seen.add(v)
                out.append(v)
    return out


# -----------------------------------------------------------------------------
# the words of the prompt

def needle(kind: str, key: str, value: str) -> str:
    return f"One of the special magic {kind} for {key} is: {value}."


def _instruction(kind: str) -> str:
    return (f"The long text below contains hidden sentences that state special magic {kind}. "
            f"Read it closely and memorize the special magic {kind}: after the text you will be "
            f"asked about them.")


def _question(kind: str, queries: list[str], n_golds: int) -> str:
    """The question followed by the answer prefix (no trailing space)."""
    who = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + " and " + queries[-1]
    if n_golds == 1:
        one = kind[:-1]  # numbers -> number, words -> word, uuids -> uuid
        return (f"What is the special magic {one} for {who} mentioned in the provided text? "
                f"The special magic {one} for {who} mentioned in the provided text is")
    return (f"What are all the special magic {kind} for {who} mentioned in the provided text? "
            f"The special magic {kind} for {who} mentioned in the provided text are")


# -----------------------------------------------------------------------------
# haystack text: sentence ends, a window of the source, cutting by tokens

# a sentence ends at . ! or ? (plus closing quotes/brackets), before whitespace and a capital or
# an opening quote, or before Austen's "--" and a capital; titles such as "Mr." do not end one
_END = re.compile(r"(?<!\bMr)(?<!\bMrs)(?<!\bDr)(?<!\bSt)(?<!\bMessrs)(?<!\bMs)"
                  r"[.!?][\"')\]_]*(?=\s+[A-Z\"'(_]|--[A-Z\"'_])")


_GAP = re.compile(r"[\s-]*")  # between a sentence end and the next start (Austen's "--" too)


def _ends(text: str) -> list[int]:
    return [m.end() for m in _END.finditer(text)]


def _count(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def _tidy(text: str) -> str:
    """Lines within a paragraph -> one line, runs of spaces -> one, at most one blank line."""
    text = re.sub(r"(?<=\S)[ \t]*\n[ \t]*(?=\S)", " ", text.strip())  # a wrapped line
    text = re.sub(r"[ \t]{2,}", " ", text)
    return re.sub(r"\s*\n\s*\n\s*", "\n\n", text)


def _book_window(haystack: str, chars: int, rng: np.random.Generator) -> str:
    """About `chars` characters of `haystack` from a random sentence start (repeated if short)."""
    if not haystack.strip():
        raise ValueError("haystack is empty: a book task needs text (see haystack_split)")
    while len(haystack) < 2 * chars:
        haystack = haystack + "\n\n" + haystack
    start = int(rng.integers(0, len(haystack) - chars))
    m = _END.search(haystack, start)
    start = m.end() if m and m.end() < len(haystack) - chars else 0
    return _tidy(haystack[start:start + chars])


def _source(t: Template, haystack: str, budget: int, rng: np.random.Generator, split: str,
            used: dict[str, set[str]], per_needle: int, grow: int = 1) -> str:
    """Haystack source text of, almost surely, more than `budget` tokens (the caller checks;
    `grow` > 1 asks for that many times more)."""
    if t.haystack == "book":
        return _book_window(haystack, grow * 6 * budget + 2000, rng)  # ~4 characters per token
    if t.haystack == "filler":
        return " ".join([FILLER] * (grow * budget // 20 + 2))  # FILLER is ~22 tokens
    n = grow * budget // max(per_needle - 4, 4) + 4  # distractor needles (~20+ tokens each)
    keys = _unique(t.key, n, rng, split, used)
    values = _unique(t.value, n, rng, split, used)
    return " ".join(needle(t.value, k, v) for k, v in zip(keys, values))


def _cut(text: str, offsets: list[tuple[int, int]], budget: int) -> str:
    """The longest run of whole sentences of `text` within `budget` tokens (token counts read
    off `offsets`), starting at one of its first 50 sentence starts."""
    ends = np.array(_ends(text + " A"))  # " A": a sentence end at the very end also counts
    if budget <= 0 or len(ends) == 0:
        return ""
    starts = np.array([0] + [_GAP.match(text, e).end() for e in ends[:49]])
    tok_starts = np.array([a for a, _ in offsets])
    t_end = np.searchsorted(tok_starts, ends)      # tokens before each sentence end
    t_start = np.searchsorted(tok_starts, starts)  # tokens before each sentence start
    # for each start, the last end within budget; keep the start that holds the most tokens
    last = np.searchsorted(t_end, t_start + budget, side="right") - 1
    ok = (last >= 0) & (ends[np.maximum(last, 0)] > starts)
    if not ok.any():
        return ""
    held = np.where(ok, t_end[np.maximum(last, 0)] - t_start, -1)
    i = int(held.argmax())
    return text[starts[i]:ends[last[i]]]


def _insert(hay: str, needles: list[str], depths: list[float]) -> str:
    """Put each needle at the sentence end nearest its depth (fraction of hay's characters)."""
    spots = np.array([0, *_ends(hay + " A")])  # hay ends a sentence, so this ends with len(hay)
    at = [int(spots[np.abs(spots - d * len(hay)).argmin()]) for d in depths]
    order = sorted(range(len(needles)), key=lambda i: at[i])  # stable: ties keep needle order
    parts, prev = [], 0
    for i in order:
        parts.append(hay[prev:at[i]])
        prev = at[i]
        parts.append((" " if at[i] > 0 else "") + needles[i] + (" " if at[i] == 0 and hay else ""))
    parts.append(hay[prev:])
    return "".join(parts)


# -----------------------------------------------------------------------------
# samples

def make_sample(task: str, length: int, tok, haystack: str, rng: np.random.Generator, *,
                split: str = "eval", gen_tokens: int = 32, depth: float | None = None) -> Sample:
    """One prompt of `task` that fits `length` tokens with `gen_tokens` to spare.
    depth: where the (first) gold needle goes, 0..1 of the haystack; None draws it from rng.
    Other needles of book/filler tasks go at uniformly random depths."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose 'train' or 'eval'")
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth {depth} is outside [0, 1]")
    t = TASKS[task]
    kind = t.value

    # keys and values; asked keys first, each key's values in a row
    used: dict[str, set[str]] = {}  # kind -> strings drawn so far: all keys and values differ
    keys = _unique(t.key, t.n_keys, rng, split, used)
    values = [_unique(t.value, t.n_values, rng, split, used) for _ in keys]
    asked = keys[:t.n_queries]
    golds = [v for vs in values[:t.n_queries] for v in vs]
    needles = [needle(kind, k, v) for k, vs in zip(keys, values) for v in vs]
    first = float(rng.uniform()) if depth is None else float(depth)
    # needle depths; the gold needles are the first len(golds) of `needles`
    depths = [first] + [float(d) for d in rng.uniform(0, 1, len(needles) - 1)]

    head, tail = _instruction(kind), _question(kind, asked, len(golds))
    fixed = _count(tok, head + "\n\n" + " ".join(needles) + "\n\n" + tail)
    budget = length - gen_tokens - fixed - 2 - len(needles)  # a little slack for the joins
    if budget <= 0:
        raise ValueError(f"length {length} is too small for task {task!r}: the instruction, "
                         f"{len(needles)} needle(s) and question take {fixed} tokens and "
                         f"gen_tokens is {gen_tokens}, leaving {length - gen_tokens - fixed} "
                         f"for the haystack (need > {2 + len(needles)})")

    # tokenise the haystack source once (a longer one in the rare case it falls short), then cut
    per_needle = _count(tok, needles[0])
    for grow in (1, 2, 4, 8):
        src = _source(t, haystack, budget, rng, split, used, per_needle, grow)
        enc = tok(src, add_special_tokens=False, return_offsets_mapping=True)
        if len(enc["input_ids"]) > budget:
            break
    offsets = enc["offset_mapping"]

    for _ in range(20):  # final check: trim until the whole prompt fits
        hay = _insert(_cut(src, offsets, budget), needles, depths)
        prompt = f"{head}\n\n{hay}\n\n{tail}"
        n = _count(tok, prompt)
        if n + gen_tokens <= length or budget <= 0:
            break
        budget -= n + gen_tokens - length
    if n + gen_tokens > length:
        raise ValueError(f"length {length} is too small for task {task!r}: the prompt still takes "
                         f"{n} tokens (haystack cut to {max(budget, 0)}), plus gen_tokens {gen_tokens}")
    return Sample(task, length, prompt, golds, asked, depths[:len(golds)], n)


def make_samples(task: str, length: int, tok, haystack: str, n: int, seed: int,
                 split: str = "eval", gen_tokens: int = 32) -> list[Sample]:
    """n samples with the gold depth spread evenly over 0..1 (np.linspace); the random stream is
    seeded by (seed, task, length), so it is deterministic in seed and differs across tasks."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    rng = np.random.default_rng([seed, zlib.crc32(task.encode()), length])
    return [make_sample(task, length, tok, haystack, rng, split=split, gen_tokens=gen_tokens,
                        depth=float(d)) for d in np.linspace(0.0, 1.0, n)]


def training_text(s: Sample) -> tuple[str, str]:
    """(prompt, answer) for teacher-forced training: answer = " v1, v2, ... ." """
    return s.prompt, " " + ", ".join(s.golds) + "."


def score(generated: str, golds: list[str]) -> float:
    """String match all: the fraction of golds found in `generated`, ignoring case (0..1)."""
    if not golds:
        return 0.0
    text = generated.lower()
    return sum(g.lower() in text for g in golds) / len(golds)


def haystack_split(books: dict[str, str], split: str) -> str:
    """The books' text for a split: "train" = the first 90% of each book's characters, "eval" =
    the last 10%; joined with blank lines in sorted title order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose 'train' or 'eval'")
    parts = []
    for title in sorted(books):
        text = books[title]
        cut = int(len(text) * 0.9)
        parts.append(text[:cut] if split == "train" else text[cut:])
    return "\n\n".join(parts)
