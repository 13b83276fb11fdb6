"""The trajectories stage: its parameters (the Prefect UI form and the CLI flags), its input check and its
descriptor (tasks/core/stages.py). The flow: flows/trajectories.py; the files: storage/trajectory_sets.py; what
it reports: tasks/trajectories/report.py. It makes no model calls (it exports traffic the proxy recorded)."""

from __future__ import annotations

from pydantic import Field

from evolforge.config.settings import Settings
from evolforge.tasks.core.checks import InputError, check_file, check_folder, check_out_dir
from evolforge.tasks.core.extras import sentence_embeddings, tokenizer
from evolforge.tasks.core.params import StageParams
from evolforge.tasks.core.stages import Deployment, Stage, Table, register


class TrajectoriesParams(StageParams):
    """Parameters of the trajectories flow (sessions go idle after [proxy] session_idle_seconds)."""

    proxy_out: str = Field(..., description="The recording proxy's folder (evolforge proxy --out).")
    out: str = Field(..., description="Output folder: sft.jsonl, transitions (data/), tokens.parquet, summary.json.")
    rewards: str | None = Field(None, description="A jsonl / csv / parquet file with session and reward columns; "
                                "it wins over the proxy's reward events for the sessions it lists.")
    tokenizer: str | None = Field(None, description="Tokenizer of the token-level samples: a model folder or a GGUF "
                                  "file (default: the embedded model's GGUF, embedded.model_path or SmolLM2).")
    include_unfinished: bool = Field(False, description="Also export sessions that are not finished yet (no "
                                     "finish event and not idle for proxy.session_idle_seconds).")
    dedup: bool = Field(True, description="Drop conversations whose first user message duplicates another "
                        "session's ([dedup] methods). Off keeps every rollout of a prompt (e.g. GRPO groups).")
    tokens: bool = Field(True, description="Write the token-level samples (loads the tokenizer).")
    roles: list[str] | None = Field(None, description="Export only the calls of these agents (the role the proxy "
                                    "recorded from X-Evolforge-Role / X-OpenForge-Role), e.g. planner,coder: in a "
                                    "multi-agent session the other agents' calls, and calls without a role, are left "
                                    "out. Each role named must occur in the proxy folder's records.")


def check(params: TrajectoriesParams, settings: Settings) -> None:
    """The proxy folder holds records/, the rewards file (when given) exists, every role of --roles occurs in the
    records, the output folder can be written."""
    check_folder(params.proxy_out, "proxy folder", "records",
                 " (pass the folder of a recording proxy: evolforge proxy --out)")
    check_file(params.rewards, "rewards file")
    if params.roles is not None:
        check_roles(params.proxy_out, params.roles)
    check_out_dir(params.out)


def check_roles(proxy_out: str, roles: list[str]) -> None:
    """Every role named was recorded: a role no call carries (a typo, another proxy folder) is an InputError naming
    the roles that were recorded. Reads the records until it has seen every role named (all of them when one is
    missing)."""
    wanted = {r.strip() for r in roles if r and r.strip()}
    if not wanted:
        raise InputError("--roles names no role: pass agent roles separated by commas, e.g. --roles planner,coder")
    from evolforge.storage.trajectory_sets import recorded_roles  # here: it loads pyarrow, --help does not

    seen = recorded_roles(proxy_out, stop_when=wanted)  # all of them when one is missing: it read every record
    missing = wanted - seen
    if missing:
        raise InputError(f"--roles {','.join(sorted(missing))}: no call in {proxy_out} was recorded with "
                         f"{'that role' if len(missing) == 1 else 'those roles'} (roles recorded: "
                         f"{', '.join(sorted(seen)) or 'none: no call carried X-Evolforge-Role'})")


STAGE = register(Stage(
    name="trajectories",
    help="agent traffic recorded by the proxy -> SFT conversations, per-call transitions and token-level samples",
    params=TrajectoriesParams,
    flow="evolforge.flows.trajectories:trajectories_flow",
    extras=lambda params, settings: ((sentence_embeddings(settings.dedup) if params.dedup else [])
                                     + (tokenizer() if params.tokens else [])),
    folder="evolforge.storage.trajectory_sets:TrajectoryLayout",
    check=check,
    inputs=(
        Table("records", "(--proxy-out)/records/*.jsonl", ("record_id", "session", "parent_session", "role", "route",
                                                           "status", "model", "ts", "latency_s", "request", "response"),
              "model calls recorded by `evolforge proxy`, grouped by session"),
        Table("events", "(--proxy-out)/events/*.jsonl", ("session", "event", "ts", "reward", "details"),
              "finish and reward events posted to the proxy"),
        Table("rewards", "(--rewards)", ("session", "reward"), "session rewards; win over the reward events"),
    ),
    outputs=(
        Table("sft", "sft.jsonl", ("messages", "tools", "conversation_id", "session", "reward", "reward_source"),
              "TRL SFTTrainer conversations (OpenAI messages with tool calls)"),
        Table("transitions", "data/train-00000-of-00001.parquet",
              ("transition_id", "session", "conversation_id", "prompt", "completion", "prompt_text",
               "completion_text", "reward", "prompt_tokens", "completion_tokens", "latency_s"),
              "one row per model call with the session reward (GRPO / RLOO)"),
        Table("tokens", "tokens.parquet", ("conversation_id", "input_ids", "assistant_mask", "turns", "drift",
                                           "drift_reasons"), "token-level samples with the assistant loss mask"),
        Table("duplicates", "duplicates.parquet", ("id", "kind", "session", "prompt", "duplicate_of", "method",
                                                   "similarity", "reason"), "prompts dropped as duplicates"),
        Table("skipped", "skipped.parquet", ("kind", "session", "record_id", "call_index", "reason", "detail"),
              "unfinished sessions, failed calls and what else was not exported, with the reason"),
    ),
    deployment=Deployment("Agent traffic recorded by the proxy -> SFT conversations, per-call transitions, token "
                          "samples.", ("evolforge", "trajectories")),
))
