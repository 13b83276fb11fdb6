"""The module graph of a run: topological order, dependants and descendants, and timing bounds.

Built from `settings.modules` (checked at load by config/sections/modules.py: no unknown dependency, no cycle,
exactly one exit), so the scheduler here never waits on a module that cannot finish.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evolforge.config.sections.modules import ModuleSpec, ModulesSettings


@dataclass(frozen=True)
class ModuleGraph:
    specs: dict[str, ModuleSpec]                 # by id, in topological order (config order breaks ties)
    exit: str
    dependants: dict[str, tuple[str, ...]] = field(repr=False)

    @classmethod
    def from_settings(cls, cfg: ModulesSettings) -> "ModuleGraph":
        by_id = {m.id: m for m in cfg.graph}
        order: list[str] = []
        placed: set[str] = set()
        while len(order) < len(by_id):  # Kahn, stable: the config's order among the ready modules
            ready = [m for m in by_id if m not in placed and all(d in placed for d in by_id[m].dependencies)]
            if not ready:
                raise ValueError(f"module graph is not a DAG: {sorted(set(by_id) - placed)}")
            for m in ready:
                order.append(m)
                placed.add(m)
        specs = {m: by_id[m] for m in order}
        dependants = {m: tuple(x for x in order if m in specs[x].dependencies) for m in order}
        return cls(specs, cfg.exit_module.id, dependants)

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(self.specs)

    @property
    def non_exit(self) -> tuple[str, ...]:
        return tuple(m for m in self.specs if m != self.exit)

    def deps(self, m: str) -> list[str]:
        return self.specs[m].dependencies

    def descendants(self, m: str) -> list[str]:
        """Every module that reads m's output directly or through others, in topological order."""
        seen: set[str] = set()
        stack = list(self.dependants[m])
        while stack:
            x = stack.pop()
            if x not in seen:
                seen.add(x)
                stack.extend(self.dependants[x])
        return [x for x in self.specs if x in seen]

    def levels(self) -> dict[str, int]:
        """Dependency level: 0 for modules without dependencies, else 1 + the deepest dependency's."""
        lv: dict[str, int] = {}
        for m in self.specs:
            lv[m] = 1 + max((lv[d] for d in self.deps(m)), default=-1)
        return lv

    def longest_chain(self, seconds: dict[str, float]) -> float:
        """The longest dependency chain's duration: the floor of a graph run when every module starts as soon as
        its own dependencies finish."""
        end: dict[str, float] = {}
        for m in self.specs:
            end[m] = max((end[d] for d in self.deps(m)), default=0.0) + seconds.get(m, 0.0)
        return max(end.values(), default=0.0)

    def levels_sum(self, seconds: dict[str, float]) -> float:
        """What lock-step rounds take: per level, the slowest module of the level, summed."""
        slowest: dict[int, float] = {}
        for m, lv in self.levels().items():
            slowest[lv] = max(slowest.get(lv, 0.0), seconds.get(m, 0.0))
        return sum(slowest.values())

    @property
    def chain_length(self) -> int:
        """Modules on the longest dependency chain (calls in sequence when every reply is valid at once)."""
        return int(self.longest_chain({m: 1.0 for m in self.specs}))

    @property
    def recompute_calls(self) -> int:
        """Extra module calls of ablation 'recompute' per question (every valid at once): the sum over the
        non-exit modules of their descendant counts."""
        return sum(len(self.descendants(m)) for m in self.non_exit)
