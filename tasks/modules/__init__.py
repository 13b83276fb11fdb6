"""Module-DAG reasoning (DeCoRL): one chain of thought split into functional modules run along a dependency graph.

- graph:    the module graph from `[modules]` (topological order, dependants, descendants, chain and level timing).
- schema:   the per-output-type pydantic schema of a module's {type, content, confidence, dependencies} reply.
- prompts:  the module, re-ask and judge prompts (their marker lines are what the scripted server recognises).
- run:      one question: modules started as soon as their own dependencies finish, schema re-asks and larger
            budgets for truncated replies, aggregation Φ, the contribution judge (1 + k calls), the item's row
            and its PRM step row (also the reward stage's `step_label_method = "modules"`).
- batch:    one batch of questions on the batch runtime, the assembly of items, PRM rows and the summary, and the
            models a run calls (the pre-flight's list).
- report:   per-module statistics, the Mermaid graph annotated with mean latency and mean contribution, the summary
            figures, the plots, the dataset card and the artifacts' tables.
- local_reward: a module's local reward (schema validity and its own check: compute's arithmetic re-done,
            verify's verdict against the ground truth), its parts and the recompute from them.
- compare:  `modules.compare`: each question also single-shot, both answers scored by the same judge; the graph's
            win rate overall and by difficulty (its own batch part and journal, in the same batch task).
- stage:    the stage's parameters (Prefect UI form, CLI flags), its input check and its registry descriptor.
"""
