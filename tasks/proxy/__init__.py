"""The recording proxy (OpenForge RL's agent traffic): an OpenAI-compatible server between an agent and its
model endpoint that forwards every call unchanged and records it as training data.

- app:        the ASGI app (Starlette): routes, sessions, forwarding, streaming relay, errors, access token.
- recording:  what is kept of a chat call: request content, response reassembled from SSE chunks if streamed.
- wires:      the three recorded APIs (chat, Responses, Messages): request and response parts, form checks,
              ledger usage, stream reassembly and end.
- translate:  for a chat-only upstream (proxy.translate): Messages / Responses API calls made as chat
              completions and the replies and streams turned back into the client's API.
- server:     `evolforge proxy` as a long-running service (uvicorn, no Prefect), in a thread, and --check.
- banner:     what `evolforge proxy` prints at start: each client's base URL, session and token settings.
Records go through storage/proxy_sets.py; the trajectories stage turns them into SFT and RL samples.
"""
