"""The figures of an evaluation: pass@k by the unbiased estimator, Wilson intervals, the table per benchmark/domain.

    pass_at_k(n, c, k)       1 - C(n-c, k) / C(n, k) (Chen et al. 2021): the chance that at least one of k samples
                             drawn without replacement from n (c of them correct) is correct
    wilson(p, n, z)          the Wilson score interval of a proportion p observed over n trials (95%: z = 1.96)
    table(results, ks)       rows per benchmark and domain: problems, samples per problem, pass@k with its interval

The interval of pass@1 treats each problem as one trial with its estimated pass@1 as the observed share: problems,
not samples, are the independent units (with one greedy sample per problem it is the exact Wilson interval).
"""

from __future__ import annotations

import math
from collections import defaultdict

Z95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    if n <= 0:
        return (0.0, 1.0)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def per_problem(results: list[dict]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(benchmark, domain, problem id) -> (samples, correct) from one row per sample."""
    out: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        cell = out[(r["benchmark"], r["domain"], r["problem_id"])]
        cell[0] += 1
        cell[1] += bool(r["passed"])
    return {k: (v[0], v[1]) for k, v in out.items()}


def table(results: list[dict], ks: list[int]) -> list[dict]:
    """One row per benchmark (domain 'all') and per benchmark and domain when it has more than one."""
    problems = per_problem(results)
    groups: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    domains: dict[str, set[str]] = defaultdict(set)
    for (bench, domain, _), nc in problems.items():
        groups[(bench, "all")].append(nc)
        groups[(bench, domain)].append(nc)
        domains[bench].add(domain)
    rows = []
    for (bench, domain), cells in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "all", kv[0][1])):
        if domain != "all" and len(domains[bench]) < 2:
            continue
        n_min = min(n for n, _ in cells)
        row = {"benchmark": bench, "domain": domain, "problems": len(cells), "samples_per_problem": n_min,
               "correct_samples": sum(c for _, c in cells), "samples": sum(n for n, _ in cells)}
        for k in ks:
            if k > n_min:
                continue
            score = sum(pass_at_k(n, c, k) for n, c in cells) / len(cells)
            low, high = wilson(score, len(cells))
            row[f"pass@{k}"] = round(score, 4)
            row[f"pass@{k}_ci95"] = [round(low, 4), round(high, 4)]
        rows.append(row)
    return rows
