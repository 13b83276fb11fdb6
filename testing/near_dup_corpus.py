"""Seeded, labelled near-duplicate corpus of instruction-like texts.

Base texts are built from templates and vocabularies (a task sentence, often a
constraint sentence, sometimes a context sentence), so two bases differ in
several content words. A share of records are *variants* of a base, made with
a controlled number of word-level edits:

    level "style"  case / punctuation changes and an added politeness phrase only
    level 0.05     ceil(5% of the words) edited   (plus style changes half the time)
    level 0.10     ceil(10% of the words) edited
    level 0.20     ceil(20% of the words) edited  (reported, no target)
    level "exact"  a byte-identical copy

A word edit is one of: deletion, insertion of a vocabulary word, a typo inside
a word (swap / drop / double / replace a letter), a swap of two neighbouring
words. Labels: `cluster` (= index of the base record) per record, and
`pairs` (base_index, variant_index, level, n_word_edits). Every variant of a
cluster is a true duplicate of its base and of the other variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

LANGS = ["Python", "Rust", "Go", "Java", "C++", "TypeScript", "Haskell", "Ruby", "Kotlin", "Scala", "Julia", "SQL"]
ACTIONS = ["sorts", "reverses", "deduplicates", "merges", "filters", "groups", "counts", "validates", "compresses",
           "parses", "normalizes", "shuffles", "partitions", "flattens", "encodes", "ranks", "samples", "rotates",
           "transposes", "interleaves", "searches", "summarizes", "tokenizes", "indexes"]
STRUCTS = ["list", "array", "linked list", "binary tree", "hash map", "matrix", "graph", "queue", "stack", "string",
           "heap", "trie", "set", "dataframe", "stream", "sparse vector", "ring buffer", "JSON document"]
ITEMS = ["integers", "floating point numbers", "customer records", "timestamps", "email addresses", "words", "sensor readings",
         "bank transactions", "URLs", "genome sequences", "invoices", "chess moves", "log lines", "temperatures",
         "student grades", "product prices", "IP addresses", "polygon vertices", "tweets", "train schedules"]
RESULTS = ["the second largest value", "the median", "the longest run of equal items", "a histogram of frequencies",
           "the top three elements", "the number of distinct values", "a sorted copy", "the running total",
           "the index of the first anomaly", "a dictionary keyed by category", "the pairwise differences",
           "the shortest path length", "a boolean mask of outliers", "the average of each window",
           "a compressed representation", "the checksum"]
TOPICS = ["photosynthesis", "the French Revolution", "black holes", "inflation", "the immune system", "plate tectonics",
          "machine learning", "the water cycle", "supply chains", "quantum entanglement", "the Roman Empire",
          "climate change", "blockchain ledgers", "vaccines", "ocean currents", "game theory", "jazz history",
          "urban planning", "renewable energy", "the printing press", "volcanoes", "cryptography", "bees",
          "the stock market", "sleep science", "the Silk Road"]
AUDIENCES = ["a ten year old", "a first-year student", "a busy executive", "a retired engineer", "a museum visitor",
             "a non-native speaker", "a skeptical journalist", "a nurse on night shift", "a high school teacher"]
FORMATS = ["three short paragraphs", "a numbered list of five points", "a haiku", "a dialogue between two friends",
           "a one-page memo", "a table with two columns", "a limerick", "a tweet thread", "a short story"]
MATH_OBJ = ["a train", "a water tank", "a savings account", "a bicycle", "a bakery", "a garden", "a factory",
            "a library", "a marathon runner", "a cargo ship", "a rectangular field", "a spinning wheel"]
QUANT = ["speed", "volume", "interest", "distance", "profit", "area", "output", "capacity", "time", "angle"]
NUMS = [str(n) for n in (3, 4, 5, 6, 7, 8, 9, 12, 15, 18, 20, 24, 25, 30, 36, 40, 45, 48, 60, 75, 90, 120)]
CONSTRAINTS = [
    "Do not use any external libraries.", "The solution must run in linear time.", "Explain the time complexity of your approach.",
    "Include unit tests for the edge cases.", "Handle empty input gracefully.", "Avoid recursion.",
    "Keep the memory usage constant.", "Write clear comments for each step.", "Use at most {n} lines of code.",
    "Return the result rather than printing it.", "Make the function generic over the element type.",
    "Show your reasoning step by step.", "Give the final answer in bold.", "Round the result to two decimal places.",
    "Cite at least two sources.", "Avoid technical jargon.", "Use a friendly and encouraging tone.",
    "Limit the answer to {n} words.", "End with a question for the reader.", "Mention one common misconception.",
]
CONTEXT = [
    "This is for a job interview practice session.", "I am preparing lecture notes for next week.",
    "The input can contain up to {n} million entries.", "My manager asked for this by tomorrow morning.",
    "The data comes from a legacy system with inconsistent formatting.", "It will be used in a teaching workshop.",
    "Assume the reader has no prior background.", "This runs on an embedded device with little memory.",
]
TASKS = [
    "Write a {lang} function that {action} a {struct} of {items} and returns {result}.",
    "Implement a {lang} class that {action} a {struct} of {items} and exposes {result}.",
    "Given a {struct} of {items}, write {lang} code that {action} it and computes {result}.",
    "Create a command line tool in {lang} which {action} a {struct} of {items} and prints {result}.",
    "Explain {topic} to {aud} in {fmt}.",
    "Write {fmt} about {topic} for {aud}.",
    "Summarize the key ideas of {topic} for {aud}, using {fmt}.",
    "Compare {topic} and {topic2} for {aud} in {fmt}.",
    "{obj} has a {quant} of {n} units and loses {m} units every hour. How long until the {quant} drops below {k} units?",
    "If {obj} doubles its {quant} every {n} days starting from {m}, what is the {quant} after {k} days?",
    "A problem about {obj}: the {quant} is {n} in the morning and {m} in the evening. Find the percentage change and explain it.",
    "Design a database schema in {lang} style for tracking {items} and describe how to query {result}.",
]
POLITE_PREFIX = ["Please ", "Could you please ", "Kindly ", "Hi! ", "Hello, ", "I would appreciate it if you could "]
POLITE_SUFFIX = [" Thanks!", " Thank you.", " Thanks in advance.", " Much appreciated!", " Please and thank you."]
FILLER = ["really", "quickly", "also", "carefully", "simply", "very", "just", "then", "now", "exactly", "maybe",
          "data", "value", "result", "first", "small", "new", "good", "each", "other"]


ADJ = ["noisy", "sorted", "encrypted", "historical", "streaming", "duplicated", "sparse", "nested", "unicode",
       "anonymized", "compressed", "mislabeled", "hourly", "regional", "archived", "real-time", "partial", "raw"]
ASPECTS = ["the history of", "the economics of", "the physics of", "common myths about", "the future of",
           "the ethics of", "everyday uses of", "the biggest open questions in", "how scientists study",
           "the main risks of", "the vocabulary of", "a timeline of"]
FIRST = ["Maria", "Kenji", "Amara", "Lukas", "Priya", "Diego", "Olga", "Samir", "Chloe", "Tomasz", "Aisha", "Mateo",
         "Ingrid", "Kwame", "Yuki", "Farah", "Noah", "Leila", "Pavel", "Sofia"]
ORGS = ["a logistics startup", "a city hospital", "a weather service", "an online bookshop", "a football club",
        "a research lab", "a bakery chain", "a bank", "a school district", "a music festival", "a ferry company",
        "a seed library", "an airline", "a charity", "a game studio"]
OWNER = ["for {first} at {org}.", "requested by {first} from {org}.", "as part of a project for {org}.",
         "so that {first} can present it to {org}."]


def _base_text(rng: np.random.Generator) -> str:
    c = lambda xs: xs[rng.integers(len(xs))]  # noqa: E731
    t = c(TASKS)
    topic = f"{c(ASPECTS)} {c(TOPICS)}"
    num = lambda: str(int(rng.integers(2, 500)))  # noqa: E731
    s = t.format(lang=c(LANGS), action=c(ACTIONS), struct=c(STRUCTS), items=f"{c(ADJ)} {c(ITEMS)}", result=c(RESULTS),
                 topic=topic, topic2=f"{c(ASPECTS)} {c(TOPICS)}", aud=c(AUDIENCES), fmt=c(FORMATS), obj=c(MATH_OBJ),
                 quant=c(QUANT), n=num(), m=num(), k=num())
    s = s[:-1] + " " + c(OWNER).format(first=c(FIRST), org=c(ORGS))
    s = s[0].upper() + s[1:]
    if rng.random() < 0.75:
        s += " " + c(CONSTRAINTS).format(n=c(NUMS))
    if rng.random() < 0.4:
        s += " " + c(CONTEXT).format(n=c(NUMS))
    if rng.random() < 0.3:
        s += " " + c(CONSTRAINTS).format(n=c(NUMS))
    return s


def _typo(word: str, rng: np.random.Generator) -> str:
    if len(word) < 2:
        return word + "x"
    i = int(rng.integers(len(word) - 1))
    kind = rng.integers(4)
    if kind == 0:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == 1:
        return word[:i] + word[i + 1:]
    if kind == 2:
        return word[:i] + word[i] + word[i:]
    return word[:i] + "etaoinshr"[int(rng.integers(9))] + word[i + 1:]


def word_edits(text: str, k: int, rng: np.random.Generator) -> str:
    """Apply k word-level edits (delete, insert, typo, swap neighbours)."""
    words = text.split()
    for _ in range(k):
        op = rng.integers(4)
        if len(words) < 3:
            op = 1
        i = int(rng.integers(len(words)))
        if op == 0:
            del words[i]
        elif op == 1:
            words.insert(i, FILLER[int(rng.integers(len(FILLER)))])
        elif op == 2:
            words[i] = _typo(words[i], rng)
        else:
            j = min(i + 1, len(words) - 1)
            if j == i:
                i = i - 1
            words[i], words[j] = words[j], words[i]
    return " ".join(words)


def style_edits(text: str, rng: np.random.Generator) -> str:
    """Case, punctuation and politeness changes only (no content word changed)."""
    r = rng.random()
    if r < 0.25:
        text = text.lower()
    elif r < 0.35:
        text = text.upper()
    if rng.random() < 0.5:
        text = text.replace(".", "!" if rng.random() < 0.5 else "") .replace(",", "")
    if rng.random() < 0.5:
        p = POLITE_PREFIX[int(rng.integers(len(POLITE_PREFIX)))]
        text = p + text[0].lower() + text[1:]
    if rng.random() < 0.5:
        text = text.rstrip() + POLITE_SUFFIX[int(rng.integers(len(POLITE_SUFFIX)))]
    if rng.random() < 0.3:
        text = "  " + text.replace(" ", "  ", 2) + " \n"
    return text


@dataclass
class Corpus:
    texts: list[str]
    cluster: np.ndarray                    # base record index of each record
    level: list[str]                       # "base", "exact", "style", "0.05", "0.1", "0.2"
    pairs: list[tuple[int, int, str, int]] = field(default_factory=list)  # (base, variant, level, word edits)


DEFAULT_MIX = {"exact": 0.03, "style": 0.06, "0.05": 0.08, "0.1": 0.08, "0.2": 0.05}


def make_corpus(n: int, seed: int = 0, mix: dict[str, float] | None = None) -> Corpus:
    """n records; `mix` = share of records that are variants at each level (rest are bases)."""
    mix = dict(DEFAULT_MIX if mix is None else mix)
    rng = np.random.default_rng(seed)
    n_var = int(round(n * sum(mix.values())))
    n_base = n - n_var
    seen: set[str] = set()
    bases: list[str] = []
    while len(bases) < n_base:
        t = _base_text(rng)
        if t not in seen:
            seen.add(t)
            bases.append(t)
    levels = [lv for lv, share in mix.items() for _ in range(int(round(n * share)))][:n_var]
    while len(levels) < n_var:
        levels.append("0.05")
    texts = list(bases)
    cluster = list(range(n_base))
    level = ["base"] * n_base
    pairs: list[tuple[int, int, str, int]] = []
    for lv in levels:
        b = int(rng.integers(n_base))
        src = bases[b]
        if lv == "exact":
            v, k = src, 0
        elif lv == "style":
            v, k = style_edits(src, rng), 0
        else:
            k = max(1, math.ceil(float(lv) * len(src.split())))
            v = word_edits(src, k, rng)
            if rng.random() < 0.5:
                v = style_edits(v, rng)
        pairs.append((b, len(texts), lv, k))
        texts.append(v)
        cluster.append(b)
        level.append(lv)
    # shuffle record order so variants are not all at the end
    perm = rng.permutation(len(texts))
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    texts = [texts[i] for i in perm]
    cluster_arr = inv[np.asarray(cluster)[perm]]
    level = [level[i] for i in perm]
    pairs = [(int(inv[b]), int(inv[v]), lv, k) for b, v, lv, k in pairs]
    return Corpus(texts=texts, cluster=cluster_arr, level=level, pairs=pairs)


if __name__ == "__main__":  # pragma: no cover - quick look
    c = make_corpus(20, seed=1, mix={"style": 0.2, "0.05": 0.2, "0.1": 0.2})
    for b, v, lv, k in c.pairs:
        print(f"[{lv} k={k}]\n  {c.texts[b]}\n  {c.texts[v]}")


UNRELATED_WORDS = [f"{w}{i}" for i, w in enumerate(
    "amber basalt cedar delta ember fjord garnet harbor iris jasper kelp lumen magma nectar onyx prism quartz raven "
    "sable tundra umber vortex willow xenon yarrow zephyr".split() * 8)]


def unrelated_texts(tag: str, n: int) -> list[str]:
    """n unrelated texts (no two near duplicates: 24 words drawn from 208), the same for the same tag."""
    import random

    rng = random.Random(tag)
    return [" ".join(rng.choices(UNRELATED_WORDS, k=24)) for _ in range(n)]
