"""MinHash + LSH near-duplicate search, vectorized with numpy.

Pipeline per chunk of normalized texts (no Python loop per shingle):
  1. shingles: character (or word) k-grams, hashed with a polynomial rolling
     hash over the UTF-32 code points (words: over per-word hashes) and a
     64-bit avalanche mix; each record keeps the sorted set of 44-bit shingle
     fingerprints (CSR: `offsets`, `values`);
  2. signatures: datasketch's 'affine32' MinHash scheme, bit-compatible with
     `datasketch.MinHash(num_perm, seed, scheme="affine32")` fed the 32-bit
     values `values & 0xFFFFFFFF` (its permutations are used as they are):
     fmix32, then a*h+b mod 2^32 for all permutations at once, min per record;
  3. band keys: `bands` x `rows` slices of the signature hashed to 64 bits.
Candidates are records sharing a band key (found by sorting, not dicts); each
candidate pair is verified by the exact Jaccard of its shingle sets.

Memory (per record: ~1 KB signature + 256 B band keys + 8 B per shingle): chunks
are sketched straight into preallocated arrays (the shingle buffer is sized by an
upper bound and shrunk in place), and candidates are generated, filtered and
verified band by band, so the full candidate list (~19M pairs at 1M records) and
the (n * bands) key sort never exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings

U64 = np.uint64
_FP_BITS = 44                       # shingle fingerprint width (collision ~1e-9 per pair of records)
_FP_MASK = U64((1 << _FP_BITS) - 1)
_BASE = U64(0x100000001B3)          # polynomial base (FNV prime)
_MAX_BUCKET = 1000                  # larger LSH buckets are linked as chain + star (see lsh_pairs)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a bijective avalanche on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> U64(30))
    x = x * U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> U64(27))
    x = x * U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3 finalizer, the pre-mix of datasketch's affine32 scheme."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


@dataclass
class Sketches:
    """Per-record MinHash data of n records."""

    offsets: np.ndarray      # int64 (n+1): shingle set of record i is values[offsets[i]:offsets[i+1]]
    values: np.ndarray       # uint64 sorted unique 44-bit shingle fingerprints per record
    signatures: np.ndarray   # uint32 (n, num_perm)
    band_keys: np.ndarray    # uint64 (n, bands)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @staticmethod
    def concat(parts: Sequence["Sketches"], settings: DedupSettings) -> "Sketches":
        parts = [p for p in parts if len(p)]
        if not parts:
            return empty_sketches(settings)
        sizes = np.concatenate([np.diff(p.offsets) for p in parts])
        return Sketches(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                        np.concatenate([p.values for p in parts]),
                        np.concatenate([p.signatures for p in parts]),
                        np.concatenate([p.band_keys for p in parts]))

    def compact(self, rows: np.ndarray, block: int = 1 << 14, shrink: bool = True) -> None:
        """Keep only `rows` (strictly ascending), in place: rows move front to back, block by block (a row never
        moves later, so nothing is overwritten before it is read), then the arrays are shrunk (not `shrink`: cut to
        views of their front): no second copy."""
        rows = np.asarray(rows, dtype=np.int64)
        m = len(rows)
        lens = self.offsets[rows + 1] - self.offsets[rows]
        new_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        for s in range(0, m, block):
            r = rows[s: s + block]
            _, v = _gather(self.offsets, self.values, r)
            self.values[new_off[s]: new_off[s] + len(v)] = v
            self.signatures[s: s + len(r)] = self.signatures[r]
            self.band_keys[s: s + len(r)] = self.band_keys[r]
        self.offsets = new_off
        for name, length in (("values", int(new_off[-1])), ("signatures", m), ("band_keys", m)):
            if not shrink:
                setattr(self, name, getattr(self, name)[:length])
                continue
            a = getattr(self, name)
            setattr(self, name, None)  # `a` is now the only reference: ndarray.resize may shrink it in place
            try:
                a.resize((length,) + a.shape[1:])  # refcheck: refuses (ValueError) if views or other references exist
            except ValueError:
                a = a[:length].copy()
            setattr(self, name, a)

    def take(self, idx: np.ndarray) -> "Sketches":
        idx = np.asarray(idx, dtype=np.int64)
        offsets, values = _gather(self.offsets, self.values, idx)
        return Sketches(offsets, values, self.signatures[idx], self.band_keys[idx])


def empty_sketches(settings: DedupSettings) -> Sketches:
    return Sketches(np.zeros(1, np.int64), np.zeros(0, U64), np.zeros((0, settings.num_perm), np.uint32),
                    np.zeros((0, settings.bands), U64))


def permutations(settings: DedupSettings) -> tuple[np.ndarray, np.ndarray]:
    from datasketch import MinHash  # here, not at import: datasketch loads scipy and redis (0.4 s)

    a, b = MinHash(num_perm=settings.num_perm, seed=settings.seed, scheme="affine32").permutations
    return a.astype(np.uint32), b.astype(np.uint32)


def to_lean_minhash(signature: np.ndarray, settings: DedupSettings):
    """A datasketch LeanMinHash of one signature (for interop with datasketch indexes)."""
    from datasketch import LeanMinHash

    return LeanMinHash(seed=settings.seed, hashvalues=np.asarray(signature, dtype=np.uint32), scheme="affine32")


def _units(norms: Sequence[str], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(unit hashes uint64, record index per unit): code points, or per-word hashes."""
    texts = [t.replace("\x00", " ") for t in norms] if kind == "char" else [" ".join(t.split()) for t in norms]
    lens = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    cps = np.frombuffer("\x00".join(texts).encode("utf-32-le"), dtype=np.uint32).astype(U64)
    rec = np.repeat(np.arange(len(texts)), lens + 1)[: len(cps)]
    if kind == "char":
        keep = cps != 0
        return cps[keep] + U64(0x9E3779B97F4A7C15), rec[keep]
    sep = (cps == 32) | (cps == 0)
    idx = np.flatnonzero(~sep)
    if len(idx) == 0:
        return np.zeros(0, U64), np.zeros(0, np.int64)
    new_word = np.ones(len(idx), dtype=bool)
    new_word[1:] = idx[1:] != idx[:-1] + 1
    first = np.flatnonzero(new_word)
    word_of = np.cumsum(new_word) - 1
    pos = np.arange(len(idx)) - first[word_of]
    powers = np.cumprod(np.full(int(pos.max()) + 1, _BASE, dtype=U64))
    words = np.add.reduceat(cps[idx] * powers[pos], first)
    return mix64(words), rec[idx[first]]


def shingle_sets(norms: Sequence[str], settings: DedupSettings) -> tuple[np.ndarray, np.ndarray]:
    """CSR (offsets, values) of sorted unique 44-bit shingle fingerprints per text."""
    n, k = len(norms), settings.shingle_size
    u, rec = _units(norms, settings.shingle_kind)
    counts = np.bincount(rec, minlength=n)
    m = len(u) - k + 1
    if m > 0:
        h = u[: m].copy()
        for t in range(1, k):
            h = h * _BASE + u[t: t + m]
        good = rec[: m] == rec[k - 1:]
        h, hrec = h[good], rec[: m][good]
    else:
        h, hrec = np.zeros(0, U64), np.zeros(0, np.int64)
    short = np.flatnonzero((counts > 0) & (counts < k))
    if len(short):  # fewer units than one shingle: the whole text is one shingle
        start = np.concatenate([[0], np.cumsum(counts)])[short]
        hs = u[start].copy()
        for t in range(1, k - 1 + 1):
            more = t < counts[short]
            hs = np.where(more, hs * _BASE + u[np.minimum(start + t, len(u) - 1)], hs)
        h, hrec = np.concatenate([h, hs]), np.concatenate([hrec, short])
    key = (hrec.astype(U64) << U64(_FP_BITS)) | (mix64(h) >> U64(64 - _FP_BITS))
    key.sort()
    if len(key):
        key = key[np.concatenate([[True], key[1:] != key[:-1]])]
    values = key & _FP_MASK
    offsets = np.searchsorted(key >> U64(_FP_BITS), np.arange(n + 1, dtype=U64)).astype(np.int64)
    return offsets, values


def signatures(offsets: np.ndarray, values: np.ndarray, settings: DedupSettings,
               perms: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """uint32 (n, num_perm) MinHash signatures; an empty set gets all 0xFFFFFFFF (datasketch's empty value)."""
    a, b = perms if perms is not None else permutations(settings)
    n = len(offsets) - 1
    sig = np.full((n, settings.num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
    nonempty = np.flatnonzero(np.diff(offsets) > 0)
    if len(nonempty):
        hv = fmix32((values & U64(0xFFFFFFFF)).astype(np.uint32))
        starts = offsets[nonempty]
        tmp = np.empty_like(hv)
        out = np.empty((settings.num_perm, len(nonempty)), dtype=np.uint32)
        for p in range(settings.num_perm):  # 1-D reduceat per permutation is ~10x faster than one 2-D reduceat
            np.multiply(hv, a[p], out=tmp)
            tmp += b[p]
            out[p] = np.minimum.reduceat(tmp, starts)
        sig[nonempty] = out.T
    return sig


def band_keys(sig: np.ndarray, settings: DedupSettings) -> np.ndarray:
    """uint64 (n, bands): one hash per band of `rows` signature values (band index mixed in)."""
    n, b, r = len(sig), settings.bands, settings.rows
    x = sig[:, : b * r].reshape(n, b, r).astype(U64)
    coef = mix64(np.arange(1, r + 1, dtype=U64))
    key = (x * coef[None, None, :]).sum(axis=2, dtype=U64) + mix64(np.arange(b, dtype=U64) + U64(1 << 40))[None, :]
    return mix64(key)


def sketch(norms: Sequence[str], settings: DedupSettings, perms=None) -> Sketches:
    offsets, values = shingle_sets(norms, settings)
    sig = signatures(offsets, values, settings, perms)
    return Sketches(offsets, values, sig, band_keys(sig, settings))


def _band_codes(col: np.ndarray, n: int, is_new: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate pairs of one band (`col`: that band's n keys) as sorted unique codes i * n + j (i < j), and, of them,
    the codes from buckets larger than _MAX_BUCKET (linked as chain + star, not all pairs) and those buckets' records."""
    order = np.argsort(col, kind="stable")  # stable: a bucket lists its records in ascending order
    sk = col[order]
    brk = np.flatnonzero(sk[1:] != sk[:-1]) + 1
    del sk
    starts = np.concatenate([[0], brk])
    lens = np.diff(np.concatenate([starts, [n]]))
    out, big, big_rows = [], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for L in np.unique(lens[lens >= 2]):
        st = starts[lens == L]
        if L <= _MAX_BUCKET:
            iu, ju = np.triu_indices(int(L), 1)
        else:  # pathological bucket: chain + star keeps it linear
            iu = np.concatenate([np.zeros(L - 1, np.int64), np.arange(1, L - 1)])
            ju = np.concatenate([np.arange(1, L), np.arange(2, L)])
            big_rows.append(order[(st[:, None] + np.arange(L)).ravel()])
        a, b = order[(st[:, None] + iu).ravel()], order[(st[:, None] + ju).ravel()]
        if is_new is not None:
            keep = is_new[a] | is_new[b]
            a, b = a[keep], b[keep]
        out.append(np.minimum(a, b) * n + np.maximum(a, b))
        if L > _MAX_BUCKET:
            big.append(out[-1])
    big_codes = np.sort(np.concatenate(big))
    code = np.concatenate(out) if out else np.zeros(0, np.int64)
    if len(code) == 0:  # no bucket of 2+, or none touching a new record
        return code, big_codes, np.concatenate(big_rows)
    code.sort()
    return code[np.concatenate([[True], code[1:] != code[:-1]])], big_codes, np.concatenate(big_rows)


def _new_in_band(keys: np.ndarray, j: int, code: np.ndarray, big_member: np.ndarray | None,
                 big_codes: np.ndarray, block: int = 1 << 16) -> np.ndarray:
    """The codes of band j that no earlier band generated: pairs sharing no earlier band key, except keys of
    pathological buckets, which generated only their chain + star pairs (`big_codes`)."""
    if j == 0 or len(code) == 0:
        return code
    n = len(keys)
    seen = np.zeros(len(code), bool)
    for s in range(0, len(code), block):
        c = code[s: s + block]
        a, b = c // n, c % n
        eq = keys[a, :j] == keys[b, :j]
        if big_member is not None:
            eq &= ~big_member[a, :j]
        seen[s: s + len(c)] = eq.any(axis=1)
    if len(big_codes):
        pos = np.minimum(np.searchsorted(big_codes, code), len(big_codes) - 1)
        seen |= big_codes[pos] == code
    return code[~seen]


def lsh_codes(keys: np.ndarray, is_new: np.ndarray | None = None) -> np.ndarray:
    """Sorted unique codes i * n + j (int64, i < j) of the candidate pairs: records sharing any band key.

    Band by band (a band's keys are hashed with its index, so buckets never span bands): the memory is
    O(n) per band plus 8 bytes per candidate, never the (n * bands) sort or the (candidates, 2) array."""
    n, b = keys.shape
    if n < 2:
        return np.zeros(0, np.int64)
    parts = [_band_codes(np.ascontiguousarray(keys[:, j]), n, is_new)[0] for j in range(b)]
    code = np.concatenate(parts)
    del parts
    if len(code) == 0:
        return code
    code.sort()  # sort-based unique (numpy's hash unique is slower here)
    return code[np.concatenate([[True], code[1:] != code[:-1]])]


def lsh_pairs(keys: np.ndarray, is_new: np.ndarray | None = None) -> np.ndarray:
    """Unique candidate pairs (i < j, int64 (m, 2)) of records sharing any band key; with is_new, only pairs touching a new record."""
    n = len(keys)
    code = lsh_codes(keys, is_new)
    return np.stack([code // n, code % n], axis=1) if len(code) else np.zeros((0, 2), np.int64)


def _gather(offsets: np.ndarray, values: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lens = offsets[idx + 1] - offsets[idx]
    out_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    pos = np.arange(out_off[-1]) - np.repeat(out_off[:-1], lens) + np.repeat(offsets[idx], lens)
    return out_off, values[pos]


def jaccard(offsets: np.ndarray, values: np.ndarray, pairs: np.ndarray, batch: int = 1 << 13) -> np.ndarray:
    """Exact Jaccard of the shingle sets of each pair (float64, len(pairs))."""
    out = np.zeros(len(pairs))
    sizes = np.diff(offsets)
    for s in range(0, len(pairs), batch):
        p = pairs[s: s + batch]
        k = np.arange(len(p), dtype=U64)
        _, vi = _gather(offsets, values, p[:, 0])
        _, vj = _gather(offsets, values, p[:, 1])
        li, lj = sizes[p[:, 0]], sizes[p[:, 1]]
        key = np.concatenate([(np.repeat(k, li) << U64(_FP_BITS)) | vi, (np.repeat(k, lj) << U64(_FP_BITS)) | vj])
        key.sort()
        dup = key[1:][key[1:] == key[:-1]] >> U64(_FP_BITS)
        inter = np.bincount(dup.astype(np.int64), minlength=len(p))
        union = li + lj - inter
        out[s: s + batch] = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
    return out


def signature_margin(settings: DedupSettings) -> float:
    """4 standard deviations of the MinHash Jaccard estimate at the threshold."""
    t = settings.jaccard_threshold
    return 4.0 * float(np.sqrt(t * (1 - t) / settings.num_perm)) + 1e-9


def _verify(sk: Sketches, code: np.ndarray, settings: DedupSettings, chunk: int = 1 << 18) -> tuple[np.ndarray, np.ndarray]:
    """The candidate pairs (codes i * n + j) with exact Jaccard >= threshold, and their Jaccard, in code order."""
    t = settings.jaccard_threshold
    n = len(sk)
    sizes = np.diff(sk.offsets)
    margin = signature_margin(settings)
    out_p, out_s = [np.zeros((0, 2), np.int64)], [np.zeros(0)]
    for s0 in range(0, len(code), chunk):
        c = code[s0: s0 + chunk]
        cand = np.stack([c // n, c % n], axis=1)
        a, b = sizes[cand[:, 0]], sizes[cand[:, 1]]  # size filter (exact): J >= t needs min/max >= t
        cand = cand[np.minimum(a, b) >= t * np.maximum(a, b) - 1e-9]
        if len(cand):  # signature filter: the MinHash estimate of a pair at J = t falls below t - 4 sigma with p ~ 3e-5
            est = np.empty(len(cand))
            for s in range(0, len(cand), 1 << 15):
                q = cand[s: s + (1 << 15)]
                est[s: s + len(q)] = (sk.signatures[q[:, 0]] == sk.signatures[q[:, 1]]).mean(axis=1)
            cand = cand[est >= t - margin]
        sim = jaccard(sk.offsets, sk.values, cand)
        keep = sim >= t
        out_p.append(cand[keep])
        out_s.append(sim[keep])
    return np.concatenate(out_p), np.concatenate(out_s)


def candidates_by_band(keys: np.ndarray, is_new: np.ndarray | None = None):
    """Yield, band by band, the sorted codes i * n + j of the candidate pairs that no earlier band produced: together
    exactly lsh_codes(keys, is_new), but never all of them at once (O(n) memory per band)."""
    n, nb = keys.shape
    if n < 2:
        return
    big_member = None                       # (n, bands) bool: record in a pathological bucket of that band
    big_codes = np.zeros(0, np.int64)       # chain + star pairs of the pathological buckets seen so far
    for j in range(nb):
        code, big, big_rows = _band_codes(np.ascontiguousarray(keys[:, j]), n, is_new)
        yield _new_in_band(keys, j, code, big_member, big_codes)
        if len(big_rows):
            if big_member is None:
                big_member = np.zeros((n, nb), bool)
            big_member[big_rows, j] = True
            big_codes = np.union1d(big_codes, big)


def verified_pairs(sk: Sketches, settings: DedupSettings, is_new: np.ndarray | None = None,
                   bands: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """(pairs (m, 2) in (i, j) order, their Jaccard, number of LSH candidates) with Jaccard >= threshold.

    Band by band: each band's new candidates are filtered and verified at once, so neither the set of all
    candidate pairs (~19M at 1M records) nor the (n * bands) key sort is ever held. With `bands` = (j0, j1),
    only the candidates of those bands (a shard: tasks/dedup/shards.py); the verified pairs of all band ranges
    together are exactly those of all bands (verification depends on the pair only)."""
    n = len(sk)
    ncand = 0
    out_p, out_s = [np.zeros((0, 2), np.int64)], [np.zeros(0)]
    keys = sk.band_keys if bands is None else sk.band_keys[:, bands[0]: bands[1]]
    for code in candidates_by_band(keys, is_new):
        ncand += len(code)
        p, s = _verify(sk, code, settings)
        out_p.append(p)
        out_s.append(s)
    pairs, sims = np.concatenate(out_p), np.concatenate(out_s)
    order = np.argsort(pairs[:, 0] * n + pairs[:, 1], kind="stable")  # the order of the one-shot candidate list
    return pairs[order], sims[order], ncand


def _shingle_bound(norms: Sequence[str]) -> int:
    """An upper bound of the number of shingles of `norms` (one per character at most, in either shingle kind)."""
    return int(sum(map(len, norms)))


def sketch_many(norms: Sequence[str], settings: DedupSettings, prefix: Sketches | None = None) -> Sketches:
    """Sketch all texts in chunks of `chunk_records`, on `threads` threads, straight into preallocated arrays.

    With `prefix` (e.g. the indexed history), its rows come first: the result is the concatenation without a
    second copy of the new rows. The shingle buffer is sized by an upper bound (untouched pages cost no memory)
    and shrunk in place at the end."""
    perms = permutations(settings)
    c = settings.chunk_records
    n = len(norms)
    H = 0 if prefix is None else len(prefix)
    total = H + n
    sig = np.empty((total, settings.num_perm), np.uint32)
    bkeys = np.empty((total, settings.bands), U64)
    offsets = np.zeros(total + 1, np.int64)
    values = np.empty(_shingle_bound(norms) + (0 if prefix is None else len(prefix.values)), U64)
    pos = 0
    if H:
        sig[:H], bkeys[:H], offsets[: H + 1] = prefix.signatures, prefix.band_keys, prefix.offsets
        pos = int(prefix.offsets[-1])
        values[:pos] = prefix.values[:pos]

    def work(i: int) -> tuple[int, np.ndarray, np.ndarray]:
        off, val = shingle_sets(norms[i: i + c], settings)
        rows = slice(H + i, H + i + len(off) - 1)
        sig[rows] = signatures(off, val, settings, perms)
        bkeys[rows] = band_keys(sig[rows], settings)
        return i, off, val

    def results():
        starts = range(0, n, c)
        if settings.threads > 1 and len(starts) > 1:
            from concurrent.futures import ThreadPoolExecutor

            window = 2 * settings.threads  # bounded look-ahead: finished chunks wait for their turn in a short queue
            with ThreadPoolExecutor(settings.threads) as ex:
                futs = [ex.submit(work, i) for i in starts[:window]]
                for k in range(len(starts)):
                    yield futs[k].result()
                    futs[k] = None
                    if k + window < len(starts):
                        futs.append(ex.submit(work, starts[k + window]))
        else:
            for i in starts:
                yield work(i)

    for i, off, val in results():  # in record order
        if pos + len(val) > len(values):  # cannot happen with the bound above; kept as a guard
            values = np.concatenate([values, np.empty(max(len(values), len(val)), U64)])
        values[pos: pos + len(val)] = val
        offsets[H + i + 1: H + i + len(off)] = off[1:] + pos
        pos += len(val)
    try:
        values.resize(pos)  # in place: the untouched tail of the buffer is given back
    except ValueError:  # not the only reference (cannot happen here)
        values = values[:pos].copy()
    return Sketches(offsets, values, sig, bkeys)
