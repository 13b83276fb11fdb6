"""A small HumanEval-style set in JavaScript, written for this project: the JS sandbox's known-answer check.

Each problem has HumanEval's fields (task_id, prompt, canonical_solution, test, entry_point) plus `wrong`, a
plausible wrong completion (off by one, a missed case) that its test must reject. The solution file is prompt +
completion; the test defines `check(candidate)` with node's assert, and
evolforge.tasks.sandbox.humaneval.check_script_js binds the entry point from the solution and calls it.

    from evolforge.testing.js_humaneval import PROBLEMS
"""

from __future__ import annotations

_A = "  const assert = require('assert');\n"


def _p(task_id: str, entry: str, signature: str, doc: str, canonical: str, wrong: str, checks: list[str]) -> dict:
    prompt = f"/**\n * {doc}\n */\nfunction {entry}({signature}) {{\n"
    test = "function check(candidate) {\n" + _A + "".join(f"  {c}\n" for c in checks) + "}\n"
    return {"task_id": f"JsEval/{task_id}", "prompt": prompt, "canonical_solution": canonical, "wrong": wrong,
            "test": test, "entry_point": entry}


PROBLEMS: list[dict] = [
    _p("0", "hasCloseElements", "numbers, threshold",
       "Whether any two numbers of the list are closer to each other than threshold.",
       "  for (let i = 0; i < numbers.length; i++)\n    for (let j = i + 1; j < numbers.length; j++)\n"
       "      if (Math.abs(numbers[i] - numbers[j]) < threshold) return true;\n  return false;\n}\n",
       "  for (let i = 0; i + 1 < numbers.length; i++)\n"
       "    if (Math.abs(numbers[i] - numbers[i + 1]) < threshold) return true;\n  return false;\n}\n",
       ["assert.strictEqual(candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3), true);",
        "assert.strictEqual(candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05), false);",
        "assert.strictEqual(candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95), true);",
        "assert.strictEqual(candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5), false);",
        "assert.strictEqual(candidate([], 1.0), false);"]),
    _p("1", "fizzBuzzCount", "n", "How many numbers below n divisible by 11 or 13 contain the digit 7.",
       "  let c = 0;\n  for (let i = 0; i < n; i++)\n    if ((i % 11 === 0 || i % 13 === 0) && String(i).includes('7')) c++;\n"
       "  return c;\n}\n",
       "  let c = 0;\n  for (let i = 0; i < n; i++)\n    if (i % 11 === 0 && String(i).includes('7')) c++;\n  return c;\n}\n",
       ["assert.strictEqual(candidate(50), 0);", "assert.strictEqual(candidate(78), 1);",
        "assert.strictEqual(candidate(79), 2);", "assert.strictEqual(candidate(4000), 174);"]),
    _p("2", "reverseWords", "s", "The words of s (split on single spaces) in reverse order, joined by one space.",
       "  return s.split(' ').reverse().join(' ');\n}\n",
       "  return s.split('').reverse().join('');\n}\n",
       ["assert.strictEqual(candidate('hello world'), 'world hello');", "assert.strictEqual(candidate('a'), 'a');",
        "assert.strictEqual(candidate('one two three'), 'three two one');"]),
    _p("3", "sortByParity", "xs", "The even numbers of xs in ascending order, then the odd ones in descending order.",
       "  const even = xs.filter((x) => x % 2 === 0).sort((a, b) => a - b);\n"
       "  const odd = xs.filter((x) => x % 2 !== 0).sort((a, b) => b - a);\n  return even.concat(odd);\n}\n",
       "  const even = xs.filter((x) => x % 2 === 0).sort();\n"
       "  const odd = xs.filter((x) => x % 2 !== 0).sort().reverse();\n  return even.concat(odd);\n}\n",
       ["assert.deepStrictEqual(candidate([3, 1, 2, 4]), [2, 4, 3, 1]);",
        "assert.deepStrictEqual(candidate([10, 9, 2, 33, 100]), [2, 10, 100, 33, 9]);",
        "assert.deepStrictEqual(candidate([]), []);", "assert.deepStrictEqual(candidate([-3, -2]), [-2, -3]);"]),
    _p("4", "wordCounts", "text", "A plain object mapping each lower-cased word of text (letters only) to its count.",
       "  const out = {};\n  for (const w of text.toLowerCase().match(/[a-z]+/g) || []) out[w] = (out[w] || 0) + 1;\n"
       "  return out;\n}\n",
       "  const out = {};\n  for (const w of text.split(' ')) out[w] = (out[w] || 0) + 1;\n  return out;\n}\n",
       ["assert.deepStrictEqual(candidate('The cat, the hat.'), { the: 2, cat: 1, hat: 1 });",
        "assert.deepStrictEqual(candidate(''), {});",
        "assert.deepStrictEqual(candidate('a A a'), { a: 3 });"]),
    _p("5", "primeFactors", "n", "The prime factors of n (n >= 2) in ascending order, with multiplicity.",
       "  const f = [];\n  for (let d = 2; d * d <= n; d++)\n    while (n % d === 0) { f.push(d); n /= d; }\n"
       "  if (n > 1) f.push(n);\n  return f;\n}\n",
       "  const f = [];\n  for (let d = 2; d * d <= n; d++)\n    if (n % d === 0) { f.push(d); n /= d; }\n"
       "  if (n > 1) f.push(n);\n  return f;\n}\n",
       ["assert.deepStrictEqual(candidate(8), [2, 2, 2]);", "assert.deepStrictEqual(candidate(97), [97]);",
        "assert.deepStrictEqual(candidate(360), [2, 2, 2, 3, 3, 5]);"]),
    _p("6", "safeDivide", "a, b", "a / b; throws a RangeError with message 'division by zero' when b is 0.",
       "  if (b === 0) throw new RangeError('division by zero');\n  return a / b;\n}\n",
       "  return a / b;\n}\n",
       ["assert.strictEqual(candidate(6, 3), 2);", "assert.strictEqual(candidate(1, 4), 0.25);",
        "assert.throws(() => candidate(1, 0), { name: 'RangeError', message: 'division by zero' });"]),
    _p("7", "bigFactorial", "n", "n! as a BigInt.",
       "  let r = 1n;\n  for (let i = 2n; i <= BigInt(n); i++) r *= i;\n  return r;\n}\n",
       "  let r = 1;\n  for (let i = 2; i <= n; i++) r *= i;\n  return BigInt(r);\n}\n",
       ["assert.strictEqual(candidate(0), 1n);", "assert.strictEqual(candidate(5), 120n);",
        "assert.strictEqual(candidate(25), 15511210043330985984000000n);"]),
    _p("8", "uniqueSorted", "xs", "The distinct values of xs as a Set, inserted in ascending order.",
       "  return new Set([...new Set(xs)].sort((a, b) => a - b));\n}\n",
       "  return new Set(xs);\n}\n",
       ["assert.deepStrictEqual([...candidate([3, 1, 3, 2])], [1, 2, 3]);",
        "assert.deepStrictEqual(candidate([5, 5]), new Set([5]));", "assert.strictEqual(candidate([]).size, 0);"]),
    _p("9", "meanOrNaN", "xs", "The arithmetic mean of xs, NaN for an empty list.",
       "  if (xs.length === 0) return NaN;\n  return xs.reduce((s, x) => s + x, 0) / xs.length;\n}\n",
       "  if (xs.length === 0) return 0;\n  return xs.reduce((s, x) => s + x, 0) / xs.length;\n}\n",
       ["assert.strictEqual(candidate([1, 2, 3, 4]), 2.5);", "assert.ok(Number.isNaN(candidate([])));",
        "assert.strictEqual(candidate([-1, 1]), 0);"]),
    _p("10", "runLength", "s", "Run-length encoding of s as [char, count] pairs.",
       "  const out = [];\n  for (const c of s) {\n    if (out.length && out[out.length - 1][0] === c) out[out.length - 1][1]++;\n"
       "    else out.push([c, 1]);\n  }\n  return out;\n}\n",
       "  const out = [];\n  for (const c of new Set(s)) out.push([c, s.split(c).length - 1]);\n  return out;\n}\n",
       ["assert.deepStrictEqual(candidate('aaabcc'), [['a', 3], ['b', 1], ['c', 2]]);",
        "assert.deepStrictEqual(candidate(''), []);",
        "assert.deepStrictEqual(candidate('abab'), [['a', 1], ['b', 1], ['a', 1], ['b', 1]]);"]),
]
