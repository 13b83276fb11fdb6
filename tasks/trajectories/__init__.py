"""Agent traffic recorded by the proxy -> training data (the `trajectories` stage; Prefect-free).

- sessions: which sessions are finished (a finish event, idle for proxy.session_idle_seconds, or an
  ancestor's finish event), their rewards (reward events and/or a rewards file; the file wins), and a
  session's calls split into conversations (prefix-extensions of one message list; branches apart).
- samples:  messages in the OpenAI form, SFT rows (TRL SFTTrainer), per-call transitions (GRPO / RLOO).
- wire_messages: chat, Responses API and Messages API requests as those messages (tool calls and results in
            order, reasoning / thinking apart, images as TRL multimodal parts).
- tokens:   token-level samples: chat-template rendering per prefix (tasks/text/chat.py, as SFT renders), the
            assistant loss mask, turn boundaries, the upstream's own token ids spliced in, drift flagged.
- export:   the four steps the flow runs (collect, dedup, tokens, publish), through storage/trajectory_sets.
- report: what a trajectories export reports: the summary table, the markdown report, the plots and the dataset card.
"""
